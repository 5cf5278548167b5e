"""
jms-amqp-facts §11 scenarios 13-29 at the AMQP level, with the link names, capabilities, terminus
values and filters Qpid JMS sends; consumers are split over the two replicas wherever a scenario
has more than one consumer or a reconnect. Ends with the acceptance run: one shared durable
subscription, two consumers on each replica, 20 000 messages, exactly once and fairly shared.

Scenarios 16 (createDurableConsumer without a ClientID) and 20 (unsubscribe of a subscription
active on the same connection) fail inside the client before any frame is sent: the broker is
not involved, so there is nothing to test here.
"""

import time
from collections.abc import Callable, Iterator

import pytest
from amqpclient import Capabilities, connect, nothing_more, sender
from jmswire import (
    JMS_DESIRED,
    JmsSource,
    NullSource,
    StoredSubscriptions,
    attach_answer,
    client_id,
    collect,
    consumer_link_name,
    durable_detach,
    jms_connect,
    subscriber,
    take,
)
from loadclient import ConsumerSpec, MultiRun, ProducerSpec
from processes import BrokerProcess, RedisServer
from proton import Message

TOPIC = Capabilities('topic')
SHARED_DURABLE_GLOBAL = JmsSource('topic', 'shared', 'global', durable=True)
SHARED_VOLATILE_GLOBAL = JmsSource('topic', 'shared', 'global')


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[StoredSubscriptions]:
    s = StoredSubscriptions(redis_server.url)
    yield s
    s.close()


def publish(url: str, topic: str, bodies: list[object] | range, **properties: object) -> None:
    conn = connect(url)
    snd = sender(conn, topic, TOPIC)
    for body in bodies:
        snd.send(Message(body=body, properties=dict(properties) or None))
    conn.close()


def unique(prefix: str) -> str:
    return client_id(prefix)  # a global subscription name no other test uses


# -- topics and non-durable subscriptions ---------------------------------------------------------


def test_13_fan_out_reaches_every_subscriber_attached_and_retains_nothing_after_they_close(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    publish(broker.url, address, ['before anyone subscribed'])
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    on_a = subscriber(a, address, consumer_link_name(address), JmsSource('topic'))
    on_b = subscriber(b, address, consumer_link_name(address), JmsSource('topic'))
    groups = sorted(store.groups(address))
    assert [g.split(':')[:2] for g in groups] == [['nd', 'replica-a'], ['nd', 'replica-b']]
    publish(second_broker.url, address, ['m1'])
    assert take(on_a, 1) == ['m1']
    assert take(on_b, 1) == ['m1']
    assert nothing_more(on_a)
    assert nothing_more(on_b)
    on_a.close()
    on_b.close()
    store.eventually(lambda: store.groups(address) == {}, msg='both private groups deleted')
    publish(broker.url, address, ['after both closed'])  # accepted (a refusal would raise)
    assert store.groups(address) == {}  # kept for nobody
    late = subscriber(a, address, consumer_link_name(address), JmsSource('topic'))
    assert nothing_more(late)
    a.close()
    b.close()


def test_14_no_local_drops_only_what_the_subscribers_own_connection_published(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    a = jms_connect(broker.url)
    sub = subscriber(a, address, consumer_link_name(address), JmsSource('topic', no_local=True))
    sender(a, address, TOPIC).send(Message(body='m1 from A'))
    b = jms_connect(second_broker.url)
    sender(b, address, TOPIC).send(Message(body='m2 from B'))
    assert take(sub, 1) == ['m2 from B']
    assert nothing_more(sub)
    (group,) = store.groups(address).values()
    assert group['pending'] == 0  # m1 was consumed unseen, not left in flight
    a.close()
    b.close()


def _inactive_durable(url: str, cid: str, address: str, source: JmsSource) -> None:
    """Create the exclusive durable subscription 'sub' for ClientID ``cid``, then leave it."""
    conn = jms_connect(url, cid)
    durable_detach(subscriber(conn, address, 'sub', source))
    conn.close()


# -- exclusive durable subscriptions --------------------------------------------------------------


def test_15_an_exclusive_durable_subscription_survives_detach_and_reconnect(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    cid = client_id('s15')
    sub_id = store.sub_id(True, 'client', cid, 'sub')
    _inactive_durable(broker.url, cid, address, JmsSource('topic', durable=True))
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumer left')
    publish(second_broker.url, address, range(3))
    conn = jms_connect(second_broker.url, cid)  # reconnect with C, on the other replica
    sub = subscriber(conn, address, 'sub', JmsSource('topic', durable=True))
    assert take(sub, 3) == [0, 1, 2]
    assert nothing_more(sub)
    assert list(store.consumers(sub_id).values()) == ['replica-b']
    conn.close()


# Scenario 16 (createDurableConsumer without a ClientID) is refused inside the client: no frames.


def test_17_a_changed_selector_replaces_an_inactive_subscription_and_its_backlog(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    cid = client_id('s17')
    sub_id = store.sub_id(True, 'client', cid, 'sub')
    conn = jms_connect(broker.url, cid)
    durable_detach(subscriber(conn, address, 'sub', JmsSource('topic', durable=True,
                                                              selector='a = 1')))  # fmt: skip
    conn.close()
    publish(second_broker.url, address, ['old 1', 'old 2'], a=1)  # the inactive sub's backlog
    assert store.groups(address)[sub_id]['lag'] == 2
    conn = jms_connect(second_broker.url, cid)
    sub = subscriber(conn, address, 'sub', JmsSource('topic', durable=True, selector='a = 2'))
    assert nothing_more(sub)  # the old backlog went with the old definition
    assert store.definition(sub_id)['selector'] == 'a = 2'
    publish(broker.url, address, ['new 1'], a=1)
    publish(broker.url, address, ['new 2'], a=2)
    assert take(sub, 1) == ['new 2']
    assert nothing_more(sub)
    conn.close()


def test_18_unsubscribe_of_an_inactive_subscription_deletes_it_and_its_backlog(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    cid = client_id('s18')
    sub_id = store.sub_id(True, 'client', cid, 'sub')
    _inactive_durable(broker.url, cid, address, JmsSource('topic', durable=True))
    publish(broker.url, address, ['backlog 1', 'backlog 2'])
    conn = jms_connect(second_broker.url, cid)
    lookup = conn.create_receiver(None, name='sub', options=[NullSource()])
    assert lookup.link.remote_source.address == address  # found: a non-null source
    lookup.close()  # detach(closed=true): the delete request
    assert lookup.link.remote_condition is None
    assert store.definition(sub_id) == {}
    store.eventually(lambda: sub_id not in store.groups(address), msg='its group deleted')
    sub = subscriber(conn, address, 'sub', JmsSource('topic', durable=True))
    assert nothing_more(sub)  # a new, empty subscription
    assert store.definition(sub_id)['durable'] == '1'
    conn.close()


def test_19_unsubscribe_of_a_missing_subscription_is_not_found(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions
) -> None:
    name = unique('s19')
    with_cid = jms_connect(broker.url, client_id('s19'))
    answer = attach_answer(with_cid, None, name, NullSource())
    assert (answer.source_null, answer.closed, answer.condition) == (True, True, 'amqp:not-found')
    with_cid.close()
    no_cid = jms_connect(second_broker.url)
    answer = attach_answer(no_cid, None, f'{name}|global', NullSource())
    assert (answer.source_null, answer.closed, answer.condition) == (True, True, 'amqp:not-found')
    no_cid.close()
    assert store.ids_named(name) == set()  # a lookup creates nothing


# Scenario 20 (unsubscribe while active on the same connection) fails inside the client.


# -- shared durable subscriptions -----------------------------------------------------------------


def test_21_a_global_shared_durable_subscription_is_shared_across_connections_and_replicas(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    name = unique('s21')
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    on_a = subscriber(a, address, f'{name}|global', SHARED_DURABLE_GLOBAL, credit=1)  # P1
    on_b = subscriber(b, address, f'{name}|global', SHARED_DURABLE_GLOBAL, credit=1)
    sub_id = store.sub_id(True, 'global', '*', name)
    assert sorted(store.consumers(sub_id).values()) == ['replica-a', 'replica-b']
    publish(broker.url, address, range(10))
    got_a, got_b = collect([on_a, on_b], 10)
    assert sorted(got_a + got_b) == list(range(10))  # each exactly once across the two
    assert got_a
    assert got_b
    assert nothing_more(on_a)
    assert nothing_more(on_b)
    a.close()
    b.close()


@pytest.mark.parametrize('with_client_id', [True, False], ids=['cid', 'no-cid'])
def test_22_two_consumers_on_one_connection_share_one_subscription_and_its_backlog(
    broker: BrokerProcess,
    second_broker: BrokerProcess,
    store: StoredSubscriptions,
    address: str,
    with_client_id: bool,
) -> None:
    if with_client_id:
        cid = client_id('s22')
        conn = jms_connect(broker.url, cid)
        source = JmsSource('topic', 'shared', durable=True)
        name, links, sub_id = 's', ('s', 's|2'), store.sub_id(True, 'client', cid, 's')
    else:
        conn = jms_connect(broker.url)
        source = SHARED_DURABLE_GLOBAL
        name = unique('s22')
        links = (f'{name}|global', f'{name}|global2')
        sub_id = store.sub_id(True, 'global', '*', name)
    durable_detach(subscriber(conn, address, links[0], source))  # make it, leave a backlog
    publish(second_broker.url, address, range(40))
    one = subscriber(conn, address, links[0], source, credit=1)
    two = subscriber(conn, address, links[1], source, credit=1)
    assert len(store.consumers(sub_id)) == 2
    assert sub_id in store.ids_named(name)
    assert set(store.groups(address)) == {sub_id}  # one subscription, not one per link
    got_one, got_two = collect([one, two], 40)
    assert sorted(got_one + got_two) == list(range(40))
    assert got_one
    assert got_two
    conn.close()


def test_23_a_shared_durable_backlog_survives_its_last_consumer(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    name = unique('s23')
    sub_id = store.sub_id(True, 'global', '*', name)
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    durable_detach(subscriber(a, address, f'{name}|global', SHARED_DURABLE_GLOBAL))
    subscriber(b, address, f'{name}|global', SHARED_DURABLE_GLOBAL)
    b.close()  # Connection.close(): no per-link detach, counts as detach without close
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='both consumers left')
    publish(second_broker.url, address, range(5))
    fresh = subscriber(a, address, f'{name}|global', SHARED_DURABLE_GLOBAL)
    assert take(fresh, 5) == [0, 1, 2, 3, 4]
    assert nothing_more(fresh)
    a.close()


def test_23_the_backlog_of_an_inactive_subscription_survives_trimming(
    broker: BrokerProcess,
    second_broker: BrokerProcess,
    start_broker: Callable[..., BrokerProcess],
    store: StoredSubscriptions,
    address: str,
) -> None:
    """While nobody consumes the shared durable subscription, a plain subscriber on the same
    topic consumes everything and a replica trims the stream every 0.1 s."""
    # the smallest replica id: the live replica that sorts first trims for all
    trimming = start_broker(env={'SHOAL_TRIM_INTERVAL_SECONDS': '0.1'}, replica_id='0-trimming')
    name = unique('s23t')
    a = jms_connect(broker.url)
    durable_detach(subscriber(a, address, f'{name}|global', SHARED_DURABLE_GLOBAL))
    plain = subscriber(a, address, consumer_link_name(address), JmsSource('topic'))
    control = f'{address}-control'  # only a plain subscriber: consumed entries are trimmed
    control_sub = subscriber(a, control, consumer_link_name(control), JmsSource('topic'))
    publish(second_broker.url, address, range(5))
    publish(second_broker.url, control, range(5))
    assert take(plain, 5) == [0, 1, 2, 3, 4]
    assert take(control_sub, 5) == [0, 1, 2, 3, 4]
    store.eventually(lambda: store.redis.xlen(f'shoal:{{a:{control}}}:p:5') == 0, msg='trim')
    time.sleep(0.3)  # a few more trims
    b = jms_connect(trimming.url)
    fresh = subscriber(b, address, f'{name}|global', SHARED_DURABLE_GLOBAL)
    assert take(fresh, 5, timeout=3) == [0, 1, 2, 3, 4]
    a.close()
    b.close()


def test_24_a_client_id_scoped_and_a_global_subscription_of_one_name_are_different(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    name = unique('s24')
    cid = client_id('s24')
    scoped = jms_connect(broker.url, cid)
    on_scoped = subscriber(scoped, address, name, JmsSource('topic', 'shared', durable=True))
    unscoped = jms_connect(second_broker.url)
    on_global = subscriber(unscoped, address, f'{name}|global', SHARED_DURABLE_GLOBAL)
    ids = {store.sub_id(True, 'client', cid, name), store.sub_id(True, 'global', '*', name)}
    assert store.ids_named(name) == ids
    assert set(store.groups(address)) == ids
    publish(broker.url, address, ['m'])
    assert take(on_scoped, 1) == ['m']
    assert take(on_global, 1) == ['m']
    assert nothing_more(on_scoped)
    assert nothing_more(on_global)
    scoped.close()
    unscoped.close()


def test_25_a_selector_mismatch_is_refused_while_active_elsewhere_then_replaces_it(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    name = unique('s25')
    link = f'{name}|global'
    sub_id = store.sub_id(True, 'global', '*', name)
    x1 = JmsSource('topic', 'shared', 'global', durable=True, selector='x = 1')
    x2 = JmsSource('topic', 'shared', 'global', durable=True, selector='x = 2')
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    on_a = subscriber(a, address, link, x1)
    answer = attach_answer(b, address, link, x2)
    assert answer.source_null
    assert answer.condition in ('amqp:resource-locked', 'amqp:illegal-state'), answer
    assert store.definition(sub_id)['selector'] == 'x = 1'  # untouched
    publish(second_broker.url, address, ['for A'], x=1)
    assert take(on_a, 1) == ['for A']
    durable_detach(on_a)  # A closes (detach closed=false, answered)
    publish(second_broker.url, address, ['stale'], x=2)  # kept by the old subscription only
    on_b = subscriber(b, address, link, x2)  # now it succeeds, and replaces the subscription
    assert store.definition(sub_id)['selector'] == 'x = 2'
    assert list(store.consumers(sub_id).values()) == ['replica-b']
    assert nothing_more(on_b)  # the old subscription's messages went with it
    publish(broker.url, address, ['no'], x=1)
    publish(broker.url, address, ['yes'], x=2)
    assert take(on_b, 1) == ['yes']
    assert nothing_more(on_b)
    a.close()
    b.close()


def test_26_unsubscribe_of_a_global_subscription_is_refused_while_active_elsewhere(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    name = unique('s26')
    link = f'{name}|global'
    sub_id = store.sub_id(True, 'global', '*', name)
    a = jms_connect(second_broker.url)
    on_a = subscriber(a, address, link, SHARED_DURABLE_GLOBAL)
    b = jms_connect(broker.url)
    lookup = b.create_receiver(None, name=link, options=[NullSource()])
    assert lookup.link.remote_source.address == address
    lookup.close()
    assert lookup.link.remote_condition is not None
    assert lookup.link.remote_condition.name == 'amqp:resource-locked'
    assert list(store.consumers(sub_id).values()) == ['replica-b']  # it stays, A stays
    publish(broker.url, address, ['still subscribed'])
    assert take(on_a, 1) == ['still subscribed']
    durable_detach(on_a)  # A closes (detach closed=false, answered)
    lookup = b.create_receiver(None, name=link, options=[NullSource()])
    lookup.close()
    assert lookup.link.remote_condition is None  # deleted
    assert store.definition(sub_id) == {}
    store.eventually(lambda: sub_id not in store.groups(address), msg='its group deleted')
    a.close()
    b.close()


def test_27_exclusive_and_shared_durable_of_one_name_share_a_namespace_consistently(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Inactive, the subscription is reused whichever kind asks (keeping its backlog); active,
    the other kind is refused whichever it is."""
    cid = client_id('s27')
    sub_id = store.sub_id(True, 'client', cid, 's')
    exclusive = JmsSource('topic', durable=True)
    shared = JmsSource('topic', 'shared', durable=True)
    conn = jms_connect(broker.url, cid)
    active = subscriber(conn, address, 's', exclusive)
    clash = jms_connect(second_broker.url, cid, sole=False)  # the same namespace, elsewhere
    answer = attach_answer(clash, address, 's', shared)
    assert (answer.source_null, answer.condition) == (True, 'amqp:resource-locked')
    clash.close()
    durable_detach(active)
    conn.close()
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumer left')
    publish(broker.url, address, ['b0', 'b1'])
    conn = jms_connect(second_broker.url, cid)  # restarted: shared now, s inactive
    as_shared = subscriber(conn, address, 's', shared)
    assert store.definition(sub_id)['shared'] == '1'
    assert take(as_shared, 2) == ['b0', 'b1']
    clash = jms_connect(broker.url, cid, sole=False)
    answer = attach_answer(clash, address, 's', exclusive)
    assert (answer.source_null, answer.condition) == (True, 'amqp:resource-locked')
    clash.close()
    durable_detach(as_shared)
    conn.close()
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumer left')
    publish(second_broker.url, address, ['b2'])
    conn = jms_connect(broker.url, cid)  # restarted again: exclusive, s inactive
    as_exclusive = subscriber(conn, address, 's', exclusive)
    assert store.definition(sub_id)['shared'] == '0'
    assert take(as_exclusive, 1) == ['b2']
    assert nothing_more(as_exclusive)
    conn.close()


# -- shared non-durable subscriptions -------------------------------------------------------------


def test_28_a_shared_volatile_subscription_is_shared_then_goes_with_its_last_consumer(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    name = unique('s28')
    link = f'{name}|global-volatile1'
    sub_id = store.sub_id(False, 'global', '*', name)
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    on_a = subscriber(a, address, link, SHARED_VOLATILE_GLOBAL, credit=1)
    on_b = subscriber(b, address, link, SHARED_VOLATILE_GLOBAL, credit=1)
    publish(broker.url, address, range(10))
    got_a, got_b = collect([on_a, on_b], 10)
    assert sorted(got_a + got_b) == list(range(10))  # shared: 10 in all, not 10 each
    assert nothing_more(on_a)
    assert nothing_more(on_b)
    on_a.close()
    on_b.close()  # link close of the last consumer: the subscription and its messages go
    store.eventually(lambda: store.definition(sub_id) == {}, msg='subscription deleted')
    store.eventually(lambda: store.groups(address) == {}, msg='its group deleted')
    publish(second_broker.url, address, ['x', 'y', 'z'])
    fresh = subscriber(a, address, link, SHARED_VOLATILE_GLOBAL)
    assert nothing_more(fresh)  # 0 received
    assert set(store.groups(address)) == {sub_id}
    a.close()  # connection.close() alone, no link detach, also removes it
    store.eventually(lambda: store.definition(sub_id) == {}, msg='subscription deleted')
    store.eventually(lambda: store.groups(address) == {}, msg='its group deleted')
    assert not store.indexed(sub_id)
    b.close()


@pytest.mark.parametrize('with_client_id', [True, False], ids=['cid', 'no-cid'])
def test_29_volatile_and_durable_shared_subscriptions_of_one_name_coexist(
    broker: BrokerProcess,
    second_broker: BrokerProcess,
    store: StoredSubscriptions,
    address: str,
    with_client_id: bool,
) -> None:
    name = unique('s29')
    if with_client_id:
        cid = client_id('s29')
        conn = jms_connect(broker.url, cid)
        volatile = subscriber(conn, address, f'{name}|volatile1', JmsSource('topic', 'shared'))
        durable = subscriber(conn, address, name, JmsSource('topic', 'shared', durable=True))
        scope, owner = 'client', cid
    else:
        conn = jms_connect(broker.url)
        volatile = subscriber(conn, address, f'{name}|global-volatile1', SHARED_VOLATILE_GLOBAL)
        durable = subscriber(conn, address, f'{name}|global', SHARED_DURABLE_GLOBAL)
        scope, owner = 'global', '*'
    ids = {store.sub_id(False, scope, owner, name), store.sub_id(True, scope, owner, name)}
    assert store.ids_named(name) == ids
    assert set(store.groups(address)) == ids
    publish(second_broker.url, address, range(3))
    assert take(volatile, 3) == [0, 1, 2]
    assert take(durable, 3) == [0, 1, 2]
    assert nothing_more(volatile)
    assert nothing_more(durable)
    conn.close()


# -- acceptance -----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_acceptance_shared_durable_subscription_2_replicas_x_2_consumers_exactly_once_and_fair(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    per_producer = 10_000
    urls = (broker.url, broker.url, second_broker.url, second_broker.url)
    link, options = 'fair|global', [SHARED_DURABLE_GLOBAL]
    consumers = [
        ConsumerSpec(url, address, link, options, credit=10, desired_capabilities=JMS_DESIRED)
        for url in urls
    ]
    producers = [
        ProducerSpec(broker.url, address, per_producer, [TOPIC]),
        ProducerSpec(second_broker.url, address, per_producer, [TOPIC]),
    ]
    run = MultiRun(producers, consumers, timeout=120).run()
    assert run.errors == []
    assert not run.timed_out, (run.sent, run.confirmed, [len(r) for r in run.received])
    assert run.confirmed == 2 * per_producer
    assert run.not_accepted == 0
    everything = [body for got in run.received for body in got]
    expected = {f'{p}:{n}' for p in range(2) for n in range(per_producer)}
    assert len(everything) == len(expected)  # no duplicates ...
    assert set(everything) == expected  # ... and nothing lost
    counts = [len(got) for got in run.received]
    assert min(counts) > 0, counts
    assert max(counts) / min(counts) <= 1.5, counts
    sub_id = store.sub_id(True, 'global', '*', 'fair')
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='all four consumers left')
    assert store.definition(sub_id)['topic'] == address  # durable: kept after they left
