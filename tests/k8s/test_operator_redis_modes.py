"""
The operator against kmock and real Redis servers, with ``spec.redis`` naming Redis by mode: it
renders the URL from the spec and the Secrets it names into ``<name>-redis-url`` (what the brokers
read) and reaches Redis through that same URL (status, registry), through Sentinel as well.
"""

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from certs import Authority
from kubeemulator import Kube, cluster_body, condition
from processes import LOOPBACK, RedisServer, free_port
from sentinels import SERVICE, SentinelGroup

from shoal_broker.store import connect


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    group = SentinelGroup(password='redis@pass/1', sentinel_password='sentinel:pass')
    try:
        yield group
    finally:
        group.stop()


async def secret(kube: Kube, name: str, **data: str) -> None:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    await kube.create('secrets', {'metadata': {'name': name}, 'data': encoded}, api_version='v1')


async def connected(kube: Kube) -> dict[str, Any]:
    async def probe() -> Any:
        body = await kube.get('brokerclusters', 'shoal') or {}
        return body if ((body.get('status') or {}).get('redis') or {}).get('connected') else None

    return dict(await kube.eventually(probe, 'the cluster connected to Redis'))


async def not_connected(kube: Kube) -> dict[str, Any]:
    """The RedisConnected condition, once it is False."""

    async def reported() -> Any:
        found = condition(await kube.get('brokerclusters', 'shoal'), 'RedisConnected')
        return found if found.get('status') == 'False' else None

    return dict(await kube.eventually(reported, 'RedisConnected False'))


async def rendered_url(kube: Kube) -> str:
    found = await kube.eventually(
        lambda: kube.get('secrets', 'shoal-redis-url', api_version='v1'), 'the rendered Secret'
    )
    return base64.b64decode(found['data']['url']).decode()


async def test_a_sentinel_cluster_is_reached_through_the_sentinels_with_both_credentials(
    operator: Kube, sentinel_group: SentinelGroup
) -> None:
    await secret(operator, 'redis-auth', password=sentinel_group.password)
    await secret(operator, 'sentinel-auth', secret=sentinel_group.sentinel_password)
    hosts = [f'{LOOPBACK}:{port}' for port, _ in sentinel_group.sentinels]
    sentinel_auth = {'secretName': 'sentinel-auth', 'passwordKey': 'secret'}
    sentinel = {'hosts': hosts, 'serviceName': SERVICE, 'auth': sentinel_auth}
    redis = {'mode': 'sentinel', 'auth': {'secretName': 'redis-auth'}, 'sentinel': sentinel}
    await operator.create('brokerclusters', cluster_body(redis=redis))
    body = await connected(operator)
    assert condition(body, 'RedisConnected')['status'] == 'True'

    url = await rendered_url(operator)
    assert url.startswith('redis+sentinel://:redis%40pass%2F1@')
    # the brokers' URL reaches the primary the sentinels name, with the same credentials
    client = connect.client(url, decode_responses=True)
    try:
        role = (await client.execute_command('ROLE'))[0]
        port = int((await client.connection_pool.get_master_address())[1])  # type: ignore[attr-defined]
    finally:
        await connect.close(client)
    assert (role, port) == ('master', sentinel_group.primary_port())

    deployment = await operator.get('deployments', 'shoal', api_version='apps/v1')
    assert deployment is not None
    template = deployment['spec']['template']
    (container,) = template['spec']['containers']
    env = {e['name']: e.get('valueFrom') for e in container['env']}
    assert env['SHOAL_REDIS_URL'] == {'secretKeyRef': {'name': 'shoal-redis-url', 'key': 'url'}}
    assert 'shoal.dev/redis-checksum' in template['metadata']['annotations']


async def test_missing_credentials_are_reported_and_the_cluster_connects_once_they_exist(
    operator: Kube, redis_server: RedisServer
) -> None:
    """A standalone Redis by host and port, its credentials Secret created after the cluster:
    everything else is applied meanwhile, and the Secret's arrival is enough."""
    redis = {'host': LOOPBACK, 'port': redis_server.port, 'auth': {'secretName': 'late'}}
    await operator.create('brokerclusters', cluster_body(redis=redis))
    found = await not_connected(operator)
    assert "Secret default/late has no key 'password'" in found['message']
    assert await operator.get('deployments', 'shoal', api_version='apps/v1') is not None
    assert await operator.get('secrets', 'shoal-redis-url', api_version='v1') is None

    await secret(operator, 'late', password='')  # the session's Redis takes any password
    await connected(operator)
    assert await rendered_url(operator) == f'redis://{LOOPBACK}:{redis_server.port}/0'


async def test_a_url_secret_whose_scheme_contradicts_the_mode_is_reported(
    operator: Kube, redis_server: RedisServer
) -> None:
    await operator.redis_secret(redis_server.url)
    redis = {'mode': 'sentinel', 'secretName': 'redis'}
    await operator.create('brokerclusters', cluster_body(redis=redis))
    found = await not_connected(operator)
    assert "spec.redis.mode is sentinel but the URL's scheme is redis" in found['message']


async def test_tls_with_a_ca_secret_reaches_the_brokers_mount_and_the_operators_own_connection(
    operator: Kube, tmp_path: Path
) -> None:
    ca = Authority(tmp_path)
    server = ca.issue('localhost', server=True, stem='redis')
    tls_port = free_port()
    tls_redis = RedisServer(
        None, '--tls-port', str(tls_port), '--tls-cert-file', str(server.cert),
        '--tls-key-file', str(server.key), '--tls-ca-cert-file', str(ca.pem.cert),
        '--tls-auth-clients', 'no',
    )  # fmt: skip
    try:
        await secret(operator, 'redis-ca', **{'ca.crt': ca.pem.cert.read_text()})
        redis = {'host': 'localhost', 'port': tls_port, 'tls': {'caSecretName': 'redis-ca'}}
        await operator.create('brokerclusters', cluster_body(redis=redis))
        await connected(operator)  # only with the CA: the server's certificate is the test CA's
        url = await rendered_url(operator)
        assert url == (
            f'rediss://localhost:{tls_port}/0?ssl_ca_certs=%2Fetc%2Fshoal%2Fredis-ca%2Fca.crt'
        )
        deployment = await operator.get('deployments', 'shoal', api_version='apps/v1')
        assert deployment is not None
        pod = deployment['spec']['template']['spec']
        assert {'name': 'redis-ca', 'mountPath': '/etc/shoal/redis-ca', 'readOnly': True} in (
            pod['containers'][0]['volumeMounts']
        )
    finally:
        tls_redis.stop()
