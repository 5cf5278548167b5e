"""The operator against kmock and a real Redis: updates, pause, each deletion policy and the
finalizer escape hatches, queues, invalid specs and drift repair."""

import asyncio
import uuid
from typing import Any

import pytest
import redis
from amqpclient import Capabilities, connect, sender
from jmswire import JmsSource, jms_connect, subscriber, take
from kubeemulator import Kube, cluster_body, condition, subscription_body
from processes import BrokerProcess, free_port
from proton import Message

from shoal_broker.store import keys
from shoal_broker.store.layout import kind_of
from shoal_operator.runtime import Settings

FINALIZER = 'shoal.dev/finalizer'


@pytest.fixture
def operator_settings() -> Settings:
    """Cluster-wide, in a namespace of its own: the layout where its permissions outlive the
    resources' namespaces, so deletion that acts on Redis holds them with a finalizer."""
    return Settings(broker_image='shoal:test', observe_seconds=0.5, retry_seconds=0.5,
                    own_namespace='shoal-system')  # fmt: skip


@pytest.fixture
def rbac_values() -> dict[str, Any]:
    return {'rbac': {'scope': 'cluster'}}


@pytest.fixture
def name() -> str:
    return f'sub-{uuid.uuid4().hex[:8]}'


def definition_key(name: str, durable: bool = True) -> str:
    lifetime = 'durable' if durable else 'volatile'
    return keys.SubscriptionKeys.of(f'{lifetime}:global:*:{name}').definition


async def body_when(
    kube: Kube, plural: str, name: str, check: Any, what: str, namespace: str = 'default'
) -> dict[str, Any]:
    async def probe() -> Any:
        body = await kube.get(plural, name, namespace=namespace)
        return body if body is not None and check(body) else None

    found: dict[str, Any] = await kube.eventually(probe, what)
    return found


async def deletion_blocked(kube: Kube, name: str, reason: str) -> None:
    def blocked(body: dict[str, Any]) -> bool:
        found = condition(body, 'DeletionBlocked')
        return found.get('status') == 'True' and found.get('reason') == reason

    await body_when(kube, 'sharedsubscriptions', name, blocked, f'DeletionBlocked/{reason}')


def ready(body: dict[str, Any]) -> bool:
    return condition(body, 'Ready').get('status') == 'True'


async def gone(kube: Kube, plural: str, name: str) -> None:
    async def probe() -> bool:
        return await kube.get(plural, name) is None

    await kube.eventually(probe, f'{plural}/{name} deleted')


async def test_an_update_reaches_redis_and_the_status_records_the_generation(
    cluster: Kube, rds: redis.Redis, name: str, address: str
) -> None:
    await cluster.create(
        'sharedsubscriptions',
        subscription_body(
            name, address, maxConsumers=2, selector='n > 1', selectorChangePolicy='Recreate'
        ),
    )
    await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    await cluster.patch(
        'sharedsubscriptions', name, {'spec': {'maxConsumers': 5, 'selector': 'n > 2'}}
    )

    def updated(body: dict[str, Any]) -> bool:
        return body['status'].get('observedGeneration') == 2 and ready(body)

    body = await body_when(cluster, 'sharedsubscriptions', name, updated, 'generation 2 Ready')
    assert condition(body, 'Provisioned')['reason'] == 'Provisioned'

    async def recreated_event() -> bool:
        return 'Recreated' in await cluster.event_reasons(name)

    await cluster.eventually(recreated_event, 'a Recreated event')
    assert condition(body, 'Ready')['observedGeneration'] == 2
    definition = rds.hgetall(definition_key(name))
    assert (definition['max_consumers'], definition['selector']) == ('5', 'n > 2')


async def test_a_paused_subscription_is_left_alone_until_resumed(
    cluster: Kube, rds: redis.Redis, name: str, address: str
) -> None:
    await cluster.create('sharedsubscriptions', subscription_body(name, address, maxConsumers=2))
    await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    await cluster.patch(
        'sharedsubscriptions', name, {'metadata': {'annotations': {'shoal.dev/paused': 'true'}}}
    )
    await body_when(
        cluster,
        'sharedsubscriptions',
        name,
        lambda b: condition(b, 'ReconcilePaused').get('status') == 'True',
        'paused',
    )
    await cluster.patch('sharedsubscriptions', name, {'spec': {'maxConsumers': 7}})
    await body_when(
        cluster,
        'sharedsubscriptions',
        name,
        lambda b: b['status'].get('observedGeneration') == 2,
        'generation 2 seen',
    )
    assert rds.hget(definition_key(name), 'max_consumers') == '2'
    await cluster.patch(
        'sharedsubscriptions', name, {'metadata': {'annotations': {'shoal.dev/paused': None}}}
    )
    await body_when(
        cluster,
        'sharedsubscriptions',
        name,
        lambda b: condition(b, 'ReconcilePaused').get('status') == 'False',
        'resumed',
    )
    assert rds.hget(definition_key(name), 'max_consumers') == '7'


async def test_retain_keeps_the_subscription_without_a_finalizer_and_releases_it(
    cluster: Kube, rds: redis.Redis, name: str, address: str
) -> None:
    await cluster.create('sharedsubscriptions', subscription_body(name, address))
    body = await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    assert FINALIZER not in body['metadata'].get('finalizers', [])
    await cluster.delete('sharedsubscriptions', name)
    await gone(cluster, 'sharedsubscriptions', name)

    async def released() -> bool:
        return not rds.hexists(definition_key(name), 'owner')

    await cluster.eventually(released, 'the declaration released')
    assert rds.hget(definition_key(name), 'topic') == address  # the subscription itself stays


async def test_delete_waits_for_consumers_then_removes_the_subscription_and_backlog(
    cluster: Kube,
    rds: redis.Redis,
    broker: BrokerProcess,
    name: str,
    address: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await cluster.create(
        'sharedsubscriptions', subscription_body(name, address, deletionPolicy='Delete')
    )
    body = await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    assert FINALIZER in body['metadata']['finalizers']
    app = jms_connect(broker.url)
    subscriber(app, address, f'{name}|global', JmsSource('shared', 'global', 'topic', durable=True))
    await cluster.delete('sharedsubscriptions', name)
    await deletion_blocked(cluster, name, 'ConsumersAttached')
    assert rds.exists(definition_key(name))
    app.close()
    await gone(cluster, 'sharedsubscriptions', name)
    # the wait is expected: logged at INFO, not as a failure at ERROR (nor posted as an Event)
    kopf_records = [(r.levelname, r.getMessage()) for r in caplog.records
                    if r.name == 'kopf.objects' and 'deprovision' in r.getMessage()]  # fmt: skip
    assert ('INFO', "Handler 'deprovision' waits: consumers are attached") in kopf_records
    assert not [m for level, m in kopf_records if level == 'ERROR'], kopf_records
    assert 'Error' not in await cluster.event_types(name)
    assert not rds.exists(definition_key(name))
    groups = rds.smembers(keys.AddressKeys.of(address).groups)
    assert f'durable:global:*:{name}' not in groups


async def test_delete_if_empty_waits_for_the_backlog_to_be_consumed(
    cluster: Kube, rds: redis.Redis, broker: BrokerProcess, name: str, address: str
) -> None:
    await cluster.create(
        'sharedsubscriptions', subscription_body(name, address, deletionPolicy='DeleteIfEmpty')
    )
    await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    conn = connect(broker.url)
    sender(conn, address, Capabilities('topic')).send(Message(body='pending'))
    conn.close()
    await cluster.delete('sharedsubscriptions', name)
    await deletion_blocked(cluster, name, 'NotEmpty')
    app = jms_connect(broker.url)
    consumer = subscriber(
        app, address, f'{name}|global', JmsSource('shared', 'global', 'topic', durable=True)
    )
    assert await asyncio.to_thread(take, consumer, 1) == ['pending']
    app.close()
    await gone(cluster, 'sharedsubscriptions', name)
    assert not rds.exists(definition_key(name))


async def test_the_force_annotation_releases_a_blocked_deletion_and_leaves_redis_alone(
    cluster: Kube, rds: redis.Redis, broker: BrokerProcess, name: str, address: str
) -> None:
    await cluster.create(
        'sharedsubscriptions', subscription_body(name, address, deletionPolicy='Delete')
    )
    await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    app = jms_connect(broker.url)
    subscriber(app, address, f'{name}|global', JmsSource('shared', 'global', 'topic', durable=True))
    await cluster.delete('sharedsubscriptions', name)
    await deletion_blocked(cluster, name, 'ConsumersAttached')
    await cluster.patch(
        'sharedsubscriptions',
        name,
        {'metadata': {'annotations': {'shoal.dev/force-delete': 'true'}}},
    )
    await gone(cluster, 'sharedsubscriptions', name)
    assert rds.hget(definition_key(name), 'topic') == address
    app.close()


async def test_a_cluster_deleted_first_is_acted_on_with_the_redis_last_reached(
    cluster: Kube, rds: redis.Redis, name: str, address: str
) -> None:
    await cluster.create(
        'sharedsubscriptions', subscription_body(name, address, deletionPolicy='Delete')
    )
    await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    await cluster.delete('brokerclusters', 'shoal')
    await gone(cluster, 'brokerclusters', 'shoal')
    await cluster.delete('secrets', 'redis', api_version='v1')
    await cluster.delete('sharedsubscriptions', name)
    await gone(cluster, 'sharedsubscriptions', name)
    assert not rds.exists(definition_key(name))


async def test_the_finalizer_goes_when_the_cluster_was_never_reached(
    operator: Kube, name: str, address: str
) -> None:
    await operator.create('sharedsubscriptions', subscription_body(
        name, address, deletionPolicy='Delete', clusterRef={'name': 'nowhere'}))  # fmt: skip
    await body_when(
        operator, 'sharedsubscriptions', name,
        lambda b: condition(b, 'ClusterAvailable').get('reason') == 'ClusterNotFound',
        'ClusterNotFound',
    )  # fmt: skip
    await operator.delete('sharedsubscriptions', name)
    await gone(operator, 'sharedsubscriptions', name)
    assert 'FinalizerReleased' in await operator.event_reasons(name)


async def test_the_finalizer_goes_when_redis_stays_unreachable_past_the_timeout(
    operator: Kube, store_url: str, rds: redis.Redis, name: str, address: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body(finalizerTimeoutSeconds=1))
    await operator.create(
        'sharedsubscriptions', subscription_body(name, address, deletionPolicy='Delete')
    )
    await body_when(operator, 'sharedsubscriptions', name, ready, 'Ready')
    dead = f'redis://127.0.0.1:{free_port()}/0'
    await operator.create(
        'secrets', {'metadata': {'name': 'dead'}, 'stringData': {'url': dead}}, api_version='v1'
    )
    await operator.patch('brokerclusters', 'shoal', {'spec': {'redis': {'secretName': 'dead'}}})
    # the operator reads the cluster from its watch: wait until it has seen the change
    await body_when(operator, 'brokerclusters', 'shoal',
                    lambda b: condition(b, 'RedisConnected').get('status') == 'False',
                    'the cluster on the dead Redis')  # fmt: skip
    await operator.delete('sharedsubscriptions', name)
    await deletion_blocked(operator, name, 'RedisUnavailable')
    await gone(operator, 'sharedsubscriptions', name)
    assert rds.exists(definition_key(name))


async def test_a_queue_is_declared_sampled_and_deleted(
    cluster: Kube, rds: redis.Redis, broker: BrokerProcess, address: str
) -> None:
    body = {
        'kind': 'Queue',
        'metadata': {'name': 'orders'},
        'spec': {'clusterRef': {'name': 'shoal'}, 'queueName': address, 'deletionPolicy': 'Delete'},
    }
    await cluster.create('queues', body)
    await body_when(cluster, 'queues', 'orders', ready, 'Ready')
    assert kind_of(rds.hget(keys.ADDRESSES, address)) == 'queue'
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='first order'))
    conn.close()
    found = await body_when(
        cluster,
        'queues',
        'orders',
        lambda b: b['status'].get('backlog', {}).get('messages') == 1,
        'a backlog of 1',
    )
    assert found['status']['address'] == address
    assert found['status']['backlog']['oldestMessageAgeSeconds'] >= 0
    await cluster.delete('queues', 'orders')
    await gone(cluster, 'queues', 'orders')
    assert rds.hget(keys.ADDRESSES, address) is None


async def test_an_invalid_selector_and_a_missing_cluster_are_reported(
    operator: Kube, store_url: str, rds: redis.Redis, name: str, address: str
) -> None:
    await operator.create(
        'sharedsubscriptions', subscription_body(f'{name}-bad', address, selector='a = = 1')
    )
    bad = await body_when(
        operator,
        'sharedsubscriptions',
        f'{name}-bad',
        lambda b: condition(b, 'Ready').get('status') == 'False',
        'not Ready',
    )
    assert condition(bad, 'Ready')['reason'] == 'InvalidSelector'
    await operator.create('sharedsubscriptions', subscription_body(name, address))
    waiting = await body_when(
        operator,
        'sharedsubscriptions',
        name,
        lambda b: condition(b, 'Ready').get('status') == 'False',
        'waiting',
    )
    assert condition(waiting, 'ClusterAvailable')['reason'] == 'ClusterNotFound'
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body())
    await body_when(operator, 'sharedsubscriptions', name, ready, 'Ready once the cluster exists')
    assert not rds.exists(definition_key(f'{name}-bad'))


async def test_a_subscription_removed_behind_the_operators_back_is_declared_again(
    cluster: Kube, rds: redis.Redis, name: str, address: str
) -> None:
    await cluster.create('sharedsubscriptions', subscription_body(name, address))
    await body_when(cluster, 'sharedsubscriptions', name, ready, 'Ready')
    rds.delete(definition_key(name))

    async def back() -> bool:
        return rds.hget(definition_key(name), 'owner') == f'default/{name}'

    await cluster.eventually(back, 'the definition declared again')


async def test_observe_only_reports_without_writing_and_other_namespaces_need_admission(
    cluster: Kube, rds: redis.Redis, name: str, address: str
) -> None:
    await cluster.create(
        'sharedsubscriptions', subscription_body(name, address, managementPolicy='ObserveOnly')
    )
    missing = await body_when(
        cluster, 'sharedsubscriptions', name, lambda b: 'conditions' in b.get('status', {}), 'seen'
    )
    assert condition(missing, 'Ready')['reason'] == 'NotFound'
    assert not rds.exists(definition_key(name))
    assert 'finalizers' not in missing['metadata']
    foreign = subscription_body(f'{name}-x', address)
    foreign['metadata']['namespace'] = 'elsewhere'
    foreign['spec']['clusterRef']['namespace'] = 'default'
    await cluster.create('sharedsubscriptions', foreign)
    refused = await body_when(
        cluster, 'sharedsubscriptions', f'{name}-x',
        lambda b: 'conditions' in b.get('status', {}), 'seen', namespace='elsewhere',
    )  # fmt: skip
    assert condition(refused, 'ClusterAvailable')['reason'] == 'NamespaceNotAllowed'
    assert not rds.exists(definition_key(f'{name}-x'))
