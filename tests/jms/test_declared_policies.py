"""A declared queue's or subscription's own delivery and retention policy (Queue/SharedSubscription
``delivery{}`` and ``retention{}``, filed by store/registry.py) overrides the broker-wide settings
for that entity only, on real brokers and a real Redis."""

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from amqpclient import (
    Capabilities,
    connect,
    nothing_more,
    receive_all,
    receiver,
    send_with_outcome,
    sender,
    settle,
)
from jmswire import JmsSource, jms_connect, subscriber
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.settings import Overflow
from shoal_broker.store.declarations import SubscriptionDeclaration
from shoal_broker.store.registry import Registry

TOPIC = Capabilities('topic')
DURABLE_SHARED = JmsSource('shared', 'global', 'topic', durable=True)
Start = Callable[..., BrokerProcess]


def declare_subscription(url: str, name: str, topic: str, policy: EntityPolicy) -> None:
    key = SubscriptionKey(name, Scope.GLOBAL, '', True)
    declaration = SubscriptionDeclaration(key, topic, None, None, f'team/{name}', 1, policy)

    async def run() -> None:
        async with Registry.from_url(url) as registry:
            await registry.declare_subscription(declaration, recreate=False)

    asyncio.run(run())


def declare_queue(url: str, address: str, policy: EntityPolicy) -> None:
    async def run() -> None:
        async with Registry.from_url(url) as registry:
            await registry.declare_queue(address, f'team/{address}', policy)

    asyncio.run(run())


@pytest.fixture
def name() -> str:
    return f'policy-{uuid.uuid4().hex[:8]}'


def test_a_declared_max_delivery_attempts_dead_letters_to_its_own_address_only(
    start_broker: Start, redis_server: RedisServer, address: str, name: str
) -> None:
    own_dla, global_dla = f'{address}-own-dla', f'{address}-global-dla'
    own = EntityPolicy(max_delivery_attempts=2, dead_letter_address=own_dla)
    declare_subscription(redis_server.url, name, address, own)
    b = start_broker(env={'SHOAL_MAX_DELIVERY_ATTEMPTS': '4',
                          'SHOAL_DEAD_LETTER_ADDRESS': global_dla})  # fmt: skip
    conn = jms_connect(b.url)
    declared = subscriber(conn, address, f'{name}|global', DURABLE_SHARED, credit=1)
    undeclared = subscriber(conn, address, f'{name}-other|global', DURABLE_SHARED, credit=1)
    plain = connect(b.url)
    sender(plain, address, TOPIC).send(Message(body='flaky'))
    for _ in range(2):
        for rcv in (declared, undeclared):
            assert rcv.receive(timeout=5).body == 'flaky'
            settle(rcv, Delivery.MODIFIED, failed=True)
    assert nothing_more(declared)
    dead = receiver(plain, own_dla, credit=1).receive(timeout=5)
    assert dead.body == 'flaky'
    assert dead.annotations['x-opt-shoal-reason'] == 'max delivery attempts (2)'
    # the undeclared subscription follows SHOAL_MAX_DELIVERY_ATTEMPTS=4: a third attempt
    again = undeclared.receive(timeout=5)
    assert (again.body, again.delivery_count) == ('flaky', 2)
    undeclared.accept()
    assert nothing_more(receiver(plain, global_dla, credit=1))
    conn.close()
    plain.close()


def test_max_age_expires_an_old_message_for_one_subscription_only(
    start_broker: Start, redis_server: RedisServer, address: str, name: str
) -> None:
    expired_to = f'{address}-expired'
    declare_subscription(redis_server.url, f'{name}-young', address,
                         EntityPolicy(max_age_seconds=1))  # fmt: skip
    declare_subscription(redis_server.url, f'{name}-any', address, EntityPolicy())
    b = start_broker(env={'SHOAL_EXPIRY_ADDRESS': expired_to})
    plain = connect(b.url)
    sender(plain, address, TOPIC).send(Message(body='old'))
    time.sleep(1.5)  # older than the declared maxAgeSeconds before anyone consumes it
    sender(plain, address, TOPIC).send(Message(body='new'))
    conn = jms_connect(b.url)
    young = subscriber(conn, address, f'{name}-young|global', DURABLE_SHARED)
    anything = subscriber(conn, address, f'{name}-any|global', DURABLE_SHARED)
    assert [m.body for m in receive_all(young, 1)] == ['new']
    assert nothing_more(young)
    assert [m.body for m in receive_all(anything, 2)] == ['old', 'new']
    expired = receiver(plain, expired_to, credit=5)
    moved = expired.receive(timeout=5)
    assert (moved.body, moved.annotations['x-opt-shoal-reason']) == ('old', 'expired')
    assert nothing_more(expired)
    conn.close()
    plain.close()


def test_a_declared_queue_refuses_publishes_past_its_max_messages(
    start_broker: Start, redis_server: RedisServer, address: str
) -> None:
    declare_queue(redis_server.url, address, EntityPolicy(max_messages=3))
    b = start_broker()
    conn = connect(b.url)
    snd = sender(conn, address)
    outcomes = [send_with_outcome(conn, snd, Message(body=i)) for i in range(4)]
    assert [state for state, _ in outcomes[:3]] == [Delivery.ACCEPTED] * 3
    assert outcomes[3] == (Delivery.REJECTED, 'amqp:resource-limit-exceeded')
    # another address on the same broker has no such limit
    other = sender(conn, f'{address}-other')
    assert all(send_with_outcome(conn, other, Message(body=i))[0] == Delivery.ACCEPTED
               for i in range(5))  # fmt: skip
    rcv = receiver(conn, address, credit=10)
    assert [m.body for m in receive_all(rcv, 3)] == [0, 1, 2]
    assert nothing_more(rcv)
    conn.close()


def test_a_declared_drop_oldest_queue_keeps_the_newest_messages(
    start_broker: Start, redis_server: RedisServer, address: str
) -> None:
    declare_queue(redis_server.url, address,
                  EntityPolicy(max_messages=3, overflow=Overflow.DROP_OLDEST))  # fmt: skip
    b = start_broker()
    conn = connect(b.url)
    snd = sender(conn, address)
    outcomes = [send_with_outcome(conn, snd, Message(body=i))[0] for i in range(5)]
    assert outcomes == [Delivery.ACCEPTED] * 5
    rcv = receiver(conn, address, credit=10)
    assert [m.body for m in receive_all(rcv, 3)] == [2, 3, 4]
    assert nothing_more(rcv)
    conn.close()


def test_a_policy_declared_later_reaches_a_running_replica(
    broker: BrokerProcess, redis_server: RedisServer, address: str, name: str
) -> None:
    """Replicas reread the policies every POLICY_REFRESH_SECONDS (2 s): no restart needed."""
    declare_subscription(redis_server.url, name, address, EntityPolicy())
    conn = jms_connect(broker.url)
    rcv = subscriber(conn, address, f'{name}|global', DURABLE_SHARED, credit=1)
    dla = f'{address}-dla'
    strict = EntityPolicy(max_delivery_attempts=1, dead_letter_address=dla)
    declare_subscription(redis_server.url, name, address, strict)
    plain = connect(broker.url)
    snd = sender(plain, address, TOPIC)
    sent = 0

    def dead_lettered() -> bool:
        """Publish one and fail it once: under the old policy it comes back (and is accepted),
        under the new one it goes to the DLA."""
        nonlocal sent
        snd.send(Message(body=sent))
        sent += 1
        rcv.receive(timeout=5)
        settle(rcv, Delivery.MODIFIED, failed=True)
        if nothing_more(rcv, wait=1.0):
            return True
        rcv.accept()
        return False

    wait_for(dead_lettered, 30, 'the declared policy on the running replica')
    dead = receiver(plain, dla, credit=1).receive(timeout=5)
    assert (dead.body, dead.annotations['x-opt-shoal-reason']) == (
        sent - 1,
        'max delivery attempts (1)',
    )
    conn.close()
    plain.close()
