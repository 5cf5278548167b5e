"""The broker honours subscriptions declared by SharedSubscription resources (store/registry.py):
Qpid JMS attaches join them, cannot change or unsubscribe them, and a declared non-durable one
outlives its consumers."""

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from amqpclient import Capabilities, connect, nothing_more, receive_all, sender
from jmswire import JmsSource, NullSource, collect, jms_connect, subscriber
from metricrecords import metric_records
from processes import BrokerProcess, RedisServer
from prometheus_client.parser import text_string_to_metric_families
from proton import Message

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.store.declarations import SubscriptionDeclaration
from shoal_broker.store.registry import Registry

TOPIC = Capabilities('topic')
SHARED_GLOBAL = ('shared', 'global', 'topic')


def declare(url: str, name: str, topic: str, *, durable: bool = True, selector: str | None = None,
            max_consumers: int | None = None) -> SubscriptionKey:  # fmt: skip
    key = SubscriptionKey(name, Scope.GLOBAL, '', durable)
    declaration = SubscriptionDeclaration(key, topic, selector, max_consumers, f'team/{name}', 1)

    async def run() -> None:
        async with Registry.from_url(url) as registry:
            await registry.declare_subscription(declaration, recreate=False)

    asyncio.run(run())
    return key


def declare_queue(url: str, queue: str, owner: str) -> None:
    async def run() -> None:
        async with Registry.from_url(url) as registry:
            await registry.declare_queue(queue, owner)

    asyncio.run(run())


def consumers(url: str, key: SubscriptionKey) -> int:
    async def run() -> int:
        async with Registry.from_url(url) as registry:
            return (await registry.subscription_state(key)).consumers

    return asyncio.run(run())


def definition(url: str, key: SubscriptionKey) -> dict[str, str]:
    async def run() -> dict[str, str]:
        async with Registry.from_url(url) as registry:
            return (await registry.subscription_state(key)).definition

    return asyncio.run(run())


@pytest.fixture
def name() -> str:
    return f'declared-{uuid.uuid4().hex[:8]}'


def publish(url: str, topic: str, bodies: list[object], **properties: object) -> None:
    conn = connect(url)
    snd = sender(conn, topic, TOPIC)
    for body in bodies:
        snd.send(Message(body=body, properties=dict(properties)))
    conn.close()


def test_a_declared_subscription_keeps_messages_until_jms_consumers_join_it_on_any_replica(
    broker: BrokerProcess, second_broker: BrokerProcess, redis_server: RedisServer, address: str,
    name: str,
) -> None:  # fmt: skip
    key = declare(redis_server.url, name, address)
    publish(broker.url, address, [0, 1, 2, 3])  # before any consumer: kept for the subscription
    first, second = jms_connect(broker.url), jms_connect(second_broker.url)
    source = JmsSource(*SHARED_GLOBAL, durable=True)
    a = subscriber(first, address, f'{name}|global', source)
    assert [m.body for m in receive_all(a, 4)] == [0, 1, 2, 3]
    b = subscriber(second, address, f'{name}|global2', source)  # the other replica joins it too
    assert consumers(redis_server.url, key) == 2
    publish(broker.url, address, list(range(4, 10)))
    got = collect([a, b], 6)
    assert sorted(got[0] + got[1]) == list(range(4, 10))  # each message to exactly one of them
    first.close()
    second.close()


def test_unsubscribing_a_declared_subscription_is_not_allowed(
    broker: BrokerProcess, redis_server: RedisServer, address: str, name: str
) -> None:
    key = declare(redis_server.url, name, address)
    conn = jms_connect(broker.url)
    lookup = conn.create_receiver(None, name=f'{name}|global', options=[NullSource()])
    assert lookup.link.remote_source.address == address
    lookup.close()  # detach(closed=true): JMS unsubscribe
    assert lookup.link.remote_condition.name == 'amqp:not-allowed'
    assert f'team/{name}' in lookup.link.remote_condition.description
    conn.close()
    assert definition(redis_server.url, key)['owner'] == f'team/{name}'


def test_an_attach_contradicting_the_declaration_is_refused_and_changes_nothing(
    broker: BrokerProcess, redis_server: RedisServer, address: str, name: str
) -> None:
    key = declare(redis_server.url, name, address, selector="region = 'EU'")
    conn = jms_connect(broker.url)
    with pytest.raises(Exception, match='amqp:resource-locked'):
        subscriber(conn, address, f'{name}|global',
                   JmsSource(*SHARED_GLOBAL, durable=True, selector="region = 'US'"))  # fmt: skip
    conn.close()
    assert definition(redis_server.url, key)['selector'] == "region = 'EU'"
    conn = jms_connect(broker.url)
    sub = subscriber(conn, address, f'{name}|global',
                     JmsSource(*SHARED_GLOBAL, durable=True, selector="region = 'EU'"))  # fmt: skip
    publish(broker.url, address, ['eu'], region='EU')
    assert [m.body for m in receive_all(sub, 1)] == ['eu']
    conn.close()


def test_a_declared_non_durable_subscription_outlives_its_last_consumer(
    broker: BrokerProcess, redis_server: RedisServer, address: str, name: str
) -> None:
    key = declare(redis_server.url, name, address, durable=False)
    source = JmsSource(*SHARED_GLOBAL)
    conn = jms_connect(broker.url)
    subscriber(conn, address, f'{name}|global-volatile1', source).close()
    conn.close()
    publish(broker.url, address, ['kept'])
    assert definition(redis_server.url, key)['durable'] == '0'
    conn = jms_connect(broker.url)
    sub = subscriber(conn, address, f'{name}|global-volatile1', source)
    assert [m.body for m in receive_all(sub, 1)] == ['kept']
    assert nothing_more(sub)
    conn.close()


def test_the_declared_consumer_limit_holds_across_replicas(
    broker: BrokerProcess, second_broker: BrokerProcess, redis_server: RedisServer, address: str,
    name: str,
) -> None:  # fmt: skip
    declare(redis_server.url, name, address, max_consumers=1)
    source = JmsSource(*SHARED_GLOBAL, durable=True)
    first, second = jms_connect(broker.url), jms_connect(second_broker.url)
    subscriber(first, address, f'{name}|global', source)
    with pytest.raises(Exception, match='amqp:resource-limit-exceeded'):
        subscriber(second, address, f'{name}|global2', source)
    first.close()
    second.close()


def test_metric_records_of_declared_entities_name_their_resource(
    start_broker: Callable[..., BrokerProcess], redis_server: RedisServer, address: str,
    name: str,
) -> None:  # fmt: skip
    b = start_broker(env={'SHOAL_METRICS_INTERVAL_SECONDS': '0.5'}, replica_id=f'rec-{name}')
    key = declare(redis_server.url, name, address)
    queue = f'{address}-q'

    declare_queue(redis_server.url, queue, 'team/orders')
    conn = jms_connect(b.url)
    sub = subscriber(conn, address, f'{name}|global', JmsSource(*SHARED_GLOBAL, durable=True))
    publish(b.url, address, [1])
    snd = sender(conn, queue)
    snd.send(Message(body='order'))
    assert [m.body for m in receive_all(sub, 1)] == [1]
    labels: dict[str, set[tuple[str, str]]] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not {key.id, 'queue'} <= set(labels):
        time.sleep(0.5)
        for record in metric_records(
            redis_server.url,
            lambda f: f.get('replica') == f'rec-{name}' and f.get('address') in (address, queue),
        ):
            labels.setdefault(record.subscription, set()).add((record.cr_namespace, record.cr_name))
    conn.close()
    producer_side = labels.pop('', {('', '')})  # the topic's own (publish) records: no resource
    assert producer_side == {('', '')}
    assert labels == {key.id: {('team', name)}, 'queue': {('team', 'orders')}}


def test_with_only_declared_subscriptions_an_undeclared_shared_one_is_not_allowed(
    start_broker: Callable[..., BrokerProcess], redis_server: RedisServer, address: str,
    name: str,
) -> None:  # fmt: skip
    b = start_broker(env={'SHOAL_DECLARED_SUBSCRIPTIONS_ONLY': 'true'})
    declare(redis_server.url, name, address)
    conn = jms_connect(b.url)
    shared = JmsSource(*SHARED_GLOBAL, durable=True)
    with pytest.raises(Exception, match='amqp:not-allowed'):
        subscriber(conn, address, f'{name}-undeclared|global', shared)
    conn.close()
    conn = jms_connect(b.url, f'client-{name}')
    subscriber(conn, address, f'{name}|global', shared)  # declared: joins
    subscriber(conn, address, f'{name}-exclusive', JmsSource('topic', durable=True))  # not shared
    conn.close()


def test_metrics_name_the_resource_declaring_a_queue_or_subscription(
    start_broker: Callable[..., BrokerProcess], redis_server: RedisServer, address: str,
    name: str,
) -> None:  # fmt: skip
    b = start_broker()
    key = declare(redis_server.url, name, address)
    queue = f'{address}-q'

    declare_queue(redis_server.url, queue, 'team/orders')
    wanted = {
        (address, key.id, 'team', name),
        (queue, 'queue', 'team', 'orders'),
    }
    found: set[tuple[str, ...]] = set()
    deadline = time.monotonic() + 30  # the backlog snapshot behind it refreshes every 10 s
    while time.monotonic() < deadline and not wanted <= found:
        time.sleep(0.5)
        status, body = b.http_get('/metrics')
        assert status == 200
        found = {
            (s.labels['address'], s.labels['subscription'], s.labels['cr_namespace'],
             s.labels['cr_name'])
            for family in text_string_to_metric_families(body.decode())
            if family.name == 'shoal_declared_info'
            for s in family.samples
            if s.value == 1
        }  # fmt: skip
    assert wanted <= found, found
