"""The series names a real broker's /metrics can carry: what the dashboard and the alerting
rules may query (tests/chart/)."""

import re

from processes import BrokerProcess

SUFFIXES = {'counter': ('_total',), 'histogram': ('_bucket', '_sum', '_count'), 'gauge': ('',)}


def exported_series(broker: BrokerProcess) -> set[str]:
    """Every series name the broker's /metrics can carry (from its TYPE lines)."""
    status, body = broker.http_get('/metrics')
    assert status == 200
    names = set()
    for match in re.finditer(r'^# TYPE (\S+) (\S+)$', body.decode(), re.MULTILINE):
        name, kind = match.groups()
        if kind == 'counter':  # the text format names counters with or without _total
            name = name.removesuffix('_total')
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ('',)))
    return names
