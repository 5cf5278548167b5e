"""The store registry (provisioned queues and subscriptions) on a real redis-server."""

import dataclasses
import uuid
from collections.abc import AsyncIterator

import pytest
from processes import RedisServer

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey, SubscriptionSpec
from shoal_broker.routing.policies import NO_POLICY, EntityPolicy
from shoal_broker.routing.storage import QUEUE_GROUP, OutgoingMessage
from shoal_broker.settings import AddressKind, Overflow
from shoal_broker.store import keys
from shoal_broker.store.declarations import (
    EntityState,
    OnDeletion,
    ProvisionConflict,
    Provisioned,
    Removal,
    SubscriptionDeclaration,
)
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.registry import Registry


@pytest.fixture
async def registry(redis_server: RedisServer) -> AsyncIterator[Registry]:
    async with Registry.from_url(redis_server.url) as r:
        yield r


@pytest.fixture
def topic() -> str:
    return f'topic-{uuid.uuid4().hex[:10]}'


def declared(topic: str, *, selector: str | None = None, max_consumers: int | None = None,
             owner: str = 'ns/sub', generation: int = 1,
             policy: EntityPolicy = NO_POLICY) -> SubscriptionDeclaration:  # fmt: skip
    key = SubscriptionKey(f'sub-{topic}', Scope.GLOBAL, '', True)
    return SubscriptionDeclaration(key, topic, selector, max_consumers, owner, generation, policy)


def message(body: bytes) -> OutgoingMessage:
    return OutgoingMessage(band=0, header=b'', rest=body, expiry_ms=0)


async def test_declaring_is_idempotent_and_reports_what_changed(
    registry: Registry, topic: str
) -> None:
    first = declared(topic)
    assert await registry.declare_subscription(first, recreate=False) is Provisioned.CREATED
    assert await registry.declare_subscription(first, recreate=False) is Provisioned.UNCHANGED
    limited = declared(topic, max_consumers=3, generation=2)
    assert await registry.declare_subscription(limited, recreate=False) is Provisioned.UPDATED
    state = await registry.subscription_state(first.key)
    assert state.definition['max_consumers'] == '3'
    assert (await registry.declared())[keys.provisioned_subscription(first.key.id)] == 'ns/sub'


async def test_a_selector_change_needs_recreate_and_drops_the_backlog(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    await registry.declare_subscription(declared(topic, selector='a = 1'), recreate=False)
    await store.messages.publish(topic, AddressKind.TOPIC, message(b'old'))
    assert (await registry.subscription_state(declared(topic).key)).backlog == 1
    with pytest.raises(ProvisionConflict, match='selectorChangePolicy=Recreate'):
        await registry.declare_subscription(declared(topic, selector='a = 2'), recreate=False)
    changed = declared(topic, selector='a = 2')
    assert await registry.declare_subscription(changed, recreate=True) is Provisioned.RECREATED
    state = await registry.subscription_state(changed.key)
    assert (state.definition['selector'], state.backlog) == ('a = 2', 0)


async def test_an_app_created_subscription_is_adopted_and_another_owner_is_refused(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    key = declared(topic).key
    spec = SubscriptionSpec(key=key, shared=True, topic=topic)
    await store.registry.join_subscription(spec, 'replica|conn|link', 0)
    assert (
        await registry.declare_subscription(declared(topic), recreate=False) is Provisioned.ADOPTED
    )
    state = await registry.subscription_state(key)
    assert (state.consumers, state.consumer_replicas, state.owner) == (1, 1, 'ns/sub')
    with pytest.raises(ProvisionConflict, match='already declared by ns/sub'):
        await registry.declare_subscription(declared(topic, owner='other/sub'), recreate=False)


async def test_the_state_counts_deliveries_per_replica_from_their_metric_records(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    declaration = declared(topic)
    await registry.declare_subscription(declaration, recreate=False)
    key = declaration.key
    await store.registry.join_subscription(
        SubscriptionSpec(key=key, shared=True, topic=topic), 'c1', 0
    )

    def record(replica: str, delivered: int, subscription: str = key.id) -> dict[str, str]:
        fields = {'address': topic, 'subscription': subscription, 'replica': replica}
        return {**fields, 'delivered': str(delivered)}

    await store.upkeep.append_records(
        [record('replica-a', 30), record('replica-b', 10), record('replica-a', 5, 'private')],
        max_length=1000,
    )
    await store.upkeep.append_records(
        [record('replica-a', 7), record('replica-b', 0)], max_length=1000
    )
    state = await registry.subscription_state(key)
    assert state.delivered == {'replica-a': 37, 'replica-b': 10}
    assert list(state.consumers_per_replica.values()) == [1]  # this store's replica


async def test_removal_waits_for_consumers_and_if_asked_for_an_empty_backlog(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    declaration = declared(topic)
    key = declaration.key
    await registry.declare_subscription(declaration, recreate=False)
    await store.registry.join_subscription(
        SubscriptionSpec(key=key, shared=True, topic=topic), 'c1', 0
    )
    assert await registry.remove_subscription(key, 'ns/sub', delete=True) is Removal.IN_USE
    await store.registry.leave_subscription(key, 'c1')
    await store.messages.publish(topic, AddressKind.TOPIC, message(b'waiting'))
    state = await registry.subscription_state(key)
    assert state.backlog == 1
    assert state.oldest_age_seconds is not None
    assert await registry.remove_subscription(
        key, 'ns/sub', delete=True, only_if_empty=True
    ) is Removal.IN_USE  # fmt: skip
    assert await registry.remove_subscription(key, 'other/x', delete=True) is Removal.FOREIGN
    assert await registry.remove_subscription(key, 'ns/sub', delete=True) is Removal.DELETED
    assert not (await registry.subscription_state(key)).exists
    assert keys.provisioned_subscription(key.id) not in await registry.declared()
    assert await registry.remove_subscription(key, 'ns/sub', delete=True) is Removal.MISSING


async def test_a_released_subscription_stays_undeclared_and_may_be_unsubscribed(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    declaration = declared(topic)
    await registry.declare_subscription(declaration, recreate=False)
    assert await registry.remove_subscription(
        declaration.key, 'ns/sub', delete=False
    ) is Removal.RELEASED  # fmt: skip
    state = await registry.subscription_state(declaration.key)
    assert state.exists
    assert state.owner == ''
    await store.registry.unsubscribe(declaration.key, '')
    assert not (await registry.subscription_state(declaration.key)).exists


async def test_a_declared_queue_keeps_messages_and_is_removed_only_when_empty_if_asked(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    queue = f'q-{topic}'
    assert await registry.declare_queue(queue, 'ns/q') is Provisioned.CREATED
    assert await registry.declare_queue(queue, 'ns/q') is Provisioned.UNCHANGED
    with pytest.raises(ProvisionConflict, match='already declared by ns/q'):
        await registry.declare_queue(queue, 'other/q')
    await store.messages.publish(queue, AddressKind.QUEUE, message(b'kept'))
    state = await registry.queue_state(queue)
    assert (state.exists, state.backlog, state.ready) == (True, 1, 1)
    assert await registry.remove_queue(queue, 'ns/q', delete=True, only_if_empty=True) is (
        Removal.IN_USE)  # fmt: skip
    [entry] = await store.messages.fetch(queue, QUEUE_GROUP, 10)
    await store.messages.ack(queue, QUEUE_GROUP, entry)
    await store.flush()
    assert await registry.remove_queue(queue, 'ns/q', delete=True, only_if_empty=True) is (
        Removal.DELETED)  # fmt: skip
    assert not (await registry.queue_state(queue)).exists


async def test_an_address_of_the_other_kind_is_a_conflict(registry: Registry, topic: str) -> None:
    await registry.declare_subscription(declared(topic), recreate=False)
    with pytest.raises(ProvisionConflict, match='exists as a topic'):
        await registry.declare_queue(topic, 'ns/q')


async def test_a_subscription_policy_is_written_updated_read_by_replicas_and_removed(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    policy = EntityPolicy(max_delivery_attempts=2, dead_letter_address='audit-dla',
                          max_age_seconds=60)  # fmt: skip
    first = declared(topic, policy=policy)
    assert await registry.declare_subscription(first, recreate=False) is Provisioned.CREATED
    assert (await registry.subscription_state(first.key)).policy == policy
    entity = keys.provisioned_subscription(first.key.id)
    assert (await store.registry.policies())[entity] == policy  # what every replica reads
    assert await registry.declare_subscription(first, recreate=False) is Provisioned.UNCHANGED
    changed = declared(topic, policy=EntityPolicy(max_delivery_attempts=5), generation=2)
    assert await registry.declare_subscription(changed, recreate=False) is Provisioned.UPDATED
    assert (await store.registry.policies())[entity] == EntityPolicy(max_delivery_attempts=5)
    cleared = declared(topic, generation=3)
    assert await registry.declare_subscription(cleared, recreate=False) is Provisioned.UPDATED
    assert entity not in await store.registry.policies()
    await registry.declare_subscription(changed, recreate=False)
    assert await registry.remove_subscription(first.key, 'ns/sub', delete=True) is Removal.DELETED
    assert entity not in await store.registry.policies()


async def test_a_queue_policy_is_written_updated_and_released_with_the_queue(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    address = f'q-{topic}'
    limited = EntityPolicy(max_messages=3, overflow=Overflow.DROP_OLDEST, max_age_seconds=10)
    assert await registry.declare_queue(address, 'ns/q', limited) is Provisioned.CREATED
    assert (await registry.queue_state(address)).policy == limited
    entity = keys.provisioned_queue(address)
    assert (await store.registry.policies())[entity] == limited
    assert await registry.declare_queue(address, 'ns/q', limited) is Provisioned.UNCHANGED
    assert await registry.declare_queue(address, 'ns/q') is Provisioned.UPDATED
    assert (await registry.queue_state(address)).policy == NO_POLICY
    await registry.declare_queue(address, 'ns/q', limited)
    assert await registry.remove_queue(address, 'ns/q', delete=False) is Removal.RELEASED
    assert entity not in await store.registry.policies()


async def test_an_unreadable_policy_is_left_out_rather_than_misapplied(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    address = f'q-{topic}'
    await registry.declare_queue(address, 'ns/q', EntityPolicy(max_messages=3))
    entity = keys.provisioned_queue(address)
    await store.client.hset(keys.POLICIES, entity, '{"max_messages": 3, "overflow": "Sideways"}')
    assert entity not in await store.registry.policies()
    assert (await registry.queue_state(address)).policy == NO_POLICY
    await registry.remove_queue(address, 'ns/q', delete=True)


async def test_the_deletion_policy_is_filed_with_the_declaration_and_goes_with_it(
    registry: Registry, topic: str
) -> None:
    """What a resource deleted while no operator runs asks for is in Redis with its declaration:
    filed when declared (a change is an update), gone once the declaration is; one filed by
    another owner's refused declaration is not replaced."""
    address = f'q-{topic}'
    queue = keys.provisioned_queue(address)
    assert await registry.declare_queue(address, 'ns/q', on_deletion=OnDeletion.DELETE) is (
        Provisioned.CREATED
    )
    sub = dataclasses.replace(declared(topic), on_deletion=OnDeletion.DELETE_IF_EMPTY)
    assert await registry.declare_subscription(sub, recreate=False) is Provisioned.CREATED
    subscription = keys.provisioned_subscription(sub.key.id)
    filed = await registry.on_deletion()
    assert (filed[queue], filed[subscription]) == (OnDeletion.DELETE, OnDeletion.DELETE_IF_EMPTY)
    assert await registry.declare_queue(address, 'ns/q') is Provisioned.UPDATED  # now Retain
    assert (await registry.on_deletion())[queue] is OnDeletion.RETAIN
    with pytest.raises(ProvisionConflict):
        await registry.declare_queue(address, 'ns/other', on_deletion=OnDeletion.DELETE)
    assert (await registry.on_deletion())[queue] is OnDeletion.RETAIN
    assert await registry.remove_queue(address, 'ns/q', delete=False) is Removal.RELEASED
    assert await registry.remove_subscription(sub.key, 'ns/sub', delete=True) is Removal.DELETED
    assert not (await registry.on_deletion()).keys() & {queue, subscription}


async def test_the_batched_states_are_the_one_by_one_states(
    registry: Registry, store: RedisStore, topic: str
) -> None:
    """``states`` (the operator's pass) answers what ``queue_state`` and ``subscription_state``
    answer one by one: backlog, owner, policy, consumers, deliveries, oldest message; and
    ``exists=False`` for what Redis does not hold."""
    policy = EntityPolicy(max_delivery_attempts=3)
    declaration = declared(topic, policy=policy)
    await registry.declare_subscription(declaration, recreate=False)
    await store.registry.join_subscription(
        SubscriptionSpec(key=declaration.key, shared=True, topic=topic), 'c1', 0
    )
    await store.messages.publish(topic, AddressKind.TOPIC, message(b'waits'))
    queues = [f'{topic}-q{i}' for i in range(3)]
    for i, queue in enumerate(queues[:2]):
        await registry.declare_queue(queue, f'ns/q{i}', policy)
    await store.messages.publish(queues[0], AddressKind.QUEUE, message(b'one'))
    await store.messages.publish(queues[0], AddressKind.QUEUE, message(b'two'))
    missing = SubscriptionKey(f'none-{topic}', Scope.GLOBAL, '', True)
    found_queues, found_subs = await registry.states(queues, [declaration.key, missing])

    def same(a: EntityState, b: EntityState) -> bool:
        age = dataclasses.replace(a, oldest_age_seconds=None)
        if (a.oldest_age_seconds is None) != (b.oldest_age_seconds is None):
            return False
        close = (
            a.oldest_age_seconds is None
            or abs(a.oldest_age_seconds - (b.oldest_age_seconds or 0)) < 2
        )
        return close and age == dataclasses.replace(b, oldest_age_seconds=None)

    for queue in queues:
        assert same(found_queues[queue], await registry.queue_state(queue)), queue
    assert found_queues[queues[0]].backlog == 2
    assert found_queues[queues[0]].policy == policy
    assert not found_queues[queues[2]].exists
    assert same(found_subs[declaration.key.id], await registry.subscription_state(declaration.key))
    assert (found_subs[declaration.key.id].consumers, found_subs[declaration.key.id].backlog) == (
        1,
        1,
    )
    assert not found_subs[missing.id].exists
