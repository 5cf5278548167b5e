"""
Turn off durable fetches and durable acks in a copy of the broker's source tree, for the cost
table of ``replicated`` durability (docs/performance.md, "Failover costs in one run"): the tree
it leaves waits for a Redis replica after publishes and commits only, as before durable
deliveries, and is otherwise the same code, so an A/B of it against the tree as it is measures
what waiting on fetch and ack pipelines costs and nothing else. There is no setting for it: in
``replicated`` mode both are always on (docs/redis-modes.md, "Durable acks").

Two edits in ``shoal_broker/store/messages.py``: a fetch's op is no longer ``confirmed`` (its
pipeline has no ``WAIT``, its entries are delivered at once) and the acks are not ``durable``.
Fails when either is not found exactly once (the code has moved, and the A/B would compare a
tree with itself).

usage: python bench/strip_durable_deliveries.py BROKER_SOURCE_ROOT   (a copy: rewritten)
"""

import sys
from pathlib import Path

EDITS = (
    (
        'op = Op(commands, finish, None, None, False, None, (), None, confirmed=True)',
        'op = Op(commands, finish, None, None, False, None, (), None, confirmed=False)',
    ),
    (
        'self.acks = Acks(cycles, durable=durability is Durability.REPLICATED)',
        'self.acks = Acks(cycles, durable=False)',
    ),
)


def main(root: str) -> int:
    path = Path(root) / 'shoal_broker' / 'store' / 'messages.py'
    source = path.read_text()
    for old, new in EDITS:
        found = source.count(old)
        if found != 1:
            print(f'{path}: expected one {old!r}, found {found}', file=sys.stderr)
            return 1
        source = source.replace(old, new)
    path.write_text(source)
    print(f'{path}: fetches not confirmed, acks not durable')
    return 0


if __name__ == '__main__':
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
