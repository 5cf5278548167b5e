"""
The command of a fetch (``lua/fetch.lua``), its keys encoded once per subscription, and the one
spelling of its KEYS and ARGV (``fetch_keys``, ``fetch_args``, ``fetch_call``) that the broker,
the tests and the benches driving the script by hand all use, so a change to the script's
arguments cannot leave any of them behind.

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


def fetch_args(
    group: str,
    replica: str,
    count: int,
    *,
    consumers: int,
    credit: int,
    notify: str,
    read_default: bool = True,
    line_member: str = '',
) -> tuple[Any, ...]:
    """``fetch.lua``'s ARGV, in order: ``consumers`` and ``credit`` those of the subscription on
    this replica (0 consumers: it reads alone, no sharing), ``notify`` the address's channel;
    ``read_default`` False leaves band 5 to a plain XREADGROUP sent right after; ``line_member``
    (an exclusive entity's consumer, ``lines.gated_fetch``) is ARGV[8], with KEYS[18] the line."""
    args = (group, replica, count, '1' if read_default else '0', consumers, credit, notify)
    return (*args, line_member) if line_member else args


def fetch_call(
    address: str,
    group: str,
    replica: str,
    count: int,
    *,
    consumers: int = 0,
    credit: int | None = None,
    read_default: bool = True,
    line_member: str = '',
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The whole call of one fetch, as the broker makes it: (KEYS, ARGV). ``credit`` defaults to
    ``count``; with ``line_member`` the keys end with the subscription's line (KEYS[18])."""
    k = keys.AddressKeys.of(address)
    script_keys = fetch_keys(address, group)
    if line_member:
        script_keys = (*script_keys, k.line(group))
    args = fetch_args(
        group, replica, count, consumers=consumers, credit=count if credit is None else credit,
        notify=k.notify, read_default=read_default, line_member=line_member,
    )  # fmt: skip
    return script_keys, args


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
