"""
bench/selector_loop_lag.py - how long an event loop waits while long selectors are compiled.

usage: .venv/bin/python bench/selector_loop_lag.py

Compiles four valid selectors of 16 000 tokens (``v = 1+1+...``, about 0.2 s each) while the
loop does socket round trips every 2 ms, four ways: on the loop itself; in a worker thread with
CPython's default 5 ms GIL switch interval; in a thread with the broker's 0.5 ms
(``amqp/selector_offload.py``); in a worker process (which keeps the loop freest but cannot hand
back a compiled selector: it is a tree of closures). Prints the loop's worst and typical delay
per round trip. Results go to docs/security.md by hand.
"""

import asyncio
import socket
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

from shoal_broker.selector.compiler import compile_condition
from shoal_broker.selector.parser import parse

TEXTS = [f'v{i} = ' + '+'.join(['1'] * 8_000) for i in range(4)]
TICK = 0.002


def work(text: str) -> bool:
    tree = parse(text)
    assert tree is not None
    compile_condition(tree)
    return True


async def measure(kind: str, interval: float) -> str:
    sys.setswitchinterval(interval)
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            await loop.sock_sendall(a, b'x' * 100)
            await loop.sock_recv(b, 100)
            await asyncio.sleep(TICK)
            lags.append(time.perf_counter() - start - TICK)

    task = asyncio.create_task(ticker())
    pool: Executor | None = None
    if kind == 'thread':
        pool = ThreadPoolExecutor(1)
    elif kind == 'process':
        pool = ProcessPoolExecutor(1)
    if pool is not None:
        await loop.run_in_executor(pool, work, 'a = 1')  # a started worker
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    for text in TEXTS:
        if pool is None:
            work(text)
            await asyncio.sleep(0)
        else:
            await loop.run_in_executor(pool, work, text)
    elapsed = time.perf_counter() - started
    done.set()
    await task
    if pool is not None:
        pool.shutdown()
    a.close()
    b.close()
    lags.sort()
    return (
        f'{kind:7} switch {interval * 1000:3.1f} ms: compiled in {elapsed:.2f} s, loop delay '
        f'worst {lags[-1] * 1000:6.1f} ms, median {lags[len(lags) // 2] * 1000:5.2f} ms'
    )


def main() -> None:
    for kind, interval in [('loop', 0.005), ('thread', 0.005), ('thread', 0.0005),
                           ('process', 0.005)]:  # fmt: skip
        print(asyncio.run(measure(kind, interval)))


if __name__ == '__main__':
    main()
