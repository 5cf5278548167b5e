"""
A Queue's or SharedSubscription's redelivery delay (``delivery.redeliveryDelay``,
``redeliveryMultiplier``, ``maxRedeliveryDelay``) in the broker's policy vocabulary, bounded as
the CRD bounds it: a spec that slipped past the apiserver is refused here too (ValueError, which
the entity's status reports as InvalidSpec).
"""

from collections.abc import Mapping
from typing import Any

MAX_DELAY_MS = 86_400_000
"""A day: the longest wait the broker applies (``routing/redelivery.py``)."""
MAX_MULTIPLIER = 100


def redelivery_fields(delivery: Mapping[str, Any]) -> dict[str, Any]:
    """The ``EntityPolicy`` fields the section sets (those it leaves out stay None: the
    broker-wide settings)."""
    fields: dict[str, Any] = {}
    for name, field in (('redeliveryDelay', 'redelivery_delay_ms'),
                        ('maxRedeliveryDelay', 'max_redelivery_delay_ms')):  # fmt: skip
        value = delivery.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DELAY_MS:
            raise ValueError(f'{name} must be an integer from 0 to {MAX_DELAY_MS} (ms), '
                             f'not {value!r}')  # fmt: skip
        fields[field] = value
    delay, cap = fields.get('redelivery_delay_ms'), fields.get('max_redelivery_delay_ms')
    if delay is not None and cap and cap < delay:
        raise ValueError('maxRedeliveryDelay must be 0 or at least redeliveryDelay')
    multiplier = delivery.get('redeliveryMultiplier')
    if multiplier is not None:
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise ValueError(f'redeliveryMultiplier must be a number, not {multiplier!r}')
        if not 1 <= multiplier <= MAX_MULTIPLIER:
            raise ValueError(f'redeliveryMultiplier must be from 1 to {MAX_MULTIPLIER}, '
                             f'not {multiplier!r}')  # fmt: skip
        fields['redelivery_multiplier'] = float(multiplier)
    return fields
