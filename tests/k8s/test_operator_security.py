"""The operator against kmock and a real Redis: a BrokerCluster's auth and tls reach the broker
pods (Secret volumes, environment, AMQPS ports) and the connection Secret apps read."""

import base64
from typing import Any

from kubeemulator import Kube, cluster_body, condition

from shoal_broker import settings as broker

AUTH = {'usersSecretName': 'shoal-users'}
TLS = {'secretName': 'shoal-tls', 'clientAuth': 'Optional', 'clientCASecretName': 'client-ca'}


def broker_container(deployment: dict[str, Any]) -> dict[str, Any]:
    [container] = deployment['spec']['template']['spec']['containers']
    return dict(container)


def plain_env(container: dict[str, Any]) -> dict[str, str]:
    return {e['name']: e['value'] for e in container['env'] if 'value' in e}


async def test_auth_and_tls_mount_their_secrets_and_configure_the_brokers(
    operator: Kube, store_url: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body(auth=AUTH, tls=TLS))

    async def deployment() -> Any:
        return await operator.get('deployments', 'shoal', api_version='apps/v1')

    found = await operator.eventually(deployment, 'the Deployment')
    pod = found['spec']['template']['spec']
    secrets = {v['name']: v['secret']['secretName'] for v in pod['volumes'] if 'secret' in v}
    assert secrets == {'users': 'shoal-users', 'tls': 'shoal-tls', 'client-ca': 'client-ca',
                       'management': 'shoal-management'}  # fmt: skip
    container = broker_container(found)
    mounts = {m['name']: (m['mountPath'], m['readOnly'])
              for m in container['volumeMounts']
              if m['name'] not in ('tmp', 'management')}  # fmt: skip
    assert mounts == {'users': ('/etc/shoal/users', True), 'tls': ('/etc/shoal/tls', True),
                      'client-ca': ('/etc/shoal/client-ca', True)}  # fmt: skip
    env = plain_env(container)
    assert env[broker.ENV_ALLOW_ANONYMOUS] == 'false'
    assert env[broker.ENV_USERS_FILE] == '/etc/shoal/users/users.json'
    assert env[broker.ENV_TLS_LISTEN] == '0.0.0.0:5671'
    assert env[broker.ENV_TLS_CLIENT_AUTH] == 'optional'
    assert env[broker.ENV_TLS_CLIENT_CA_FILE] == '/etc/shoal/client-ca/ca.crt'
    assert 'amqps' in [p['name'] for p in container['ports']]

    connection = await operator.eventually(
        lambda: operator.get('secrets', 'shoal-connection', api_version='v1'), 'the Secret'
    )
    decoded = {k: base64.b64decode(v).decode() for k, v in connection['data'].items()}
    assert decoded['uri'] == 'amqp://shoal.default.svc:5672'
    assert decoded['amqps-uri'] == 'amqps://shoal.default.svc:5671'

    async def endpoints() -> Any:
        body = await operator.get('brokerclusters', 'shoal') or {}
        return (body.get('status') or {}).get('endpoints')

    urls = [e['url'] for e in await operator.eventually(endpoints, 'status.endpoints')]
    assert urls == ['amqp://shoal.default.svc:5672', 'amqps://shoal.default.svc:5671']

    # Opening the cluster to anonymous clients and dropping TLS changes the pod template (a
    # rollout), and the Secret volumes go with it.
    await operator.patch('brokerclusters', 'shoal', {'spec': {
        'auth': {'allowAnonymous': True, 'usersSecretName': None}, 'tls': None}})  # fmt: skip

    async def opened() -> Any:
        d = await deployment()
        return (
            d
            if d and plain_env(broker_container(d))[broker.ENV_ALLOW_ANONYMOUS] == 'true'
            else None
        )

    changed = await operator.eventually(opened, 'the Deployment allowing ANONYMOUS')
    assert [v['name'] for v in changed['spec']['template']['spec']['volumes']] == [
        'tmp',
        'management',
    ]
    env = plain_env(broker_container(changed))
    assert broker.ENV_USERS_FILE not in env
    assert broker.ENV_TLS_LISTEN not in env


async def test_a_cluster_nobody_could_log_into_is_refused_until_it_names_its_users(
    operator: Kube, store_url: str, address: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body(auth={'allowAnonymous': False}))

    async def refused() -> bool:
        return 'InvalidSpec' in await operator.event_reasons('shoal')

    await operator.eventually(refused, 'an InvalidSpec event')
    assert await operator.get('deployments', 'shoal', api_version='apps/v1') is None
    # a Queue on it waits (retrying), saying why, and is declared once the cluster is fixed
    await operator.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'},
                                     'spec': {'clusterRef': {'name': 'shoal'},
                                              'queueName': address}})  # fmt: skip

    async def queue_ready(status: str) -> Any:
        body = await operator.get('queues', 'orders') or {}
        found = condition(body, 'Ready')
        return found if found.get('status') == status else None

    waiting = await operator.eventually(lambda: queue_ready('False'), 'the Queue not Ready')
    assert waiting['reason'] == 'ClusterInvalid'
    assert 'auth.usersSecretName is required' in waiting['message']
    await operator.patch('brokerclusters', 'shoal', {'spec': {'auth': AUTH}})
    await operator.eventually(
        lambda: operator.get('deployments', 'shoal', api_version='apps/v1'), 'the Deployment'
    )
    await operator.eventually(lambda: queue_ready('True'), 'the Queue Ready')


def secret(name: str, **files: str) -> dict[str, Any]:
    data = {key: base64.b64encode(text.encode()).decode() for key, text in files.items()}
    return {'metadata': {'name': name}, 'data': data}


async def test_missing_secrets_are_reported_until_they_appear(
    operator: Kube, store_url: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body(auth=AUTH, tls=TLS))

    async def secrets_found(status: str, reason: str) -> Any:
        body = await operator.get('brokerclusters', 'shoal') or {}
        found = condition(body, 'SecretsFound')
        return body if (found.get('status'), found.get('reason')) == (status, reason) else None

    body = await operator.eventually(
        lambda: secrets_found('False', 'SecretMissing'), 'SecretsFound=False/SecretMissing'
    )
    missing = [
        'Secret default/shoal-users (spec.auth.usersSecretName) does not exist',
        'Secret default/shoal-tls (spec.tls.secretName) does not exist',
        'Secret default/client-ca (spec.tls.clientCASecretName) does not exist',
    ]
    assert condition(body, 'SecretsFound')['message'].split('; ') == missing
    ready = condition(body, 'Ready')
    assert (ready['status'], ready['reason'], ready['message']) == (
        'False', 'SecretMissing', missing[0]
    )  # fmt: skip
    # the Deployment is there all the same: its pods wait for the Secrets (Kubernetes semantics)
    assert await operator.get('deployments', 'shoal', api_version='apps/v1') is not None
    # one Warning Event per missing Secret, not one per check
    await operator.observer_passes(2)
    assert (await operator.event_reasons('shoal')).count('SecretMissing') == 3

    await operator.create('secrets', secret('shoal-users', **{'users.json': '{}'}), 'v1')
    await operator.create('secrets', secret('shoal-tls', **{'tls.crt': 'cert'}), 'v1')
    await operator.create('secrets', secret('client-ca', **{'ca.crt': 'ca'}), 'v1')
    body = await operator.eventually(
        lambda: secrets_found('False', 'SecretKeyMissing'), 'SecretsFound=False/SecretKeyMissing'
    )
    assert condition(body, 'SecretsFound')['message'] == (
        'Secret default/shoal-tls (spec.tls.secretName) has no key tls.key'
    )
    assert 'SecretKeyMissing' in await operator.event_reasons('shoal')

    key = base64.b64encode(b'key').decode()
    await operator.patch('secrets', 'shoal-tls', {'data': {'tls.key': key}}, api_version='v1')
    body = await operator.eventually(lambda: secrets_found('True', 'Found'), 'SecretsFound=True')
    assert condition(body, 'Ready')['reason'] == 'NoReplicaReady'  # kmock runs no pods
