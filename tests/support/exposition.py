"""The series names a real broker's /metrics can carry (what the dashboard and the alerting
rules may query, tests/chart/) and the samples it carries now."""

import re

from processes import BrokerProcess
from prometheus_client.parser import text_string_to_metric_families

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


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(broker: BrokerProcess) -> Samples:
    """Every sample of the broker's /metrics now: (name, sorted labels) -> value."""
    status, body = broker.http_get('/metrics')
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the broker has not exported it (yet)."""
    return found.get((name, tuple(sorted(labels.items()))), 0.0)
