"""The operator carries Queue/SharedSubscription ``delivery{}`` and ``retention{}`` into the
cluster's Redis (kmock, a real Redis, a real broker): written on create, rewritten on update,
repaired when changed behind its back, and enforced by a broker."""

import json
import uuid
from typing import Any

import redis
from amqpclient import connect, send_with_outcome, sender
from kubeemulator import Kube, condition, subscription_body
from processes import BrokerProcess
from proton import Delivery, Message

from shoal_broker.store import keys


def policy_in(rds: redis.Redis, entity: str) -> dict[str, Any] | None:
    text = rds.hget(keys.POLICIES, entity)
    return json.loads(text) if text else None


async def eventually_policy(kube: Kube, rds: redis.Redis, entity: str, expected: Any,
                            what: str) -> None:  # fmt: skip
    async def probe() -> bool:
        return policy_in(rds, entity) == expected

    await kube.eventually(probe, what)


def ready_at(generation: int) -> Any:
    def check(body: dict[str, Any]) -> bool:
        return (body.get('status') or {}).get('observedGeneration') == generation and condition(
            body, 'Ready'
        ).get('status') == 'True'

    return check


async def body_when(kube: Kube, plural: str, name: str, check: Any, what: str) -> dict[str, Any]:
    async def probe() -> Any:
        body = await kube.get(plural, name)
        return body if body is not None and check(body) else None

    found: dict[str, Any] = await kube.eventually(probe, what)
    return found


async def test_a_subscription_policy_is_provisioned_updated_and_repaired(
    cluster: Kube, rds: redis.Redis, address: str
) -> None:
    name = f'pol-{uuid.uuid4().hex[:8]}'
    entity = keys.provisioned_subscription(f'durable:global:*:{name}')
    await cluster.create('sharedsubscriptions', subscription_body(
        name, address, delivery={'maxDeliveryAttempts': 2, 'deadLetterAddress': f'{name}-dla'},
        retention={'maxAgeSeconds': 600}))  # fmt: skip
    await body_when(cluster, 'sharedsubscriptions', name, ready_at(1), 'Ready')
    assert policy_in(rds, entity) == {
        'max_delivery_attempts': 2, 'dead_letter_address': f'{name}-dla',
        'max_age_seconds': 600, 'overflow': 'reject-publish',
    }  # fmt: skip
    fewer = {'maxDeliveryAttempts': 7, 'deadLetterAddress': None}  # merge patch: None removes
    await cluster.patch('sharedsubscriptions', name, {'spec': {'delivery': fewer}})
    await body_when(cluster, 'sharedsubscriptions', name, ready_at(2), 'generation 2 Ready')
    await eventually_policy(cluster, rds, entity, {
        'max_delivery_attempts': 7, 'max_age_seconds': 600, 'overflow': 'reject-publish',
    }, 'the updated policy')  # fmt: skip
    rds.hdel(keys.POLICIES, entity)  # drift: the periodic pass writes it again
    await eventually_policy(cluster, rds, entity, {
        'max_delivery_attempts': 7, 'max_age_seconds': 600, 'overflow': 'reject-publish',
    }, 'the policy repaired')  # fmt: skip


async def test_a_queue_policy_is_provisioned_and_enforced_by_a_broker(
    cluster: Kube, rds: redis.Redis, start_broker: Any, address: str
) -> None:
    body = {
        'kind': 'Queue',
        'metadata': {'name': f'q-{uuid.uuid4().hex[:8]}'},
        'spec': {'clusterRef': {'name': 'shoal'}, 'queueName': address, 'deletionPolicy': 'Delete',
                 'retention': {'maxMessages': 3, 'overflow': 'RejectPublish'}},
    }  # fmt: skip
    name = body['metadata']['name']
    await cluster.create('queues', body)
    await body_when(cluster, 'queues', name, ready_at(1), 'Ready')
    entity = keys.provisioned_queue(address)
    assert policy_in(rds, entity) == {'max_messages': 3, 'overflow': 'reject-publish'}
    b: BrokerProcess = start_broker()
    conn = connect(b.url)
    snd = sender(conn, address)
    outcomes = [send_with_outcome(conn, snd, Message(body=i)) for i in range(4)]
    assert [state for state, _ in outcomes] == [Delivery.ACCEPTED] * 3 + [Delivery.REJECTED]
    assert outcomes[3][1] == 'amqp:resource-limit-exceeded'
    conn.close()
    await cluster.delete('queues', name)

    async def removed() -> bool:
        return policy_in(rds, entity) is None and await cluster.get('queues', name) is None

    await cluster.eventually(removed, 'the queue and its policy removed')


async def _ready_queue(cluster: Kube, address: str, **spec: Any) -> str:
    """A Queue of ``address`` with ``spec`` (deletionPolicy Delete), created and Ready: its name."""
    name = f'q-{uuid.uuid4().hex[:8]}'
    await cluster.create('queues', {
        'kind': 'Queue', 'metadata': {'name': name},
        'spec': {'clusterRef': {'name': 'shoal'}, 'queueName': address,
                 'deletionPolicy': 'Delete', **spec},
    })  # fmt: skip
    await body_when(cluster, 'queues', name, ready_at(1), 'Ready')
    return name


async def test_a_queue_duplicate_detection_is_provisioned_and_enforced_by_a_broker(
    cluster: Kube, rds: redis.Redis, start_broker: Any, address: str
) -> None:
    name = await _ready_queue(
        cluster, address, duplicateDetection={'enabled': True, 'idProperty': '_AMQ_DUPL_ID'}
    )
    entity = keys.provisioned_queue(address)
    assert policy_in(rds, entity) == {
        'duplicate_detection': True, 'duplicate_id_property': '_AMQ_DUPL_ID',
        'overflow': 'reject-publish',
    }  # fmt: skip
    b: BrokerProcess = start_broker()  # SHOAL_DUPLICATE_DETECTION off: the queue turns it on
    conn = connect(b.url)
    snd = sender(conn, address)
    for body_text in ('first', 'again'):
        message = Message(body=body_text, properties={'_AMQ_DUPL_ID': 'order-1'})
        assert send_with_outcome(conn, snd, message) == (Delivery.ACCEPTED, None)
    assert rds.zcard(keys.AddressKeys.of(address).duplicates) == 1
    conn.close()
    await cluster.delete('queues', name)


async def test_a_subscription_duplicate_detection_names_its_topic(
    cluster: Kube, rds: redis.Redis, address: str
) -> None:
    name = f'dup-{uuid.uuid4().hex[:8]}'
    entity = keys.provisioned_subscription(f'durable:global:*:{name}')
    await cluster.create('sharedsubscriptions', subscription_body(
        name, address, duplicateDetection={'enabled': True, 'window': 50}))  # fmt: skip
    await body_when(cluster, 'sharedsubscriptions', name, ready_at(1), 'Ready')
    assert policy_in(rds, entity) == {
        'duplicate_detection': True, 'duplicate_window': 50, 'topic': address,
        'overflow': 'reject-publish',
    }  # fmt: skip


async def test_a_queue_last_value_is_provisioned_and_enforced_by_a_broker(
    cluster: Kube, rds: redis.Redis, start_broker: Any, address: str
) -> None:
    name = await _ready_queue(cluster, address, lastValue={'enabled': True, 'property': 'device'})
    entity = keys.provisioned_queue(address)
    assert policy_in(rds, entity) == {
        'last_value': True, 'last_value_property': 'device', 'overflow': 'reject-publish',
    }  # fmt: skip
    b: BrokerProcess = start_broker()  # no SHOAL_LAST_VALUE_ADDRESSES: the queue turns it on
    conn = connect(b.url)
    snd = sender(conn, address)
    for state in ('on', 'off'):
        message = Message(body=state, properties={'device': 'd-1'})
        assert send_with_outcome(conn, snd, message) == (Delivery.ACCEPTED, None)
    assert rds.xlen(keys.AddressKeys.of(address).streams[5]) == 1
    conn.close()
    await cluster.delete('queues', name)
