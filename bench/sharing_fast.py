"""
What the sharing rule's fast path saves Redis per fetch, and what an entry costs through Lua.

Two replicas keep a sharing record for one subscription; each round appends ENTRIES 1 KiB
entries and the first replica fetches them all. The other replica's record is either idle
(nothing reserved, no free credit: ``fetch.lua`` takes its fast path) or holds a lapsed
reservation (the rule runs, counts, rewrites both records, and grants the same), the two cases
interleaved over REPEATS rounds; it prints Redis's time per fetch (``INFO commandstats``:
EVALSHA's, which holds what the script calls), medians. Then Redis's time per entry of one
``XREADGROUP`` of 100 entries sent plainly against the same read inside a script that returns
its reply as it is. A private redis-server on a free loopback port; ``--lua DIR`` takes the
scripts from another checkout's ``store/lua`` (docs/performance.md, "The sharing fast path").

usage: python bench/sharing_fast.py [--entries 1 80] [--rounds 200] [--repeats 5] [--lua DIR]
"""

import argparse
import pathlib
import statistics
import time

import redis

from shared_fetch import GROUP, private_redis, shared_between_two, source

BODY = b'x' * 1024
IDLE = '1 0 0 0 0 0'
"""The other replica's record: one consumer, no free credit, nothing reserved."""
LAPSED = '1 0 1 0 0 0'
"""The same with one entry reserved long ago: the rule runs, lapses it, and grants the same."""
READ = (
    "return redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', ARGV[1], 'STREAMS', KEYS[1], '>')"
)


def fetch_usec(client: redis.Redis, sha: str, other: str, entries: int, rounds: int) -> float:
    """Redis µs per fetch by replica a over ``rounds`` rounds, b's record being ``other``."""
    k, fetch = shared_between_two(client, sha, f'bench-{time.monotonic_ns()}')
    stream = k.streams[5]
    for _ in range(rounds):
        pipe = client.pipeline(transaction=False)
        for _ in range(entries):
            pipe.xadd(stream, {'h': b'h' * 30, 'r': BODY})
        pipe.hset(k.shares(GROUP), 'b', other)
        pipe.execute()
        fetch('a')
        client.xtrim(stream, maxlen=0)  # pending entries need not stay for this
    stats = client.info('commandstats')
    client.delete(stream, k.shares(GROUP))
    return float(stats['cmdstat_evalsha']['usec']) / rounds


def entry_usec(client: redis.Redis, in_script: bool, total: int = 20_000) -> float:
    """Redis µs per entry of reads of 100 entries, plain or inside a script."""
    stream = f'bench-read-{time.monotonic_ns()}'
    pipe = client.pipeline(transaction=False)
    for _ in range(total):
        pipe.xadd(stream, {'h': b'h' * 30, 'r': BODY})
    pipe.execute()
    client.xgroup_create(stream, 'g', '0')
    client.config_resetstat()
    for _ in range(total // 100):
        if in_script:
            client.eval(READ, 1, stream, 100)
        else:
            client.xreadgroup('g', 'c', {stream: '>'}, count=100)
    stats = client.info('commandstats')
    client.delete(stream)
    return float(stats['cmdstat_eval' if in_script else 'cmdstat_xreadgroup']['usec']) / total


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or '').strip().split('\n')[0])
    parser.add_argument('--entries', type=int, nargs='+', default=[1, 80])
    parser.add_argument('--rounds', type=int, default=200)
    parser.add_argument('--repeats', type=int, default=5)
    here = pathlib.Path(__file__).resolve().parent.parent
    default_lua = here / 'broker' / 'shoal_broker' / 'store' / 'lua'
    parser.add_argument('--lua', type=pathlib.Path, default=default_lua)
    args = parser.parse_args()
    with private_redis() as client:
        sha = client.script_load(source(args.lua, 'fetch'))
        for entries in args.entries:
            runs: dict[str, list[float]] = {IDLE: [], LAPSED: []}
            for _ in range(args.repeats):
                for other in (LAPSED, IDLE):
                    runs[other].append(fetch_usec(client, sha, other, entries, args.rounds))
            print(f'{args.lua}: {entries} entries a fetch: the rule '
                  f'{statistics.median(runs[LAPSED]):.1f} µs, the other replica idle '
                  f'{statistics.median(runs[IDLE]):.1f} µs per fetch')  # fmt: skip
        plain, scripted = [], []
        for _ in range(args.repeats):
            plain.append(entry_usec(client, in_script=False))
            scripted.append(entry_usec(client, in_script=True))
        print(f'an entry of 1 KiB read 100 at a time: plain {statistics.median(plain):.2f} µs, '
              f'in a script {statistics.median(scripted):.2f} µs')  # fmt: skip
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
