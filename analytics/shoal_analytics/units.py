"""
Human units for everything a person reads (report cells, anomaly details, the headline): waits
as "850 ms" or "3 min 5 s", never raw milliseconds; counts with thousands separators; and
subscriptions under the names their users gave them, not the broker's internal ids.
"""

import math

NONE = '—'
"""A value that does not exist (no deliveries to take a ratio of, no latency recorded)."""


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def duration(seconds: float) -> str:
    """850 ms, 4.2 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    if seconds < 1:
        return f'{seconds * 1000:.3g} ms'
    if seconds < 60:
        return f'{seconds:.3g} s'
    if seconds < 3600:
        minutes, rest = int(seconds // 60), int(seconds % 60)
        return f'{minutes} min {rest} s' if rest else f'{minutes} min'
    if seconds < 86_400:
        hours, minutes = int(seconds // 3600), int(seconds % 3600 // 60)
        return f'{hours} h {minutes} min' if minutes else f'{hours} h'
    days, hours = int(seconds // 86_400), int(seconds % 86_400 // 3600)
    return f'{days} d {hours} h' if hours else f'{days} d'


def count(value: object) -> str:
    """1,234 (a mean is rounded)."""
    if missing(value):
        return NONE
    return f'{round(float(value)):,}'  # type: ignore[arg-type]


def rate(per_second: object) -> str:
    """Messages per second, or per minute when under one a second."""
    if missing(per_second):
        return NONE
    value = float(per_second)  # type: ignore[arg-type]
    if abs(value) < 1:
        return f'{value * 60:.3g} msg/min'
    return f'{value:,.3g} msg/s' if abs(value) < 1000 else f'{value:,.0f} msg/s'


def subscription_name(subscription: str) -> str:
    """What a user calls a subscription: a named JMS subscription's id
    (``durable:global:*:orders``) is shown as its name (``orders``, with its ClientID when it is
    scoped to one); a queue has none; plain topic subscribers share one row."""
    if subscription == 'queue':
        return ''
    if subscription == 'private':
        return '(plain subscribers)'
    lifetime, _, rest = subscription.partition(':')
    scope, _, rest = rest.partition(':')
    if lifetime in ('durable', 'volatile') and scope == 'global' and rest.startswith('*:'):
        return rest[2:]
    if lifetime in ('durable', 'volatile') and scope == 'client' and ':' in rest:
        # a generated ClientID has colons (ID:...:1); a name seldom does
        owner, _, name = rest.rpartition(':')
        return f'{name} (client {owner})'
    return subscription


def entity_name(address: str, subscription: str) -> str:
    """``orders`` for a queue, ``prices / audit`` for a topic's subscription."""
    name = subscription_name(subscription)
    return f'{address} / {name}' if name else address
