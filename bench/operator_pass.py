"""
One observer pass of the operator over many resources: its duration, CPU, Redis commands and API
requests, at 10 000 Queues and SharedSubscriptions by default.

``bench/operator_rest.py`` runs the whole operator process, and its resources are created
through the API and provisioned by kopf's handlers one by one: kmock's emulator (one Python
process, which looks each object up by scanning all of them) times out under that at a few
thousand. Here the pass itself runs in this process, the operator's own code
(``observer.observe_all``) on a ``Runtime`` whose inventory holds the resources as the watch
would deliver them (settled: ``observedGeneration`` set, ``Provisioned`` true), against the same
emulator (served on a loopback port, for the Secret and anything a pass would write) and a real
redis-server. A first sampling (``entities.sample_all``) finds every entity missing from Redis
and declares it (its drift repair), and each status it would write is merged into the inventory,
as the API server and the watch would; one more pass settles, then ``--passes`` passes at rest
are measured:

- the pass's wall time and this process's CPU time in it (the emulator serves only the few
  requests of a pass at rest: the cluster's children and its Secret);
- Redis commands per pass, by command (``INFO commandstats``: the calls a Lua script makes count
  under their own command, besides the ``evalsha``);
- the API requests of the pass, by method and resource.

One JSON line on stdout. Loopback only; bounded: every step has a deadline and the redis-server
started is stopped by its PID.

usage: python bench/operator_pass.py [--queues 8000] [--subscriptions 2000] [--passes 3]
"""

import argparse
import asyncio
import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import redis

from operator_rest import COUNTS, BenchEmulator, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'tests' / 'support'))
from kubeemulator import CRDS, GROUP_VERSION, kmock_resource

from shoal_operator import entities, k8s, observer, status
from shoal_operator.runtime import Runtime, Settings

NAMESPACE = 'default'
SETTLED = {'observedGeneration': 1, 'conditions': [
    {'type': 'Provisioned', 'status': 'True', 'reason': 'Provisioned', 'message': '',
     'observedGeneration': 1, 'lastTransitionTime': '2026-01-01T00:00:00Z'},
    {'type': 'Ready', 'status': 'True', 'reason': 'Ready', 'message': '',
     'observedGeneration': 1, 'lastTransitionTime': '2026-01-01T00:00:00Z'},
]}  # fmt: skip
"""A status as kopf's handlers leave a provisioned resource."""


def bodies(queues: int, subscriptions: int) -> list[tuple[str, str, dict[str, Any]]]:
    found: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(queues):
        found.append(('Queue', 'queues', {
            'apiVersion': GROUP_VERSION, 'kind': 'Queue',
            'metadata': {'name': f'q{i}', 'namespace': NAMESPACE, 'generation': 1},
            'spec': {'clusterRef': {'name': 'shoal'}, 'queueName': f'bench-q{i}'},
            'status': copy.deepcopy(SETTLED),
        }))  # fmt: skip
    for i in range(subscriptions):
        found.append(('SharedSubscription', 'sharedsubscriptions', {
            'apiVersion': GROUP_VERSION, 'kind': 'SharedSubscription',
            'metadata': {'name': f's{i}', 'namespace': NAMESPACE, 'generation': 1},
            'spec': {'clusterRef': {'name': 'shoal'}, 'topic': f'bench-t{i % 100}',
                     'subscriptionName': f'bench-s{i}'},
            'status': copy.deepcopy(SETTLED),
        }))  # fmt: skip
    return found


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """A JSON merge patch (RFC 7386) applied in place, as the API server applies a status write."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


def commands(client: redis.Redis) -> dict[str, int]:
    """Calls so far by command (``INFO commandstats``; a script's own calls count under theirs)."""
    stats = client.info('commandstats')
    return {name.removeprefix('cmdstat_'): int(v['calls']) for name, v in stats.items()}


async def run(args: argparse.Namespace, redis_url: str, store: redis.Redis) -> dict[str, Any]:
    async with BenchEmulator() as emulator, kmock.Server(emulator) as server:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            emulator.resources.load_bundled()
        for plural, (kind, subresources) in CRDS.items():
            emulator.resources[f'{GROUP_VERSION}/{plural}'] = kmock_resource(kind, subresources)
        api = f'/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}'
        async with aiohttp.ClientSession(str(server.url)) as session:

            async def create(path: str, body: dict[str, Any]) -> dict[str, Any]:
                async with session.post(path, json=body) as response:
                    assert response.status < 300, await response.text()
                    return dict(await response.json())

            await create(f'/api/v1/namespaces/{NAMESPACE}/secrets', {
                'metadata': {'name': 'redis', 'namespace': NAMESPACE},
                'stringData': {'url': redis_url}})  # fmt: skip
            cluster = await create(f'{api}/brokerclusters', {
                'apiVersion': GROUP_VERSION, 'kind': 'BrokerCluster',
                'metadata': {'name': 'shoal', 'namespace': NAMESPACE},
                'spec': {'redis': {'secretName': 'redis'}, 'replicas': 2,
                         'auth': {'allowAnonymous': True}},
            })  # fmt: skip
            resources = bodies(args.queues, args.subscriptions)
            settings = Settings(broker_image='shoal:bench', namespaces=(NAMESPACE,),
                                observe_seconds=args.observe)  # fmt: skip
            runtime = Runtime(settings)
            runtime.kube = k8s.Kube(kopf.ConnectionInfo(server=str(server.url), token='bench'))
            try:
                runtime.remember('BrokerCluster', cluster, deleted=False)
                first = time.monotonic()
                for kind in ('Queue', 'SharedSubscription'):
                    mine = [body for k, _, body in resources if k == kind]
                    sampled = await asyncio.wait_for(
                        entities.sample_all(runtime, kind, mine), args.limit
                    )
                    for body, live in sampled:
                        assert live is not None, f'no sample of {kind} {body["metadata"]["name"]}'
                        live.pop(entities.AT_LIMIT, None)
                        merge(body['status'], status.as_patch(body['status'], live))
                        runtime.remember(kind, body, deleted=False)
                first = time.monotonic() - first
                await asyncio.wait_for(observer.observe_all(runtime), args.limit)
                await asyncio.wait_for(observer.observe_all(runtime), args.limit)
                passes = []
                for _ in range(args.passes):
                    before = COUNTS.copy()
                    redis_before = commands(store)
                    cpu, clock = time.process_time(), time.monotonic()
                    await asyncio.wait_for(observer.observe_all(runtime), args.limit)
                    seconds, cpu = time.monotonic() - clock, time.process_time() - cpu
                    passes.append({
                        'seconds': round(seconds, 3), 'cpu_seconds': round(cpu, 3),
                        'redis_commands': {k: n - redis_before.get(k, 0)
                                           for k, n in sorted(commands(store).items())
                                           if n != redis_before.get(k, 0) and k != 'info'},
                        'requests': dict(sorted((COUNTS - before).items())),
                    })  # fmt: skip
            finally:
                await runtime.api().close()
                await runtime.close()
    seconds = sorted(p['seconds'] for p in passes)
    cpu = sorted(p['cpu_seconds'] for p in passes)
    total = args.queues + args.subscriptions
    return {
        'queues': args.queues,
        'subscriptions': args.subscriptions,
        'provision_and_first_sample_seconds': round(first, 1),
        'pass_seconds_median': seconds[len(seconds) // 2],
        'pass_seconds_max': seconds[-1],
        'pass_cpu_seconds_median': cpu[len(cpu) // 2],
        'ms_per_resource': round(1000 * seconds[len(seconds) // 2] / total, 3),
        'cpu_percent_of_a_core_at_rest': round(100 * cpu[len(cpu) // 2] / args.observe, 2),
        'observe_seconds': args.observe,
        'passes': passes,
        'machine': f'nproc={os.cpu_count()} loadavg={os.getloadavg()[0]:.2f}',
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[1] if __doc__ else None)
    parser.add_argument('--queues', type=int, default=8000)
    parser.add_argument('--subscriptions', type=int, default=2000)
    parser.add_argument('--passes', type=int, default=3, help='passes at rest measured')
    parser.add_argument('--observe', type=float, default=30.0, help='the observe interval')
    parser.add_argument('--limit', type=float, default=600.0, help='bound of each pass')
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get('LOG_LEVEL', 'WARNING'))
    binary = shutil.which('redis-server')
    if binary is None:
        sys.exit('redis-server is not installed')
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix='shoal-operator-pass-'))
    server = subprocess.Popen(
        [binary, '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
         '--dir', str(work)], stdout=subprocess.DEVNULL,
    )  # fmt: skip
    store = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                store.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        result = asyncio.run(run(args, f'redis://127.0.0.1:{port}/0', store))
        print(json.dumps(result))
    finally:
        store.close()
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
