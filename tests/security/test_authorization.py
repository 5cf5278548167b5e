"""
Authorization matrix: each operation (send, consume, browse, manage) allowed and denied, for
named producers and for messages on the anonymous relay (jms-amqp-facts §5.2: a refused relay
send is ``rejected`` with ``amqp:unauthorized-access``, the link stays open).

Users (tests/support/testusers.py): alice sends and consumes ``orders.*``, consumes and manages
``news.*``; bob may only browse ``orders.*`` and send to ``audit``.
"""

from collections.abc import Iterator

import pytest
from amqpclient import (
    Browse,
    Capabilities,
    receive_all,
    receiver,
    send_all,
    send_with_outcome,
    sender,
)
from jmswire import JmsSource, NullSource, durable_detach, subscriber
from processes import BrokerProcess
from proton import Delivery, Message
from proton.utils import BlockingConnection, BlockingSender, LinkDetached
from testusers import PASSWORDS

DENIED = 'amqp:unauthorized-access'


def login(broker: BrokerProcess, user: str, container: str | None = None) -> BlockingConnection:
    from proton.reactor import Container

    c = Container()
    if container:
        c.container_id = container
    return BlockingConnection(
        broker.url, timeout=10, user=user, password=PASSWORDS[user], allowed_mechs='PLAIN',
        allow_insecure_mechs=True, container=c,
    )  # fmt: skip


@pytest.fixture
def alice(secure_broker: BrokerProcess) -> Iterator[BlockingConnection]:
    conn = login(secure_broker, 'alice')
    yield conn
    conn.close()


@pytest.fixture
def bob(secure_broker: BrokerProcess) -> Iterator[BlockingConnection]:
    conn = login(secure_broker, 'bob')
    yield conn
    conn.close()


def relay_send(conn: BlockingConnection, relay: BlockingSender, to: str) -> tuple[int, str | None]:
    return send_with_outcome(conn, relay, Message(address=to, body='x'))


# -- send ----------------------------------------------------------------------------------------


def test_send_allowed(alice: BlockingConnection, address: str) -> None:
    send_all(alice, f'orders.{address}', ['ok'])


def test_send_denied_at_attach(bob: BlockingConnection, address: str) -> None:
    with pytest.raises(LinkDetached, match=DENIED):
        sender(bob, f'orders.{address}')


def test_a_denied_producer_creates_no_address(
    bob: BlockingConnection, alice: BlockingConnection, address: str
) -> None:
    with pytest.raises(LinkDetached, match=DENIED):
        sender(bob, f'orders.{address}', Capabilities('topic'))
    # had bob's attach created it, it would be a topic and alice's queue attach would fail
    send_all(alice, f'orders.{address}', ['still free to be a queue'], Capabilities('queue'))


# -- consume and browse --------------------------------------------------------------------------


def test_consume_allowed(alice: BlockingConnection, address: str) -> None:
    queue = f'orders.{address}'
    send_all(alice, queue, ['a'])
    assert [m.body for m in receive_all(receiver(alice, queue), 1)] == ['a']


def test_consume_denied_at_attach(
    bob: BlockingConnection, alice: BlockingConnection, address: str
) -> None:
    queue = f'orders.{address}'
    send_all(alice, queue, ['kept'])
    with pytest.raises(LinkDetached, match=DENIED):
        receiver(bob, queue)
    assert [m.body for m in receive_all(receiver(alice, queue), 1)] == ['kept']  # untouched


def test_browse_allowed_with_browse_only(
    bob: BlockingConnection, alice: BlockingConnection, address: str
) -> None:
    queue = f'orders.{address}'
    send_all(alice, queue, ['seen, not taken'])
    browser = receiver(bob, queue, Browse())
    assert browser.receive(timeout=10).body == 'seen, not taken'
    assert [m.body for m in receive_all(receiver(alice, queue), 1)] == ['seen, not taken']


def test_consume_implies_browse(alice: BlockingConnection, address: str) -> None:
    queue = f'orders.{address}'
    send_all(alice, queue, ['b'])
    assert receiver(alice, queue, Browse()).receive(timeout=10).body == 'b'


def test_browse_denied_outside_the_pattern(bob: BlockingConnection, address: str) -> None:
    with pytest.raises(LinkDetached, match=DENIED):
        receiver(bob, f'news.{address}', Browse())


# -- manage: durable subscriptions ---------------------------------------------------------------


def test_durable_subscription_allowed_with_manage(
    secure_broker: BrokerProcess, address: str
) -> None:
    conn = login(secure_broker, 'alice', container=f'client-{address}')
    try:
        topic = f'news.{address}'
        sub = subscriber(conn, topic, 'sub', JmsSource('topic', durable=True))
        send_all(conn, topic, ['n'], Capabilities('topic'))
        assert [m.body for m in receive_all(sub, 1)] == ['n']
        durable_detach(sub)
        # unsubscribing (a null-source lookup, then detach closed) needs manage as well
        lookup = conn.create_receiver(None, name='sub', options=[NullSource()])
        lookup.close()
    finally:
        conn.close()


def test_durable_subscription_denied_without_manage(
    secure_broker: BrokerProcess, address: str
) -> None:
    conn = login(secure_broker, 'alice', container=f'client-{address}')
    try:
        topic = f'orders.{address}'  # alice consumes orders.* but manages only news.*
        with pytest.raises(LinkDetached, match=DENIED):
            subscriber(conn, topic, 'sub', JmsSource('topic', durable=True))
        # a plain (non-durable) subscription to the same topic needs only consume
        plain = subscriber(conn, topic, 'plain', JmsSource('topic'))
        send_all(conn, topic, ['t'], Capabilities('topic'))
        assert [m.body for m in receive_all(plain, 1)] == ['t']
    finally:
        conn.close()


def test_unsubscribe_denied_without_manage(secure_broker: BrokerProcess, address: str) -> None:
    owner = login(secure_broker, 'alice', container=f'client-{address}')
    try:
        sub = subscriber(owner, f'news.{address}', 'sub', JmsSource('topic', durable=True))
        durable_detach(sub)
    finally:
        owner.close()
    other = login(secure_broker, 'bob', container=f'client-{address}')
    try:
        with pytest.raises(LinkDetached, match=DENIED):
            other.create_receiver(None, name='sub', options=[NullSource()])
    finally:
        other.close()


# -- the anonymous relay: per message ------------------------------------------------------------


def test_relay_messages_are_authorized_one_by_one(alice: BlockingConnection, address: str) -> None:
    relay = sender(alice, None)
    assert relay_send(alice, relay, f'orders.{address}') == (Delivery.ACCEPTED, None)
    assert relay_send(alice, relay, f'secret.{address}') == (Delivery.REJECTED, DENIED)
    # the link stays open and later allowed messages go through
    assert relay_send(alice, relay, f'orders.{address}') == (Delivery.ACCEPTED, None)
    got = receive_all(receiver(alice, f'orders.{address}'), 2)
    assert len(got) == 2


def test_relay_denies_bob_everything_but_audit(bob: BlockingConnection, address: str) -> None:
    relay = sender(bob, None)
    assert relay_send(bob, relay, f'orders.{address}') == (Delivery.REJECTED, DENIED)
    assert relay_send(bob, relay, 'audit') == (Delivery.ACCEPTED, None)
