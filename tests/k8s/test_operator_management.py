"""The operator against kmock and a real Redis: the management API is reachable through the
cluster's Service, and a Secret of its own carries the API's URL and credentials, made once and
kept across reconciles; the broker pods mount it."""

import base64
from typing import Any

from kubeemulator import Kube, cluster_body

from shoal_broker import settings as broker


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret['data'].items()}


async def test_the_management_secret_carries_the_url_and_credentials_and_keeps_them(
    operator: Kube, store_url: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body())

    async def management() -> Any:
        return await operator.get('secrets', 'shoal-management', api_version='v1')

    first = decoded(await operator.eventually(management, 'the management Secret'))
    assert first['uri'] == 'http://shoal.default.svc:8080/api'
    assert first['username'] == 'shoal-admin'
    assert len(first['password']) >= 24

    async def connection_secret() -> Any:
        return await operator.get('secrets', 'shoal-connection', api_version='v1')

    async def service_made() -> Any:
        return await operator.get('services', 'shoal', api_version='v1')

    async def deployment_made() -> Any:
        return await operator.get('deployments', 'shoal', api_version='apps/v1')

    # the reconcile applies its manifests one at a time, the Service after the Deployment after
    # this Secret: each may come a moment after the one before
    connection = decoded(await operator.eventually(connection_secret, 'the connection Secret'))
    assert connection['management-uri'] == first['uri']
    service = await operator.eventually(service_made, 'the Service')
    assert {'name': 'http', 'port': 8080, 'targetPort': 'http', 'protocol': 'TCP'} in service[
        'spec'
    ]['ports']
    deployment = await operator.eventually(deployment_made, 'the Deployment')
    [container] = deployment['spec']['template']['spec']['containers']
    env = {e['name']: e.get('value') for e in container['env']}
    assert env[broker.ENV_MANAGEMENT_CREDENTIALS_DIR] == '/etc/shoal/management'

    # a reconcile after a change keeps the password: tools holding it keep working
    await operator.patch('brokerclusters', 'shoal', {'spec': {'image': 'img:next'}})

    async def rolled() -> Any:
        d = await operator.get('deployments', 'shoal', api_version='apps/v1')
        image = d['spec']['template']['spec']['containers'][0]['image'] if d else None
        return d if image == 'img:next' else None

    await operator.eventually(rolled, 'the Deployment with the new image')
    assert decoded(await management()) == first
