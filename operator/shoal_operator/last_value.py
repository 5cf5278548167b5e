"""
A Queue's ``lastValue{}`` in the broker's vocabulary (``EntityPolicy.last_value``), the CRD's
bounds checked again: a section of its own, as models.py is at its size bound.
"""

from collections.abc import Mapping
from typing import Any

from shoal_operator.invalid import InvalidSpec


def last_value_fields(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """The policy's fields for ``lastValue{}``; none when the section is absent."""
    if section is None:
        return {}
    enabled = section.get('enabled')
    if not isinstance(enabled, bool):
        raise InvalidSpec(f'lastValue.enabled must be true or false, not {enabled!r}')
    prop = section.get('property')
    if prop is not None and (not str(prop) or any(c.isspace() for c in str(prop))):
        raise InvalidSpec(f'lastValue.property {prop!r} must be non-empty without whitespace')
    if prop is not None and not enabled:
        raise InvalidSpec('property needs enabled: true')
    return {'last_value': enabled, 'last_value_property': None if prop is None else str(prop)}
