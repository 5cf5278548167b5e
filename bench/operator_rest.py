"""
The operator at rest with many resources: its CPU, memory, pass time and API requests.

Runs ``python -m shoal_operator`` as its own process against kmock's KubernetesEmulator (the
tests' ``StampingEmulator``, served in this process on a loopback port) and a real redis-server,
with one BrokerCluster, ``--queues`` Queues and ``--subscriptions`` SharedSubscriptions. Once
every resource is Ready and sampled, it waits ``--settle`` observer passes, then measures a
window of ``--window`` seconds in which nothing changes:

- the operator's CPU (``/proc/PID/stat`` utime + stime over the window) in % of one core,
  and its resident memory (``VmRSS``);
- the requests the emulator received from it, by method and resource;
- the last observer pass's duration (``shoal_operator_observation_duration_seconds``).

One JSON line on stdout. Loopback only; bounded: every wait has a deadline and the processes
started are stopped by their PID.

usage: python bench/operator_rest.py [--queues 1000] [--subscriptions 200] [--window 120]
"""

import argparse
import asyncio
import base64
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'tests' / 'support'))
from kubeemulator import CRDS, GROUP_VERSION, StampingEmulator, kmock_resource

TICKS = os.sysconf('SC_CLK_TCK')


COUNTS: collections.Counter[str] = collections.Counter()
"""The operator's requests by method and resource (``BenchEmulator``)."""
KEEP = 200


class BenchEmulator(StampingEmulator):
    """The tests' emulator with a short request log: kmock matches each request against its
    whole log (quadratic), which thousands of resources make unusable. The operator's requests
    are counted here instead, and only the latest ``KEEP`` (the ones in flight) are kept."""

    async def _handle(self, request: Any) -> Any:
        if request.headers.get('Authorization') == 'Bearer bench':
            COUNTS[describe(request)] += 1
        log = self._requests
        if len(log) > 2 * KEEP:
            del log[:-KEEP]
        return await super()._handle(request)


def describe(request: Any) -> str:
    """``METHOD resource`` (``/status`` for the subresource), e.g. ``GET secrets``."""
    method = str(request.method.value).upper()
    parts = str(request.url.path).split('/')
    kind = str(request.url.path)
    if 'namespaces' in parts:
        rest = parts[parts.index('namespaces') + 2 :]
        kind = rest[0] + ('/status' if len(rest) == 3 and rest[2] == 'status' else '')
    if request.params.get('watch'):
        method = 'WATCH'
    return f'{method} {kind}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
    return 0.0


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float | None:
    try:
        async with session.get(url) as response:
            text = await response.text()
    except aiohttp.ClientError:
        return None
    for line in text.splitlines():
        if line.startswith(name + ' '):
            return float(line.split()[1])
    return None


async def until(probe: Any, what: str, limit: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f'timed out after {limit:.0f} s waiting for {what}')
        await asyncio.sleep(every)


async def run(args: argparse.Namespace, redis_url: str, work: Path) -> dict[str, Any]:
    async with BenchEmulator() as emulator, kmock.Server(emulator) as server:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            emulator.resources.load_bundled()
        for plural, (kind, subresources) in CRDS.items():
            emulator.resources[f'{GROUP_VERSION}/{plural}'] = kmock_resource(kind, subresources)
        api = f'/apis/{GROUP_VERSION}/namespaces/default'
        async with aiohttp.ClientSession(str(server.url)) as session:

            async def create(path: str, body: dict[str, Any]) -> None:
                async with session.post(path, json=body) as response:
                    assert response.status < 300, await response.text()

            secret = {'metadata': {'name': 'redis', 'namespace': 'default'},
                      'data': {'url': base64.b64encode(redis_url.encode()).decode()}}  # fmt: skip
            await create('/api/v1/namespaces/default/secrets', secret)
            await create(f'{api}/brokerclusters', {
                'apiVersion': GROUP_VERSION, 'kind': 'BrokerCluster',
                'metadata': {'name': 'shoal', 'namespace': 'default'},
                'spec': {'redis': {'secretName': 'redis'}, 'replicas': 2,
                         'auth': {'allowAnonymous': True}},
            })  # fmt: skip
            config = work / 'kubeconfig'
            config.write_text(
                'apiVersion: v1\nkind: Config\n'
                f'clusters: [{{name: e, cluster: {{server: "{server.url}"}}}}]\n'
                'users: [{name: u, user: {token: bench}}]\n'
                'contexts: [{name: c, context: {cluster: e, user: u, namespace: default}}]\n'
                'current-context: c\n'
            )
            metrics = f'127.0.0.1:{free_port()}'
            env = {**os.environ, 'KUBECONFIG': str(config), 'SHOAL_OPERATOR_METRICS': metrics,
                   'SHOAL_OPERATOR_HEALTH': f'127.0.0.1:{free_port()}',
                   'SHOAL_OPERATOR_NAMESPACES': 'default',
                   'SHOAL_OPERATOR_LOG_LEVEL': os.environ.get('LOG_LEVEL', 'WARNING'),
                   'SHOAL_OPERATOR_OBSERVE_SECONDS': str(args.observe)}  # fmt: skip
            log = (work / 'operator.log').open('wb')
            operator = await asyncio.create_subprocess_exec(
                sys.executable, '-m', 'shoal_operator', env=env, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                names = await populate(args, session, create, f'http://{metrics}/metrics')
                started = time.monotonic()
                return await measure(args, emulator, session, operator, names, metrics, started)
            finally:
                operator.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(operator.wait(), 30)
                except TimeoutError:
                    operator.kill()
                    await asyncio.wait_for(operator.wait(), 10)
                log.close()


async def populate(
    args: argparse.Namespace, session: aiohttp.ClientSession, create: Any, metrics: str
) -> list[tuple[str, str]]:
    """Create the Queues and SharedSubscriptions ``--batch`` at a time, each batch once the
    operator has provisioned the one before (``shoal_operator_reconciles_total``): all at once,
    the emulator (one Python process) cannot keep up with the operator's requests."""
    api = f'/apis/{GROUP_VERSION}/namespaces/default'
    bodies: list[tuple[str, dict[str, Any]]] = []
    for i in range(args.queues):
        bodies.append(('queues', {
            'apiVersion': GROUP_VERSION, 'kind': 'Queue',
            'metadata': {'name': f'q{i}', 'namespace': 'default'},
            'spec': {'clusterRef': {'name': 'shoal'}, 'queueName': f'bench-q{i}'},
        }))  # fmt: skip
    for i in range(args.subscriptions):
        bodies.append(('sharedsubscriptions', {
            'apiVersion': GROUP_VERSION, 'kind': 'SharedSubscription',
            'metadata': {'name': f's{i}', 'namespace': 'default'},
            'spec': {'clusterRef': {'name': 'shoal'}, 'topic': 'bench-topic',
                     'subscriptionName': f'bench-s{i}'},
        }))  # fmt: skip

    async def provisioned() -> float:
        try:
            async with session.get(metrics) as response:
                text = await response.text()
        except aiohttp.ClientError:
            return 0.0
        return sum(float(line.split()[1]) for line in text.splitlines()
                   if line.startswith('shoal_operator_reconciles_total{')
                   and 'kind="BrokerCluster"' not in line and 'result="ok"' in line)  # fmt: skip

    for first in range(0, len(bodies), args.batch):
        for plural, body in bodies[first : first + args.batch]:
            await create(f'{api}/{plural}', body)
        done = first + len(bodies[first : first + args.batch])

        async def caught_up(done: int = done) -> bool:
            return await provisioned() >= done

        await until(caught_up, f'{done} resources provisioned', args.limit)
    return [(plural, body['metadata']['name']) for plural, body in bodies]


async def measure(
    args: argparse.Namespace,
    emulator: Any,
    session: aiohttp.ClientSession,
    operator: asyncio.subprocess.Process,
    names: list[tuple[str, str]],
    metrics: str,
    started: float,
) -> dict[str, Any]:
    api = f'/apis/{GROUP_VERSION}/namespaces/default'

    async def sampled() -> bool:
        async with session.get(f'{api}/queues') as r:
            queues = (await r.json()).get('items') or []
        async with session.get(f'{api}/sharedsubscriptions') as r:
            subs = (await r.json()).get('items') or []
        done = [b for b in queues + subs if 'backlog' in (b.get('status') or {})]
        return len(done) == len(names)

    # listing every resource is the emulator's costliest request: not too often
    await until(sampled, 'every resource Ready and sampled', args.limit, every=5.0)
    ready_after = time.monotonic() - started
    url = f'http://{metrics}/metrics'
    last = 'shoal_operator_last_observation_timestamp_seconds'
    for _ in range(args.settle + 1):
        before = await metric(session, url, last) or 0.0

        async def moved(before: float = before) -> bool:
            return ((await metric(session, url, last)) or 0.0) > before

        await until(moved, 'an observer pass', args.observe * 4 + args.limit / 4)
    first = COUNTS.copy()
    cpu_before, clock = cpu_seconds(operator.pid), time.monotonic()
    await asyncio.sleep(args.window)
    cpu = cpu_seconds(operator.pid) - cpu_before
    elapsed = time.monotonic() - clock
    counts = COUNTS - first
    duration = await metric(session, url, 'shoal_operator_observation_duration_seconds')
    return {
        'queues': args.queues,
        'subscriptions': args.subscriptions,
        'observe_seconds': args.observe,
        'ready_after_seconds': round(ready_after, 1),
        'window_seconds': round(elapsed, 1),
        'cpu_percent_of_a_core': round(100 * cpu / elapsed, 2),
        'rss_mib': round(rss_mib(operator.pid), 1),
        'pass_seconds': round(duration, 3) if duration is not None else None,
        'requests_per_second': round(sum(counts.values()) / elapsed, 3),
        'requests': dict(sorted(counts.items())),
        'machine': f'nproc={os.cpu_count()} loadavg={os.getloadavg()[0]:.2f}',
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[1] if __doc__ else None)
    parser.add_argument('--queues', type=int, default=1000)
    parser.add_argument('--subscriptions', type=int, default=200)
    parser.add_argument('--window', type=float, default=120.0, help='seconds measured at rest')
    parser.add_argument('--settle', type=int, default=1, help='passes before the window')
    parser.add_argument('--observe', type=float, default=30.0, help='observe interval')
    parser.add_argument('--limit', type=float, default=900.0, help='bound of each wait')
    parser.add_argument('--batch', type=int, default=100, help='resources created at once')
    args = parser.parse_args()
    binary = shutil.which('redis-server')
    if binary is None:
        sys.exit('redis-server is not installed')
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix='shoal-operator-rest-'))
    server = subprocess.Popen(
        [binary, '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
         '--dir', str(work)], stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        client.close()
        result = asyncio.run(run(args, f'redis://127.0.0.1:{port}/0', work))
        print(json.dumps(result))
    finally:
        server.terminate()
        server.wait(10)
        if os.environ.get('KEEP_WORK') is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f'kept {work}', file=sys.stderr)


if __name__ == '__main__':
    main()
