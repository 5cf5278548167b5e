"""JMS 2.0 subscriptions across two replicas, driven with the attaches Qpid JMS sends."""

import pytest
from amqpclient import Capabilities, connect, nothing_more, receive_all, sender
from jmswire import JmsSource, NullSource, durable_detach, jms_connect, subscriber
from processes import BrokerProcess
from proton import Message

TOPIC = Capabilities('topic')


def publish(url: str, topic: str, bodies: range | list[object]) -> None:
    conn = connect(url)
    snd = sender(conn, topic, TOPIC)
    for body in bodies:
        snd.send(Message(body=body))
    conn.close()


def test_an_exclusive_durable_subscription_keeps_its_backlog_across_detach_and_reconnect(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    conn = jms_connect(broker.url, 'client-a')
    sub = subscriber(conn, address, 'orders', JmsSource('topic', durable=True))
    publish(broker.url, address, range(3))
    assert [m.body for m in receive_all(sub, 3)] == [0, 1, 2]
    durable_detach(sub)
    conn.close()
    publish(second_broker.url, address, range(3, 8))  # nobody attached: kept for 'orders'
    conn = jms_connect(second_broker.url, 'client-a')  # reconnect, on the other replica
    sub = subscriber(conn, address, 'orders', JmsSource('topic', durable=True), credit=20)
    assert [m.body for m in receive_all(sub, 5)] == [3, 4, 5, 6, 7]
    assert nothing_more(sub)
    conn.close()


def test_an_exclusive_durable_subscription_has_one_active_consumer_cluster_wide(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    first = jms_connect(broker.url, 'client-x1')
    subscriber(first, address, 'audit', JmsSource('topic', durable=True))
    # Qpid JMS cannot open a second connection with this ClientID; a client that does not ask
    # for sole-connection-for-container can, and must still not get a second active consumer
    other = jms_connect(second_broker.url, 'client-x1', sole=False)
    with pytest.raises(Exception, match='amqp:resource-locked'):
        subscriber(other, address, 'audit', JmsSource('topic', durable=True))
    other.close()
    first.close()


def test_shared_durable_consumers_on_two_replicas_split_the_messages(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    a = jms_connect(broker.url)
    b = jms_connect(second_broker.url)
    source = JmsSource('topic', 'shared', 'global', durable=True)
    # A replica fetches up to its consumers' credit (DESIGN.md §4): with less credit than
    # messages neither replica can take them all, whichever fetch wins the first race
    on_a = subscriber(a, address, 'shared-sub|global', source, credit=10)
    on_b = subscriber(b, address, 'shared-sub|global', source, credit=10)  # same name, other conn
    publish(broker.url, address, range(100))
    got_a, got_b = [], []
    a.wait(lambda: on_a.fetcher.has_message + 0 >= 1, timeout=10)
    for rcv, got in ((on_a, got_a), (on_b, got_b)):
        while True:
            try:
                got.append(rcv.receive(timeout=1).body)
                rcv.accept()
            except Exception:
                break
    assert sorted(got_a + got_b) == list(range(100))
    assert got_a
    assert got_b
    a.close()
    b.close()


def test_a_shared_durable_backlog_survives_its_last_consumer(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    source = JmsSource('topic', 'shared', 'global', durable=True)
    conn = jms_connect(broker.url)
    durable_detach(subscriber(conn, address, 'keep|global', source))
    conn.close()
    publish(second_broker.url, address, range(4))
    conn = jms_connect(second_broker.url)
    sub = subscriber(conn, address, 'keep|global', source)
    assert [m.body for m in receive_all(sub, 4)] == [0, 1, 2, 3]
    conn.close()


@pytest.mark.parametrize('how', ['link-close', 'session-end', 'connection-close'])
def test_a_shared_volatile_subscription_goes_with_its_last_consumer(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str, how: str
) -> None:
    source = JmsSource('topic', 'shared', 'global')
    first = jms_connect(broker.url)
    second = jms_connect(second_broker.url)
    one = subscriber(first, address, 'vol|global-volatile1', source)
    two = subscriber(second, address, 'vol|global-volatile1', source)
    one.close()  # not the last: the subscription stays
    publish(broker.url, address, ['while two is attached'])
    assert [m.body for m in receive_all(two, 1)] == ['while two is attached']
    if how == 'link-close':
        two.close()
    elif how == 'session-end':
        two.link.session.close()
    else:
        second.close()
    publish(broker.url, address, ['after the last one left'])
    again = jms_connect(second_broker.url)
    fresh = subscriber(again, address, 'vol|global-volatile1', source)
    assert nothing_more(fresh)  # a new subscription: the old one and its messages are gone
    again.close()
    first.close()
    if how != 'connection-close':
        second.close()


def test_unsubscribe_deletes_a_durable_subscription_found_by_null_source_lookup(
    broker: BrokerProcess, address: str
) -> None:
    conn = jms_connect(broker.url, 'client-u')
    durable_detach(subscriber(conn, address, 'gone', JmsSource('topic', durable=True)))
    lookup = conn.create_receiver(None, name='gone', options=[NullSource()])
    assert lookup.link.remote_source.address == address  # found: a non-null source
    lookup.close()  # detach(closed=true): the delete request
    assert lookup.link.remote_condition is None  # deleted, no error
    with pytest.raises(Exception, match='amqp:not-found'):
        conn.create_receiver(None, name='gone', options=[NullSource()])
    conn.close()


def test_unsubscribe_of_a_missing_subscription_is_not_found(broker: BrokerProcess) -> None:
    conn = jms_connect(broker.url)
    with pytest.raises(Exception, match='amqp:not-found'):
        conn.create_receiver(None, name='never-made|global', options=[NullSource()])
    conn.close()


def test_unsubscribe_is_refused_while_a_consumer_is_active_on_another_replica(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    source = JmsSource('topic', 'shared', 'global', durable=True)
    busy = jms_connect(second_broker.url)
    subscriber(busy, address, 'busy|global', source)
    conn = jms_connect(broker.url)
    lookup = conn.create_receiver(None, name='busy|global', options=[NullSource()])
    lookup.close()
    assert lookup.link.remote_condition.name == 'amqp:resource-locked'
    conn.close()
    busy.close()


def test_a_changed_selector_recreates_an_idle_subscription_and_is_refused_on_a_busy_one(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    conn = jms_connect(broker.url, 'client-m')
    sub = subscriber(conn, address, 'sel', JmsSource('topic', durable=True, selector='n > 1'))
    durable_detach(sub)
    pub = connect(broker.url)
    sender(pub, address, TOPIC).send(Message(body='old backlog', properties={'n': 5}))
    sub = subscriber(conn, address, 'sel', JmsSource('topic', durable=True, selector='n > 2'))
    assert nothing_more(sub)  # recreated: the old backlog went with the old definition
    sender(pub, address, TOPIC).send(Message(body='new', properties={'n': 5}))
    assert [m.body for m in receive_all(sub, 1)] == ['new']
    other = jms_connect(second_broker.url, 'client-m', sole=False)  # same namespace, busy
    with pytest.raises(Exception, match='amqp:resource-locked'):
        subscriber(other, address, 'sel', JmsSource('topic', durable=True, selector='n > 3'))
    other.close()
    pub.close()
    conn.close()


def test_max_consumers_is_enforced_across_replicas(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    env = {'SHOAL_MAX_CONSUMERS_PER_SUBSCRIPTION': '2'}
    a, b = start_broker(env=env), start_broker(env=env)
    source = JmsSource('topic', 'shared', 'global', durable=True)
    c1, c2, c3 = jms_connect(a.url), jms_connect(b.url), jms_connect(a.url)
    subscriber(c1, address, 'capped|global', source)
    subscriber(c2, address, 'capped|global', source)
    with pytest.raises(Exception, match='amqp:resource-limit-exceeded'):
        subscriber(c3, address, 'capped|global', source)
    for c in (c1, c2, c3):
        c.close()


def test_selectors_filter_a_topic_subscription(broker: BrokerProcess, address: str) -> None:
    conn = jms_connect(broker.url)
    sub = subscriber(conn, address, 'red|global-volatile1',
                     JmsSource('topic', 'shared', 'global', selector="colour = 'red'"))  # fmt: skip
    snd = sender(connect(broker.url), address, TOPIC)
    for colour in ('red', 'blue', 'red', None):
        snd.send(Message(body=colour, properties={'colour': colour} if colour else {}))
    assert [m.body for m in receive_all(sub, 2)] == ['red', 'red']
    assert nothing_more(sub)
    conn.close()


def test_a_bad_selector_is_refused_with_invalid_field(broker: BrokerProcess, address: str) -> None:
    conn = jms_connect(broker.url)
    with pytest.raises(Exception, match='amqp:invalid-field'):
        subscriber(conn, address, 'bad', JmsSource('topic', selector='colour = = 1'))
    conn.close()


def test_selectors_work_on_queue_consumers(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    for n in range(6):
        snd.send(Message(body=n, properties={'n': n}))
    evens = conn.create_receiver(
        address, credit=10, name='evens', options=[JmsSource('queue', selector='n / 2 * 2 = n')]
    )
    assert sorted(m.body for m in receive_all(evens, 3)) == [0, 2, 4]
    assert nothing_more(evens)
    evens.close()
    rest = conn.create_receiver(address, credit=10, name='rest')
    assert sorted(m.body for m in receive_all(rest, 3)) == [1, 3, 5]
    conn.close()


def test_no_local_skips_messages_from_the_subscribers_own_connection(
    broker: BrokerProcess, address: str
) -> None:
    conn = jms_connect(broker.url, 'client-nl')
    sub = subscriber(conn, address, 'mine', JmsSource('topic', durable=True, no_local=True))
    own = sender(conn, address, TOPIC)
    own.send(Message(body='from myself'))
    publish(broker.url, address, ['from someone else'])
    assert [m.body for m in receive_all(sub, 1)] == ['from someone else']
    assert nothing_more(sub)
    conn.close()
