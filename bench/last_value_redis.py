"""
Redis's cost of a last-value queue's publish: ``publish_last.lua`` against ``publish.lua``, in µs of
``EVAL`` per message (``INFO commandstats``), on a private loopback redis-server, interleaved runs,
medians (docs/performance.md#last-value-queues).

usage: PYTHONPATH=broker python bench/last_value_redis.py [RUNS]
"""

import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

import redis

from shoal_broker.store import scripts
from shoal_broker.store.keys import AddressKeys

CALLS, PER_CALL, BODY = 250, 20, b'x' * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port: int = s.getsockname()[1]
        return port


def queue(r: redis.Redis, name: str) -> AddressKeys:
    k = AddressKeys.of(name)
    r.sadd(k.groups, 'queue')
    for stream in k.streams:
        r.xgroup_create(stream, 'queue', '0', mkstream=True)
    return k


def eval_usec(r: redis.Redis, run: Callable[[], None]) -> float:
    r.config_resetstat()
    run()
    return float(r.info('commandstats')['cmdstat_eval']['usec']) / (CALLS * PER_CALL)


def plain(r: redis.Redis, k: AddressKeys) -> None:
    source = scripts.source('publish')
    for _ in range(CALLS):
        args = [part for _ in range(PER_CALL) for part in (b'h', BODY, '0', '')]
        r.eval(source, 4, k.streams[0], k.groups, k.watchers, k.levels, 'queue', '', 'r', *args)


def last(r: redis.Redis, k: AddressKeys, keys: int | None) -> None:
    source = scripts.source('publish_last')
    script_keys = (k.streams[0], k.groups, k.watchers, k.duplicates, *k.streams, k.last_values,
                   k.last_value_order, k.levels)  # fmt: skip
    n = 0
    for _ in range(CALLS):
        args: list[bytes | str] = []
        for _ in range(PER_CALL):
            args += [b'h', BODY, '0', '', '', f's{n if keys is None else n % keys}']
            n += 1
        r.eval(source, len(script_keys), *script_keys, 'queue', '', 'r', 0, 0, 0, '', 'queue', 0,
               *args)  # fmt: skip


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    port = free_port()
    server = subprocess.Popen(
        ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '',
         '--appendonly', 'no'], stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        rows: dict[str, list[float]] = {'publish.lua': [], 'publish_last.lua, distinct keys': [],
                                        'publish_last.lua, 100 keys': []}  # fmt: skip
        for run in range(runs):
            rows['publish.lua'].append(eval_usec(r, partial(plain, r, queue(r, f'p{run}'))))
            for label, keys in (('distinct keys', None), ('100 keys', 100)):
                k = queue(r, f'l{run}-{keys}')
                rows[f'publish_last.lua, {label}'].append(eval_usec(r, partial(last, r, k, keys)))
        for label, values in rows.items():
            print(f'{label}: {statistics.median(values):.2f} µs/message '
                  f'(runs: {", ".join(f"{v:.2f}" for v in values)})')  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)


if __name__ == '__main__':
    main()
