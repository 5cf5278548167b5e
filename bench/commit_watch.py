"""
What the ``WATCH`` of a one-slot commit's marker costs (docs/redis-modes.md, "A lost EXEC
reply"): a commit's ``MULTI``/``EXEC`` as ``store/transactions.py`` sends it (the marker's
``SET``, one ``XADD`` per send) with and without the ``WATCH`` that goes first, against a
redis-server of its own on a free loopback port, through redis-py's asyncio client as the broker
uses it. Rounds of each, interleaved; prints the median µs per commit of each and the
difference. A time, so it moves with the machine's load: read the difference against the spread
of the rounds it prints.

usage: python bench/commit_watch.py [COMMITS_PER_ROUND (2000)] [ROUNDS (5)] [SENDS (5)]
"""

import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import redis.asyncio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


async def commits(client: 'redis.asyncio.Redis', count: int, sends: int, watch: bool) -> float:
    """Seconds per commit over ``count`` commits."""
    started = time.perf_counter()
    for _ in range(count):
        marker = f'bench:txn:{uuid.uuid4().hex}'
        pipe = client.pipeline(transaction=True)
        if watch:
            await pipe.watch(marker)
            pipe.multi()  # type: ignore[no-untyped-call]
        pipe.set(marker, b'1', px=120_000)
        for i in range(sends):
            pipe.xadd('bench:stream', {'b': b'x' * 1024, 'i': i})
        await pipe.execute()
    return (time.perf_counter() - started) / count


async def measure(port: int, count: int, rounds: int, sends: int) -> None:
    client = redis.asyncio.Redis(host='127.0.0.1', port=port)
    try:
        for _ in range(100):  # bounded: 10 s
            try:
                await client.ping()
                break
            except redis.exceptions.ConnectionError:
                await asyncio.sleep(0.1)
        await commits(client, count // 4, sends, True)  # warm-up
        results: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for watch in (False, True):
                results[watch].append(await commits(client, count, sends, watch))
                await client.delete('bench:stream')
    finally:
        await client.aclose()
    print(f'machine: nproc={os.cpu_count()} load={os.getloadavg()[0]:.1f} '
          f'commits={count} rounds={rounds} sends={sends}')  # fmt: skip
    for watch in (False, True):
        us = [r * 1e6 for r in results[watch]]
        print(f'{"with WATCH" if watch else "without   "}: median {statistics.median(us):.1f} '
              f'µs/commit, rounds {" / ".join(f"{u:.1f}" for u in us)}')  # fmt: skip
    base, watched = (statistics.median(results[w]) * 1e6 for w in (False, True))
    extra = watched - base
    print(f'WATCH adds {extra:+.1f} µs per commit ({100 * extra / base:+.1f} %)')


def main(count: int = 2000, rounds: int = 5, sends: int = 5) -> None:
    port = free_port()
    data = tempfile.mkdtemp(prefix='shoal-bench-watch-')
    server = subprocess.Popen(
        ['redis-server', '--bind', '127.0.0.1', '--port', str(port), '--save', '',
         '--appendonly', 'no', '--dir', data],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        asyncio.run(measure(port, count, rounds, sends))
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == '__main__':
    main(*(int(a) for a in sys.argv[1:4]))
