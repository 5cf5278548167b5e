"""
Which shard of a benchmark's Redis Cluster serves each address: the slot arithmetic of
``bench/cluster.sh``, in one place.

A cluster of S shards made by the script owns the slots in S contiguous ranges (``ranges``), one
per primary. An address's keys share the hash tag of ``AddressKeys.of(address).tag``
(``{a:<address>}``), so the address lives on the shard owning that tag's slot.
``bench/load.py --addresses K`` names its addresses ``<prefix>-0`` ... ``<prefix>-<K-1>``;
``pick`` finds a prefix whose K addresses fall as evenly as they can on every shard count
measured (16 addresses: 8/8 on two shards, 5/5/6 on three), so no shard carries twice another's
load by the luck of the names; ``spread`` says how many of a row's addresses each shard serves,
by which the script divides each shard's CPU among the messages it served.

usage: python bench/slots.py ranges 3                  -> 0-5460 5461-10921 10922-16383
       python bench/slots.py pick cl1 16 2 3           -> cl1-19 (a prefix that spreads evenly)
       python bench/slots.py spread cl1-19 16 3        -> 5 5 6
"""

import argparse
import sys

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from shoal_broker.store.keys import AddressKeys

TRIES = 10_000
"""Prefixes ``pick`` tries before settling for the most even one found."""


def ranges(shards: int) -> list[tuple[int, int]]:
    """The slots each of ``shards`` primaries owns, first to last: contiguous, as even as can be."""
    bounds = [i * REDIS_CLUSTER_HASH_SLOTS // shards for i in range(shards + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(shards)]


def shard_of(address: str, shards: int) -> int:
    slot = key_slot(AddressKeys.of(address).tag.encode())
    return next(i for i, (low, high) in enumerate(ranges(shards)) if low <= slot <= high)


def spread(prefix: str, count: int, shards: int) -> list[int]:
    """How many of the addresses ``<prefix>-0`` ... ``<prefix>-<count-1>`` each shard serves."""
    served = [0] * shards
    for i in range(count):
        served[shard_of(f'{prefix}-{i}', shards)] += 1
    return served


def unevenness(prefix: str, count: int, shard_counts: list[int]) -> int:
    return sum(max(s) - min(s) for s in (spread(prefix, count, n) for n in shard_counts))


def pick(base: str, count: int, shard_counts: list[int]) -> str:
    """``<base>-<n>`` for the first n whose addresses spread most evenly on every shard count."""
    even = sum(count % n != 0 for n in shard_counts)  # within one address on every shard count
    best, best_score = f'{base}-0', unevenness(f'{base}-0', count, shard_counts)
    for n in range(1, TRIES):
        if best_score <= even:
            break
        score = unevenness(f'{base}-{n}', count, shard_counts)
        if score < best_score:
            best, best_score = f'{base}-{n}', score
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or '').strip().split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    r = sub.add_parser('ranges', help='the slot range of each shard')
    r.add_argument('shards', type=int)
    p = sub.add_parser('pick', help='a prefix whose addresses spread evenly')
    p.add_argument('base')
    p.add_argument('count', type=int)
    p.add_argument('shards', type=int, nargs='+')
    s = sub.add_parser('spread', help="the row's addresses each shard serves")
    s.add_argument('prefix')
    s.add_argument('count', type=int)
    s.add_argument('shards', type=int)
    opts = parser.parse_args(argv)
    if opts.command == 'ranges':
        print(*(f'{low}-{high}' for low, high in ranges(opts.shards)))
    elif opts.command == 'pick':
        print(pick(opts.base, opts.count, opts.shards))
    else:
        print(*spread(opts.prefix, opts.count, opts.shards))
    return 0


if __name__ == '__main__':
    sys.exit(main())
