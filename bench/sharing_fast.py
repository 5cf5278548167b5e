"""
What the sharing rule's fast path saves Redis per fetch, and what an entry costs through Lua.

Two replicas keep a sharing record for one subscription; each round appends ENTRIES 1 KiB
entries and the first replica fetches them all. The other replica's record is either idle
(nothing reserved, no free credit: ``fetch.lua`` takes its fast path) or holds a lapsed
reservation (the rule runs, counts, rewrites both records, and grants the same), the two cases
interleaved over REPEATS rounds; it prints Redis's time per fetch (``INFO commandstats``:
EVALSHA's, which holds what the script calls), medians. Then Redis's time per entry of one
``XREADGROUP`` of 100 entries sent plainly against the same read inside a script that returns
its reply as it is, and against the staged read a fetch could make instead: a plain read under a
consumer of its own, then, in the same ``MULTI``, a script that finds what that read took
(``XPENDING`` of that consumer) and moves it to the replica's consumer (``XCLAIM ... JUSTID``:
no copy of the entries into Lua). A private redis-server on a free loopback port; ``--lua DIR``
takes the scripts from another checkout's ``store/lua`` (docs/performance.md, "The sharing fast
path" and "Sharing between replicas").

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
STAGED = """
local staged = redis.call('XPENDING', KEYS[1], 'g', '-', '+', ARGV[1], 'c~read')
local ids = {}
for i, entry in ipairs(staged) do ids[i] = entry[1] end
if #ids == 0 then return 0 end
return #redis.call('XCLAIM', KEYS[1], 'g', 'c', 0, unpack(ids), 'JUSTID')
"""
"""The staged read's script: what the plain read under ``c~read`` took, moved to ``c``."""
COUNTED = {'plain': ('xreadgroup',), 'script': ('eval',), 'staged': ('xreadgroup', 'eval')}
"""The commands whose ``commandstats`` time is each read's."""


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


def entry_usec(client: redis.Redis, how: str, total: int = 20_000) -> tuple[float, float]:
    """Redis µs per entry of reads of 100 entries: ``plain``, ``script`` (inside a script) or
    ``staged`` (a plain read and the ``STAGED`` script in one ``MULTI``), as ``commandstats``
    counts them and as Redis's CPU over the run (the reply's way out, the ``MULTI`` and all)."""
    stream = f'bench-read-{time.monotonic_ns()}'
    pipe = client.pipeline(transaction=False)
    for _ in range(total):
        pipe.xadd(stream, {'h': b'h' * 30, 'r': BODY})
    pipe.execute()
    client.xgroup_create(stream, 'g', '0')
    client.config_resetstat()
    cpu = _cpu_seconds(client)
    for _ in range(total // 100):
        if how == 'script':
            client.eval(READ, 1, stream, 100)
        elif how == 'plain':
            client.xreadgroup('g', 'c', {stream: '>'}, count=100)
        else:
            pipe = client.pipeline(transaction=True)
            pipe.xreadgroup('g', 'c~read', {stream: '>'}, count=100)
            pipe.eval(STAGED, 1, stream, 100)
            pipe.execute()
    cpu = _cpu_seconds(client) - cpu
    stats = client.info('commandstats')
    client.delete(stream)
    counted = sum(float(stats[f'cmdstat_{name}']['usec']) for name in COUNTED[how])
    return counted / total, cpu * 1e6 / total


def _cpu_seconds(client: redis.Redis) -> float:
    info = client.info('cpu')
    return float(info['used_cpu_user']) + float(info['used_cpu_sys'])


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
        reads: dict[str, list[tuple[float, float]]] = {'plain': [], 'script': [], 'staged': []}
        for _ in range(args.repeats):
            for how, figures in reads.items():
                figures.append(entry_usec(client, how))
        medians = ', '.join(
            f'{how} {statistics.median(f[0] for f in figures):.2f}; '
            f'{statistics.median(f[1] for f in figures):.2f}'
            for how, figures in reads.items()
        )
        print(f'an entry of 1 KiB read 100 at a time, Redis µs (its commands; its CPU): {medians}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
