"""An API server that does not answer (nothing listening, a connection cut before the answer) is
a transient failure like a 5xx: a reconcile is retried at the operator's own delay, not at kopf's
60 s backoff for unexpected errors, and an observation pass goes on past the object rather than
ending there."""

import asyncio
import socket
from collections.abc import AsyncIterator

import kopf
import pytest
from kubeemulator import cluster_body
from processes import LOOPBACK, free_port

from shoal_operator import handlers, k8s, metrics, observer
from shoal_operator.runtime import Runtime, Settings


@pytest.fixture
async def cutting_server() -> AsyncIterator[str]:
    """A server that accepts each connection, reads the request and closes without answering."""

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(cut, LOOPBACK, 0, family=socket.AF_INET)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f'http://{LOOPBACK}:{port}'


def settled_cluster() -> dict[str, object]:
    body = cluster_body()
    body['apiVersion'] = 'shoal.dev/v1alpha1'
    body['metadata'] = {'name': 'shoal', 'namespace': 'default', 'uid': 'u1', 'generation': 1}
    body['status'] = {'observedGeneration': 1}
    return body


@pytest.mark.parametrize('server', ['nothing listening', 'cut before the answer'])
async def test_a_request_the_api_server_does_not_answer_is_an_api_error_that_says_so(
    server: str, cutting_server: str
) -> None:
    url = f'http://{LOOPBACK}:{free_port()}' if server == 'nothing listening' else cutting_server
    kube = k8s.Kube(kopf.ConnectionInfo(server=url))
    try:
        with pytest.raises(k8s.ApiUnreachable) as caught:
            await kube.get('v1', 'Secret', 'default', 'redis')
    finally:
        await kube.close()
    assert isinstance(caught.value, k8s.ApiError)
    assert str(caught.value).startswith('GET /api/v1/namespaces/default/secrets/redis: no answer (')


async def test_a_reconcile_that_finds_the_api_server_unreachable_is_retried_at_the_operators_delay(
) -> None:  # fmt: skip
    runtime = Runtime(Settings(broker_image='shoal:test', retry_seconds=0.5))
    runtime.kube = k8s.Kube(kopf.ConnectionInfo(server=f'http://{LOOPBACK}:{free_port()}'))
    registry = handlers.build_registry(runtime, lambda **_: None)
    # kopf has no public lookup of a registered handler; its changing registry lists them
    reconcile = next(h for h in registry._changing.get_all_handlers() if h.id == 'reconcile')
    patch = kopf.Patch()
    try:
        with pytest.raises(kopf.TemporaryError) as caught:
            await reconcile.fn(body=kopf.Body(settled_cluster()), patch=patch)
    finally:
        await runtime.close()
    assert caught.value.delay == 0.5
    assert 'no answer' in str(caught.value)
    assert not patch  # no status written from a reconcile that did not happen


async def test_an_observation_pass_goes_on_past_an_api_server_that_does_not_answer() -> None:
    runtime = Runtime(Settings(broker_image='shoal:test'))
    runtime.kube = k8s.Kube(kopf.ConnectionInfo(server=f'http://{LOOPBACK}:{free_port()}'))
    runtime.remember('BrokerCluster', settled_cluster(), deleted=False)
    before = metrics.LAST_OBSERVATION._value.get()
    try:
        await observer.observe_all(runtime)
    finally:
        await runtime.close()
    assert metrics.LAST_OBSERVATION._value.get() > before  # the pass reached its end
