"""
Label values that keep a scrape bounded: the ``subscription`` label of plain topic subscribers,
and the cap past which addresses are added up under ``address="_other"`` (``folded``).
"""

from collections.abc import Sequence

PRIVATE_LABEL = 'private'
"""The ``subscription`` label of every plain topic subscriber's private group."""


def subscription_label(group: str) -> str:
    return PRIVATE_LABEL if group.startswith('nd:') else group


OTHER_ADDRESSES = '_other'
"""The ``address`` (and ``subscription``) label of the series added up past the address cap."""

_address_cap = 1000
_admitted: set[str] = set()


def cap_address_series(cap: int) -> None:
    """Give at most ``cap`` addresses series of their own (0: no cap)."""
    global _address_cap
    _address_cap = cap


def _address_label(address: str) -> str:
    """``address``, or OTHER_ADDRESSES once the cap is full: the first addresses seen keep their
    series for good, so every series (the aggregate too) only grows, as a counter must."""
    if not _address_cap or address in _admitted:
        return address
    if len(_admitted) < _address_cap:
        _admitted.add(address)
        return address
    return OTHER_ADDRESSES


def folded(label_names: Sequence[str], values: Sequence[str]) -> tuple[str, ...]:
    """Label values with a capped address (and its subscription) folded into the aggregate."""
    if not values or label_names[0] != 'address':
        return tuple(values)
    address = _address_label(values[0])
    if address == values[0]:
        return tuple(values)
    rest = list(values[1:])
    if len(label_names) > 1 and label_names[1] == 'subscription':
        rest[0] = OTHER_ADDRESSES
    return (address, *rest)
