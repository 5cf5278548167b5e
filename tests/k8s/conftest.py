"""
The operator in-process against kmock's KubernetesEmulator, on the session's real Redis.
Kubernetes is the one emulated component.
"""

import asyncio
import gc
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import kopf
import pytest
import redis
from kubeemulator import CRDS, GROUP_VERSION, Kube, StampingEmulator, cluster_body, kmock_resource
from processes import RedisServer

from shoal_operator import cli
from shoal_operator.runtime import Settings


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    return {'cls': StampingEmulator}


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator['Kube']:
    with warnings.catch_warnings():  # kmock 0.8 reads its bundle with a deprecated call
        warnings.simplefilter('ignore', DeprecationWarning)
        kmock.resources.load_bundled()
    for plural, (kind, subresources) in CRDS.items():
        kmock.resources[f'{GROUP_VERSION}/{plural}'] = kmock_resource(kind, subresources)
    kmock.resources['monitoring.coreos.com/v1/servicemonitors'] = kmock_resource(
        'ServiceMonitor', set()
    )
    async with aiohttp.ClientSession(str(kmock.url)) as session:
        yield Kube(kmock, session)


@pytest.fixture
async def operator(kube: Kube, redis_server: RedisServer) -> AsyncIterator[Kube]:
    """The operator in this process, on its own event loop in a thread (kopf's shutdown cancels
    every task it finds on its loop), against the emulator; stopped at the end of the test."""
    settings = Settings(broker_image='shoal:test', observe_seconds=0.5, retry_seconds=0.5)
    server = str(kube.emulator.url)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failures: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(cli.run(
                settings, login=lambda **_: kopf.ConnectionInfo(server=server), stop=stop,
                liveness=False,
            ))  # fmt: skip
        except BaseException as exc:
            failures.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=serve, name='operator')
    thread.start()
    yield kube
    loop.call_soon_threadsafe(stop.set)
    await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive()
    assert not failures, failures
    # Everything the operator opened (Redis and API connections) is closed by the time it
    # stops: a leak shows here, not as an unraisable warning in whichever test GC runs next.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', ResourceWarning)
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.fixture
async def cluster(operator: Kube, redis_server: RedisServer) -> Kube:
    """An operator with a BrokerCluster ``shoal`` on the session's Redis."""
    await operator.redis_secret(redis_server.url)
    await operator.create('brokerclusters', cluster_body())
    return operator


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's Redis, to see what the operator wrote."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()
