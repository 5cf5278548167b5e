"""
What a redelivery delay costs Redis per returned message, from its own accounting (``INFO
commandstats``: µs inside each command, free of the client and the network), on a private
redis-server:

- ``return at once``: what a release did before (HINCRBY of the count, ZADD score 0);
- ``return delayed``: release_later.lua (the count, Redis's clock, ZADD score = due);
- ``via :sched``: the scheduled-delivery path instead (schedule.lua with a copy of the message,
  XACK and XDEL of the original, then release_due.lua appending it again): what reusing it would
  cost, besides what it would break (a new id, so the delivery count keyed by id is lost; a topic's
  every subscription would get the copy);
- ``fetch, delayed head``: fetch.lua finding only a delayed returned entry (pops it, puts it
  back, answers when it is due) against ``fetch, nothing returned``.

usage: python bench/redelay.py [-n 20000] [--size 1024]   (loopback only; stops its redis-server)
"""

import argparse
import statistics
import time
from typing import Any

from shared_fetch import private_redis
from shoal_broker.store import keys
from shoal_broker.store.fetch_command import fetch_call
from shoal_broker.store.scripts import source

GROUP, CONSUMER = 'queue', 'r1'


RESULTS: dict[str, list[float]] = {}


def _measure(client: Any, label: str, n: int, fill: Any, top: tuple[str, ...]) -> None:
    """µs per message of the commands sent at top level (a script's own commands are inside
    its EVALSHA's time, and counted again under their names: left out)."""
    client.config_resetstat()
    fill()
    stats = client.info('commandstats')
    spent = sum(stats.get(f'cmdstat_{name}', {}).get('usec', 0) for name in top)
    RESULTS.setdefault(label, []).append(spent / n)


def _pending(client: Any, k: keys.AddressKeys, n: int, body: bytes) -> list[str]:
    client.delete(*k.streams, k.returned(GROUP), k.delivery_counts(GROUP))
    client.xgroup_create(k.streams[0], GROUP, '$', mkstream=True)
    pipe = client.pipeline(transaction=False)
    for _ in range(n):
        pipe.xadd(k.streams[0], {'h': b'', 'r': body})
    pipe.execute()
    read = client.xreadgroup(GROUP, CONSUMER, {k.streams[0]: '>'}, count=n)
    return [raw.decode() for raw, _ in read[0][1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('-n', type=int, default=20000)
    parser.add_argument('--size', type=int, default=1024)
    parser.add_argument('--reps', type=int, default=5)
    args = parser.parse_args()
    n, body = args.n, b'x' * args.size
    with private_redis() as client:
        for _ in range(args.reps):  # interleaved: the machine's load moves them alike
            run(client, n, body)
        print(f'n={n} size={len(body)} reps={args.reps} (median)\n')
        print('| per returned message, or per fetch (an empty stream) | µs in Redis |\n|---|---|')
        for label, values in RESULTS.items():
            print(f'| {label} | {statistics.median(values):.2f} |')


def run(client: Any, n: int, body: bytes) -> None:
    k = keys.AddressKeys.of('bench-redelay')
    sha = {name: client.script_load(source(name)) for name in
           ('release_later', 'schedule', 'release_due', 'fetch')}  # fmt: skip

    def members(ids: list[str]) -> list[tuple[str, str]]:
        return [(keys.entry_member(0, i), keys.entry_field(0, i)) for i in ids]

    def at_once(ids: list[str]) -> None:
        pipe = client.pipeline(transaction=False)
        for member, field in members(ids):
            pipe.hincrby(k.delivery_counts(GROUP), field, 1)
            pipe.zadd(k.returned(GROUP), {member: 0})
        pipe.execute()

    def delayed(ids: list[str]) -> None:
        pipe = client.pipeline(transaction=False)
        for member, field in members(ids):
            pipe.evalsha(sha['release_later'], 2, k.returned(GROUP), k.delivery_counts(GROUP),
                         member, field, '1', 200)  # fmt: skip
        pipe.execute()

    def via_sched(ids: list[str]) -> None:
        pipe = client.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for i in ids:
            pipe.evalsha(sha['schedule'], 2, k.scheduled, k.scheduled_messages,
                         now, f'{now}-{i}', 0, b'', body, '0', '')  # fmt: skip
            pipe.xack(k.streams[0], GROUP, i)
            pipe.xdel(k.streams[0], i)
        pipe.execute()
        for _ in range(n // 500 + 1):
            due_keys = (k.scheduled, k.scheduled_messages, *k.streams, k.groups, k.levels)
            client.evalsha(sha['release_due'], len(due_keys), *due_keys, now + 1, 500, 'queue')

    for label, how, top in (
        ('return at once', at_once, ('hincrby', 'zadd')),
        ('return delayed', delayed, ('evalsha',)),
        ('via :sched (schedule, XACK, XDEL, release_due)', via_sched, ('evalsha', 'xack', 'xdel')),
    ):
        ids = _pending(client, k, n, body)
        _measure(client, label, n, lambda how=how, ids=ids: how(ids), top)

    script_keys, args = fetch_call('bench-redelay', GROUP, CONSUMER, 10)

    def fetches() -> None:
        pipe = client.pipeline(transaction=False)
        for _ in range(n):
            pipe.evalsha(sha['fetch'], len(script_keys), *script_keys, *args)
        pipe.execute()

    ids = _pending(client, k, 1, body)
    client.xack(k.streams[0], GROUP, *ids)
    _measure(client, 'fetch, nothing returned', n, fetches, ('evalsha',))
    client.zadd(k.returned(GROUP), {keys.entry_member(0, ids[0]): time.time() * 1000 + 3.6e6})
    _measure(client, 'fetch, delayed head', n, fetches, ('evalsha',))


if __name__ == '__main__':
    main()
