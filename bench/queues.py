"""
What many idle queues cost one broker replica: its CPU and Redis's over a measured span, the
metric records it appends per interval, and one backlog refresh timed in this process (the code
the broker runs every ``SHOAL_BACKLOG_REFRESH_SECONDS``).

Declares ``--count`` queues through the store registry (as the operator does), waits a metric
interval so the broker has seen them, then samples ``/proc/PID/stat`` of the broker and of
redis-server over ``--seconds`` and the metric stream's ``entries-added`` counter. Nothing is
sent or consumed: every queue stays idle and empty. Loopback only; bounded in count and time.

With ``--peer-pid``, a second replica on the same Redis is measured too: the first replica (the
smaller id) reads every stream for both, the peer reads what it shared.

usage: python bench/queues.py --redis-url redis://127.0.0.1:PORT/0 --broker-pid PID
           --redis-pid PID [--peer-pid PID] [--count 10000] [--seconds 60] [--interval 10]
"""

import argparse
import asyncio
import json
import os
import time

import redis.asyncio

from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.store import keys
from shoal_broker.store.registry import Registry

DECLARE_BATCH = 50


def cpu_seconds(pid: int) -> float:
    with open(f'/proc/{pid}/stat') as stat:
        fields = stat.read().rpartition(')')[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


async def entries_added(client: 'redis.asyncio.Redis') -> int:
    try:
        info = await client.xinfo_stream(keys.METRICS)
    except redis.exceptions.ResponseError:
        return 0  # no record yet
    return int(info['entries-added'])


async def declare(url: str, count: int) -> float:
    client = redis.asyncio.Redis.from_url(url, decode_responses=True)
    registry = Registry(client)
    started = time.monotonic()
    try:
        for first in range(0, count, DECLARE_BATCH):
            names = range(first, min(count, first + DECLARE_BATCH))
            await asyncio.gather(*(registry.declare_queue(f'idle-{i}', 'bench/q') for i in names))
    finally:
        await registry.close()
    return time.monotonic() - started


async def timed_refresh(url: str, repetitions: int) -> list[tuple[float, float]]:
    """(wall, CPU of this process) of each of a few backlog refreshes."""
    snapshot = BacklogSnapshot(url, interval=3600.0)
    timings = []
    try:
        for _ in range(repetitions):
            wall, cpu = time.monotonic(), time.process_time()
            if not await snapshot.refresh():
                raise SystemExit('the backlog refresh did not reach Redis')
            timings.append((time.monotonic() - wall, time.process_time() - cpu))
    finally:
        await snapshot.close()
    return timings


async def main(opts: argparse.Namespace) -> None:
    declare_s = await declare(opts.redis_url, opts.count)
    await asyncio.sleep(opts.interval * 1.5)  # the broker has refreshed and recorded them
    client = redis.asyncio.Redis.from_url(opts.redis_url, decode_responses=True)
    try:
        records_before = await entries_added(client)
        broker_before, redis_before = cpu_seconds(opts.broker_pid), cpu_seconds(opts.redis_pid)
        peer_before = cpu_seconds(opts.peer_pid) if opts.peer_pid else 0.0
        started = time.monotonic()
        await asyncio.sleep(opts.seconds)
        span = time.monotonic() - started
        broker_cpu = cpu_seconds(opts.broker_pid) - broker_before
        redis_cpu = cpu_seconds(opts.redis_pid) - redis_before
        peer_cpu = cpu_seconds(opts.peer_pid) - peer_before if opts.peer_pid else None
        records = await entries_added(client) - records_before
    finally:
        await client.aclose()
    refreshes = await timed_refresh(opts.redis_url, opts.refreshes)
    intervals = span / opts.interval
    print(json.dumps({
        'queues': opts.count,
        'declare_s': round(declare_s, 1),
        'span_s': round(span, 1),
        'broker_cpu_pct': round(100 * broker_cpu / span, 1),
        'redis_cpu_pct': round(100 * redis_cpu / span, 1),
        'peer_cpu_pct': None if peer_cpu is None else round(100 * peer_cpu / span, 1),
        'records_per_interval': round(records / intervals, 1),
        'refresh_wall_s': sorted(round(w, 3) for w, _ in refreshes),
        'refresh_cpu_s': sorted(round(c, 3) for _, c in refreshes),
    }))  # fmt: skip


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--redis-url', required=True)
    p.add_argument('--broker-pid', type=int, required=True)
    p.add_argument('--redis-pid', type=int, required=True)
    p.add_argument('--peer-pid', type=int, help='a second replica on the same Redis')
    p.add_argument('--count', type=int, default=10_000)
    p.add_argument('--seconds', type=float, default=60.0)
    p.add_argument('--interval', type=float, default=10.0, help='the metric interval (s)')
    p.add_argument('--refreshes', type=int, default=3, help='backlog refreshes timed here')
    options = p.parse_args()
    if not options.redis_url.startswith('redis://127.'):
        raise SystemExit('loopback Redis only')
    asyncio.run(main(options))
