"""
What one fetch of a shared subscription costs Redis as the groups on its stream grow.

A fetch of a subscription whose consumers are on more than one replica runs the sharing rule
in ``fetch.lua``, which counts what is unread. This starts a private redis-server on a free
loopback port, creates a band-5 stream with the shared group and ``G - 1`` other groups, has two
replicas keep a sharing record, then ROUNDS times appends 2 entries and lets each replica fetch;
it prints Redis's own time per fetch (``INFO commandstats``: EVALSHA's, which holds what the
script calls) for each G. ``--lua DIR`` takes the scripts from another checkout's ``store/lua``
directory, so two trees compare in one run (docs/performance.md, "Sharing between replicas").

usage: python bench/shared_fetch.py [--groups 1 100 1000] [--rounds 2000] [--lua DIR]
"""

import argparse
import contextlib
import pathlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import redis

from shoal_broker.store import keys
from shoal_broker.store.fetch_command import fetch_call

INCLUDE = '--! include '
GROUP = 'shared-sub'


def source(lua: pathlib.Path, name: str) -> str:
    """A script with its includes, as store/scripts.py assembles it."""
    text = (lua / f'{name}.lua').read_text()
    return ''.join(
        source(lua, line[len(INCLUDE) :].strip()) if line.startswith(INCLUDE) else line
        for line in text.splitlines(keepends=True)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_redis() -> Iterator[redis.Redis]:
    """A client of a redis-server of its own on a free loopback port (no persistence), stopped
    by its PID when the block ends."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '',
             '--appendonly', 'no', '--dir', tmp],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            client = redis.Redis(port=port)
            for _ in range(100):  # up to ~5 s for the server to listen
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            try:
                yield client
            finally:
                client.close()
        finally:
            server.terminate()
            server.wait(10)


def shared_between_two(
    client: redis.Redis, sha: str, address: str, other_groups: int = 0
) -> tuple[keys.AddressKeys, Callable[[str], None]]:
    """Subscription ``GROUP`` on the address's priority-4 stream (beside ``other_groups``
    others), served by replicas a and b, whose records a fetch by each has written; returns the
    address's keys and a fetch by a replica (1 000 credit), with the statistics reset."""
    k = keys.AddressKeys.of(address)
    client.xgroup_create(k.streams[5], GROUP, '0', mkstream=True)
    for i in range(other_groups):
        client.xgroup_create(k.streams[5], f'other-{i}', '0')

    def fetch(replica: str) -> None:
        script_keys, args = fetch_call(address, GROUP, replica, 1000, consumers=1)
        client.evalsha(sha, len(script_keys), *script_keys, *args)

    for replica in 'aba':
        fetch(replica)
    client.config_resetstat()
    return k, fetch


def fetch_usec(client: redis.Redis, sha: str, groups: int, rounds: int) -> float:
    """Redis µs per fetch over ``rounds`` rounds of 2 appends and a fetch by each replica."""
    k, fetch = shared_between_two(client, sha, f'bench-{groups}', groups - 1)
    stream = k.streams[5]
    for _ in range(rounds):
        client.xadd(stream, {'h': b'h', 'r': b'r'})
        client.xadd(stream, {'h': b'h', 'r': b'r'})
        fetch('a')
        fetch('b')
    stats = client.info('commandstats')  # the script's time holds that of what it calls
    return float(stats['cmdstat_evalsha']['usec']) / (2 * rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or '').strip().split('\n')[0])
    parser.add_argument('--groups', type=int, nargs='+', default=[1, 100, 1000])
    parser.add_argument('--rounds', type=int, default=2000)
    here = pathlib.Path(__file__).resolve().parent.parent
    default_lua = here / 'broker' / 'shoal_broker' / 'store' / 'lua'
    parser.add_argument('--lua', type=pathlib.Path, default=default_lua)
    args = parser.parse_args()
    with private_redis() as client:
        sha = client.script_load(source(args.lua, 'fetch'))
        for groups in args.groups:
            usec = fetch_usec(client, sha, groups, args.rounds)
            print(f'{args.lua}: {groups} groups on the stream: {usec:.1f} µs per fetch')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
