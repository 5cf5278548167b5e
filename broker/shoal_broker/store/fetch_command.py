"""
The command of a fetch (``lua/fetch.lua``), its keys encoded once per subscription.

A fetch names the stream of every band, since only the script sees which bands hold entries
when it runs (``keys.AddressKeys.levels``), and its message groups' keys: seventeen keys, where
two bands took five. Packed
afresh on each fetch, the nine more cost ~5 µs (hiredis, ~0.6 µs an argument); kept encoded for
the most recent subscriptions, they cost a lookup, and only the per-fetch arguments are encoded.
"""

import functools
from collections.abc import Sequence
from typing import Any

from shoal_broker.store import keys
from shoal_broker.store.lane import Encoded, encode

ENCODED_SUBSCRIPTIONS = 4096
"""Subscriptions whose fetch keys are kept encoded (~1 KB each)."""


def fetch_keys(address: str, group: str) -> tuple[str, ...]:
    """``fetch.lua``'s KEYS[1..17], in order."""
    k = keys.AddressKeys.of(address)
    return (
        *k.streams, k.returned(group), k.delivery_counts(group), k.shares(group), k.levels,
        k.group_owners(group), k.group_parked(group), k.group_held(group),
    )  # fmt: skip


@functools.lru_cache(maxsize=ENCODED_SUBSCRIPTIONS)
def _encoded_keys(address: str, group: str) -> tuple[int, str, bytes]:
    """The number of keys, the first one, the others as RESP bulk strings."""
    script_keys = fetch_keys(address, group)
    return len(script_keys), script_keys[0], encode(*(key.encode() for key in script_keys[1:]))


def fetch_command(
    head: tuple[Any, ...], address: str, group: str, args: Sequence[Any]
) -> tuple[Any, ...]:
    """``head`` (``('EVALSHA', sha)`` or ``('EVAL', source)``), then the fetch's keys and
    ``args`` (str, bytes or int), the keys but the first encoded once. The first stays an
    argument of its own: a cluster's lanes route the command by it (``cycles._slot``)."""
    count, first, block = _encoded_keys(address, group)
    tail = encode(*(a if isinstance(a, bytes) else str(a).encode() for a in args))
    return (*head, count, first, Encoded([block, tail], count - 1 + len(args)))
