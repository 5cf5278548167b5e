"""
The operator in-process against kmock's KubernetesEmulator, on the session's real Redis.
Kubernetes is the one emulated component.

The operator watches WATCHED as the chart's namespaced RBAC has it do, and every request it
makes (it logs in with its own token, so its requests are told from the test's) must be allowed
by the operator roles the chart renders for that: a request outside them fails the test.
"""

import asyncio
import contextlib
import gc
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import kopf
import pytest
import rbac
from kubeemulator import (
    CRDS,
    GROUP_VERSION,
    WATCHED,
    Kube,
    StampingEmulator,
    cluster_body,
    kmock_resource,
)

from shoal_broker.store import connect
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
def operator_settings() -> Settings:
    return Settings(broker_image='shoal:test', observe_seconds=0.5, retry_seconds=0.5,
                    namespaces=WATCHED)  # fmt: skip


@pytest.fixture
def rbac_values() -> dict[str, Any]:
    """The chart values whose rendered RBAC the operator's requests must stay within."""
    return {'rbac': {'watchNamespaces': list(WATCHED)}}


@contextlib.asynccontextmanager
async def running(
    kube: Kube, settings: Settings, rbac_values: dict[str, Any]
) -> AsyncIterator[Kube]:
    """The operator in this process, on its own event loop in a thread (kopf's shutdown cancels
    every task it finds on its loop), against the emulator; stopped when the block ends."""
    server = str(kube.emulator.url)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failures: list[BaseException] = []

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server, token=rbac.TOKEN)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(cli.run(
                settings, login=login, stop=stop, liveness=False,
            ))  # fmt: skip
        except BaseException as exc:
            failures.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=serve, name='operator')
    thread.start()
    try:
        yield kube
    finally:
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
    roles = rbac.operator_roles(rbac_values)
    refused = {f'{request}: {need}' for need, request in rbac.operator_accesses(kube.emulator)
               if not rbac.allowed(roles, need)}  # fmt: skip
    assert not refused, f'requests the chart RBAC {rbac_values} forbids: {sorted(refused)}'


@pytest.fixture
async def operator(
    kube: Kube, store_url: str, operator_settings: Settings, rbac_values: dict[str, Any]
) -> AsyncIterator[Kube]:
    """The operator running for the whole test (``running``)."""
    async with running(kube, operator_settings, rbac_values):
        yield kube


@pytest.fixture
def restartable(
    kube: Kube, store_url: str, operator_settings: Settings, rbac_values: dict[str, Any]
) -> Callable[[], AbstractAsyncContextManager[Kube]]:
    """An operator a test starts and stops itself, as often as it likes: ``async with
    restartable():`` runs one until the block ends."""
    return lambda: running(kube, operator_settings, rbac_values)


@pytest.fixture
async def cluster(operator: Kube, store_url: str) -> Kube:
    """An operator with a BrokerCluster ``shoal`` on the session's Redis."""
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body())
    return operator


@pytest.fixture
def rds(store_url: str) -> Iterator[Any]:
    """A client of the session's Redis in any store mode (on a cluster, each command goes to the
    node serving its key's slot), to see what the operator wrote."""
    client = connect.sync_client_of_any_mode(store_url, decode_responses=True)
    yield client
    client.close()
