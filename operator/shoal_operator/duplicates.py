"""
A Queue's or SharedSubscription's ``duplicateDetection{}`` in the broker's vocabulary
(``EntityPolicy.duplicate_*``), the CRD's bounds checked again: a section of its own, beside
``last_value.py`` and ``redelivery.py``, so models.py stays within its size bound.
"""

from collections.abc import Mapping
from typing import Any

from shoal_operator.invalid import InvalidSpec, bounded


def duplicate_fields(section: Mapping[str, Any] | None, topic: str | None) -> dict[str, Any]:
    """``duplicateDetection{}`` as the policy's fields (the CRD bounds again)."""
    if section is None:
        return {}
    enabled = section.get('enabled')
    if not isinstance(enabled, bool):
        raise InvalidSpec(f'duplicateDetection.enabled must be true or false, not {enabled!r}')
    prop = section.get('idProperty')
    if prop is not None and (not str(prop) or any(c.isspace() for c in str(prop))):
        raise InvalidSpec(f'idProperty {prop!r} must be non-empty without whitespace')
    fields = {
        'duplicate_window': bounded(section, 'window', 1, 1_000_000),
        'duplicate_window_seconds': bounded(section, 'windowSeconds', 1, 604_800),
        'duplicate_id_property': None if prop is None else str(prop),
    }
    if not enabled and any(v is not None for v in fields.values()):
        raise InvalidSpec('window, windowSeconds and idProperty need enabled: true')
    return {'duplicate_detection': enabled, **fields, 'topic': topic}
