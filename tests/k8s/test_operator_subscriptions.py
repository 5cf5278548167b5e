"""The operator against kmock and a real Redis: a BrokerCluster and a SharedSubscription, then a
real consumer attaching with the Qpid JMS link name."""

import asyncio
from typing import Any

import redis
from amqpclient import Capabilities, connect, sender
from jmswire import JmsSource, jms_connect, subscriber, take
from kubeemulator import Kube, cluster_body, condition, subscription_body
from processes import BrokerProcess
from proton import Message

from shoal_broker.store import keys


async def test_a_broker_cluster_gets_its_children_with_owner_references(
    operator: Kube, store_url: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create(
        'brokerclusters', cluster_body(metrics={'serviceMonitor': {'enabled': True}})
    )
    deployment = await operator.eventually(
        lambda: operator.get('deployments', 'shoal', api_version='apps/v1'), 'the Deployment'
    )
    cluster = await operator.get('brokerclusters', 'shoal')
    assert cluster is not None
    owner = deployment['metadata']['ownerReferences'][0]
    assert (owner['kind'], owner['name'], owner['uid']) == (
        'BrokerCluster',
        'shoal',
        cluster['metadata']['uid'],
    )
    assert deployment['spec']['replicas'] == 2
    container = deployment['spec']['template']['spec']['containers'][0]
    assert container['image'] == 'shoal:test'
    assert container['securityContext']['readOnlyRootFilesystem'] is True
    for plural, name, version in [
        ('services', 'shoal', 'v1'), ('services', 'shoal-pods', 'v1'),
        ('configmaps', 'shoal-config', 'v1'), ('secrets', 'shoal-connection', 'v1'),
        ('poddisruptionbudgets', 'shoal', 'policy/v1'),
        ('servicemonitors', 'shoal', 'monitoring.coreos.com/v1'),
    ]:  # fmt: skip
        child = await operator.eventually(
            lambda p=plural, n=name, v=version: operator.get(p, n, api_version=v),
            f'{plural}/{name}',
        )
        assert child['metadata']['ownerReferences'][0]['uid'] == cluster['metadata']['uid']
    assert (
        await operator.get('networkpolicies', 'shoal', api_version='networking.k8s.io/v1') is None
    )

    async def redis_connected() -> Any:
        body = await operator.get('brokerclusters', 'shoal')
        return ((body or {}).get('status') or {}).get('redis', {}).get('connected')

    await operator.eventually(redis_connected, 'Redis connected on the status')
    # the scale subresource path: spec.replicas changes, the Deployment follows
    await operator.patch('brokerclusters', 'shoal', {'spec': {'replicas': 4}})

    async def scaled() -> Any:
        d = await operator.get('deployments', 'shoal', api_version='apps/v1')
        return d is not None and d['spec']['replicas'] == 4

    await operator.eventually(scaled, 'the Deployment scaled to 4')
    await operator.delete('deployments', 'shoal', api_version='apps/v1')  # drift: repaired
    await operator.eventually(scaled, 'the Deployment created again')
    status = (await operator.get('brokerclusters', 'shoal') or {})['status']
    assert status['selector'] == ('app.kubernetes.io/name=shoal,app.kubernetes.io/instance=shoal,'
                                  'app.kubernetes.io/component=broker')  # fmt: skip


async def test_a_declared_shared_subscription_is_joined_by_a_jms_consumer_and_reports_it(
    operator: Kube, store_url: str, rds: redis.Redis, broker: BrokerProcess, address: str
) -> None:
    name = f'ssub-{address[-8:]}'
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body())
    await operator.create(
        'sharedsubscriptions',
        subscription_body(
            name, address, selector="color = 'red'", maxConsumers=1, deletionPolicy='Delete'
        ),
    )
    sub_id = f'durable:global:*:{name}'
    definition_key = keys.SubscriptionKeys.of(sub_id).definition

    async def ready() -> Any:
        body = await operator.get('sharedsubscriptions', name)
        return condition(body, 'Ready').get('status') == 'True' and body

    body = await operator.eventually(ready, 'the subscription Ready')
    assert body['status']['linkName'] == f'{name}|global'
    assert not body['metadata'].get('finalizers')  # namespaced RBAC: nothing holds a namespace
    definition = rds.hgetall(definition_key)
    assert definition['owner'] == f'default/{name}'
    assert (definition['topic'], definition['selector'], definition['max_consumers']) == (
        address,
        "color = 'red'",
        '1',
    )

    # messages published before any consumer attached are kept for the declared subscription
    conn = connect(broker.url)
    snd = sender(conn, address, Capabilities('topic'))
    for i, color in enumerate(['red', 'blue', 'red']):
        snd.send(Message(body=i, properties={'color': color}))
    conn.close()

    async def backlog_of(count: int) -> Any:
        body = await operator.get('sharedsubscriptions', name)
        return ((body or {}).get('status') or {}).get('backlog', {}).get('messages') == count

    await operator.eventually(lambda: backlog_of(3), 'a backlog of 3 on the status')
    app = jms_connect(broker.url)
    consumer = subscriber(app, address, f'{name}|global',
                          JmsSource('shared', 'global', 'topic', durable=True,
                                    selector="color = 'red'"))  # fmt: skip

    async def one_consumer() -> Any:
        body = await operator.get('sharedsubscriptions', name)
        return ((body or {}).get('status') or {}).get('consumers', {}).get('active') == 1

    await operator.eventually(one_consumer, 'one consumer on the status')

    async def at_limit(expected: str) -> bool:
        body = await operator.get('sharedsubscriptions', name)
        return condition(body, 'ConsumersAtLimit').get('status') == expected

    await operator.eventually(lambda: at_limit('True'), 'ConsumersAtLimit with 1 of 1')
    received = await asyncio.to_thread(take, consumer, 2)
    assert received == [0, 2]  # the blue one was consumed unseen by the selector
    await operator.eventually(lambda: backlog_of(0), 'the backlog drained on the status')
    app.close()
    await operator.eventually(lambda: at_limit('False'), 'below the limit once it left')
