"""
An attach burst: how long a broker takes to make ``--links`` consumers on fresh queues known to
the other replicas. One connection opens every receiver at once (each on a queue of its own,
created by the attach, with credit), then Redis is polled until every queue lists the broker
among its watchers: the point from which another replica's publish wakes that consumer.
Same client kit as bench/matrix.py. Loopback only; bounded by ``--timeout`` seconds.

Prints one JSON line: seconds to the last attach answered and to the last listing, the broker's
CPU seconds over the burst, and Redis's ``SSUBSCRIBE`` and ``HSET`` calls in it.

usage: python bench/attach_burst.py --port P --redis-port R --broker-pid PID --replica ID
           --links 1000 --run NAME
"""

import argparse
import json
import time
from typing import Any

import redis
from cproton_ffi import lib

from load import cpu_s
from matrix import Conn, Loop, receiver

CREDIT = 10
POLL_SECONDS = 0.02


def calls(client: 'redis.Redis[Any]', command: str) -> int:
    stats = client.info('commandstats')
    return int(stats.get(f'cmdstat_{command}', {}).get('calls', 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--redis-port', type=int, required=True)
    parser.add_argument('--broker-pid', type=int, required=True)
    parser.add_argument('--replica', required=True, help="the broker's replica id")
    parser.add_argument('--links', type=int, default=1000)
    parser.add_argument('--run', default='burst', help='prefix of the queue names')
    parser.add_argument('--timeout', type=float, default=120.0)
    opts = parser.parse_args()

    client = redis.Redis(host='127.0.0.1', port=opts.redis_port)
    addresses = [f'{opts.run}-{i}' for i in range(opts.links)]
    watchers = [f'shoal:{{a:{a}}}:watchers' for a in addresses]
    before = {c: calls(client, c) for c in ('ssubscribe', 'hset')}
    conn = Conn(opts.port, opts.run)
    loop = Loop([conn], lambda _delivery: None)
    cpu0, t0 = cpu_s(opts.broker_pid), time.monotonic()
    for i, address in enumerate(addresses):
        lib.pn_link_flow(receiver(conn, address, f'{opts.run}-r{i}'), CREDIT)
    conn.flush()
    deadline = t0 + opts.timeout
    loop.attach(deadline, opts.links)
    attached = time.monotonic() - t0
    pending = list(watchers)
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f'{len(pending)} of {opts.links} queues never listed the broker')
        pipe = client.pipeline(transaction=False)
        for key in pending:
            pipe.hexists(key, opts.replica)
        pending = [k for k, listed in zip(pending, pipe.execute(), strict=True) if not listed]
        loop.turn(POLL_SECONDS)
    listed = time.monotonic() - t0
    cpu = cpu_s(opts.broker_pid) - cpu0
    after = {c: calls(client, c) for c in ('ssubscribe', 'hset')}
    conn.close()
    print(json.dumps({
        'links': opts.links,
        'attached_s': round(attached, 3),
        'listed_s': round(listed, 3),
        'broker_cpu_s': round(cpu, 3),
        'ssubscribe_calls': after['ssubscribe'] - before['ssubscribe'],
        'hset_calls': after['hset'] - before['hset'],
    }))  # fmt: skip


if __name__ == '__main__':
    main()
