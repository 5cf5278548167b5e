"""Queue semantics against a real broker process and a real Redis, with proton's client."""

import time

import pytest
from amqpclient import (
    Browse,
    Presettled,
    connect,
    drain,
    nothing_more,
    receive_all,
    receiver,
    send_all,
    sender,
    settle,
)
from enginepeer import EnginePeer
from processes import BrokerProcess
from proton import Delivery, Endpoint, Message
from proton.utils import SendException

from shoal_broker.amqp.subscriptions import PARK_SECONDS


def test_messages_round_trip_in_order(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    for i in range(20):
        snd.send(Message(body=f'm{i}'))
    rcv = receiver(conn, address, credit=50)
    assert [m.body for m in receive_all(rcv, 20)] == [f'm{i}' for i in range(20)]
    assert nothing_more(rcv)
    conn.close()


def test_each_message_goes_to_exactly_one_competing_consumer(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    consumers = [receiver(conn, address, credit=5) for _ in range(3)]
    send_all(conn, address, range(60))
    got: list[int] = []
    while len(got) < 60:
        conn.wait(lambda: any(r.fetcher.has_message for r in consumers), timeout=10)
        for rcv in consumers:
            while rcv.fetcher.has_message:
                got.append(rcv.receive(timeout=1).body)
                rcv.accept()
    assert sorted(got) == list(range(60))
    conn.close()


def test_credit_bounds_what_a_consumer_is_sent(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    send_all(conn, address, range(10))
    rcv = receiver(conn, address, credit=3)
    conn.wait(lambda: rcv.fetcher.has_message >= 3, timeout=10)
    time.sleep(0.2)
    assert rcv.fetcher.has_message == 3
    conn.close()


def test_drain_on_an_empty_queue_is_answered_at_once(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=0)
    took = drain(conn, rcv, 10)
    assert took < 0.5
    assert rcv.link.credit == 0
    conn.close()


def test_drain_sends_what_is_there_then_reports_no_credit(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    send_all(conn, address, range(3))
    rcv = receiver(conn, address, credit=0)
    drain(conn, rcv, 10)
    # proton's blocking fetcher hands over one message per wait(): let it catch up
    conn.wait(lambda: rcv.fetcher.has_message == 3, timeout=5)
    assert rcv.link.credit == 0
    assert [m.body for m in receive_all(rcv, 3)] == [0, 1, 2]
    conn.close()


def test_receive_with_timeout_returns_late_messages(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=1)
    assert nothing_more(rcv, wait=0.3)
    other = connect(broker.url)
    sender(other, address).send(Message(body='late'))
    assert rcv.receive(timeout=5).body == 'late'
    rcv.accept()
    other.close()
    conn.close()


def test_released_message_is_redelivered_with_count_unchanged(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='x'))
    rcv = receiver(conn, address, credit=1)
    first = rcv.receive(timeout=5)
    settle(rcv, Delivery.RELEASED)
    again = rcv.receive(timeout=5)
    rcv.accept()
    assert (first.delivery_count, again.delivery_count) == (0, 0)
    assert again.body == 'x'
    conn.close()


def test_modified_delivery_failed_increments_the_count(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='x'))
    rcv = receiver(conn, address, credit=1)
    counts = []
    for _ in range(3):
        counts.append(rcv.receive(timeout=5).delivery_count)
        settle(rcv, Delivery.MODIFIED, failed=True)
    counts.append(rcv.receive(timeout=5).delivery_count)
    rcv.accept()
    assert counts == [0, 1, 2, 3]
    conn.close()


def test_rejected_message_goes_to_the_dead_letter_queue(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    dlq = f'{address}-dlq'
    b = start_broker(env={'SHOAL_DEAD_LETTER_ADDRESS': dlq})
    conn = connect(b.url)
    sender(conn, address).send(Message(body='poison', properties={'k': 1}))
    rcv = receiver(conn, address, credit=1)
    rcv.receive(timeout=5)
    settle(rcv, Delivery.REJECTED)
    assert nothing_more(rcv)
    dead = receiver(conn, dlq, credit=1).receive(timeout=5)
    assert dead.body == 'poison'
    assert dead.properties == {'k': 1}
    assert dead.annotations['x-opt-shoal-original-address'] == address
    assert dead.annotations['x-opt-shoal-reason'] == 'rejected'
    conn.close()


def test_max_delivery_attempts_dead_letters(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    dlq = f'{address}-dlq'
    b = start_broker(env={'SHOAL_DEAD_LETTER_ADDRESS': dlq, 'SHOAL_MAX_DELIVERY_ATTEMPTS': '3'})
    conn = connect(b.url)
    sender(conn, address).send(Message(body='flaky'))
    rcv = receiver(conn, address, credit=1)
    for _ in range(3):
        rcv.receive(timeout=5)
        settle(rcv, Delivery.MODIFIED, failed=True)
    assert nothing_more(rcv)
    dead = receiver(conn, dlq, credit=1).receive(timeout=5)
    assert dead.body == 'flaky'
    assert dead.annotations['x-opt-shoal-reason'] == 'max delivery attempts (3)'
    assert dead.delivery_count == 2
    conn.close()


def test_a_consumer_already_on_the_dead_letter_queue_gets_the_dead_letter(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    dlq = f'{address}-dlq'
    b = start_broker(env={'SHOAL_DEAD_LETTER_ADDRESS': dlq, 'SHOAL_MAX_DELIVERY_ATTEMPTS': '1'})
    conn = connect(b.url)
    dead = receiver(conn, dlq, credit=10)  # attached first, on the same replica
    sender(conn, address).send(Message(body='flaky'))
    rcv = receiver(conn, address, credit=1)
    rcv.receive(timeout=5)
    settle(rcv, Delivery.MODIFIED, failed=True)
    moved = dead.receive(timeout=5)
    assert (moved.body, moved.annotations['x-opt-shoal-reason']) == (
        'flaky',
        'max delivery attempts (1)',
    )
    conn.close()


def test_expired_messages_are_never_delivered(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    snd.send(Message(body='short', ttl=0.2))
    snd.send(Message(body='absolute', expiry_time=time.time() + 0.2))
    snd.send(Message(body='long', ttl=60))
    time.sleep(0.5)
    rcv = receiver(conn, address, credit=10)
    assert [m.body for m in receive_all(rcv, 1)] == ['long']
    assert nothing_more(rcv)
    conn.close()


def test_unsettled_deliveries_return_when_the_consumer_closes(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    send_all(conn, address, range(5))
    first = receiver(conn, address, credit=5)
    conn.wait(lambda: first.fetcher.has_message == 5, timeout=10)
    first.receive(timeout=1)
    first.accept()
    first.close()
    second = receiver(conn, address, credit=10)
    again = receive_all(second, 4)
    assert sorted(m.body for m in again) == [1, 2, 3, 4]
    assert all(m.delivery_count == 1 for m in again)  # the consumer's default outcome
    conn.close()


@pytest.mark.parametrize('how', ['session', 'connection'])
def test_unsettled_deliveries_return_when_the_session_or_connection_ends(
    broker: BrokerProcess, address: str, how: str
) -> None:
    producer = connect(broker.url)
    snd = sender(producer, address)
    for i in range(3):
        snd.send(Message(body=i))
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=3)
    conn.wait(lambda: rcv.fetcher.has_message == 3, timeout=10)
    if how == 'session':
        rcv.link.session.close()
        conn.wait(lambda: not rcv.link.session.state & rcv.link.session.REMOTE_ACTIVE, timeout=5)
    else:
        conn.close()
    again = receive_all(receiver(producer, address, credit=3), 3)
    assert sorted(m.body for m in again) == [0, 1, 2]
    producer.close()


def test_presettled_consumer_gets_settled_transfers_and_consumes(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    send_all(conn, address, range(5))
    rcv = receiver(conn, address, Presettled(), credit=10)
    got = [rcv.receive(timeout=5) for _ in range(5)]
    assert [m.body for m in got] == list(range(5))
    assert not rcv.fetcher.unsettled  # the transfers arrived settled
    rcv.close()
    assert nothing_more(receiver(conn, address, credit=10))
    conn.close()


def test_priority_higher_first_order_kept_within_a_priority(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    for body, priority in [('n1', 4), ('h1', 9), ('n2', 0), ('h2', 5), ('n3', 4)]:
        snd.send(Message(body=body, priority=priority))
    rcv = receiver(conn, address, credit=10)
    assert [m.body for m in receive_all(rcv, 5)] == ['h1', 'h2', 'n1', 'n3', 'n2']
    conn.close()


def test_browser_sees_messages_without_consuming_them(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    send_all(conn, address, range(4))
    consumer = receiver(conn, address, credit=1)
    consumer.receive(timeout=5)
    consumer.accept()  # 0 is consumed
    consumer.close()
    browser = receiver(conn, address, Browse(), credit=0)
    drain(conn, browser, 100)
    conn.wait(lambda: browser.fetcher.has_message == 3, timeout=5)
    assert browser.link.credit == 0  # the enumeration ended by drain
    seen = [browser.receive(timeout=5).body for _ in range(3)]
    assert seen == [1, 2, 3]
    assert nothing_more(browser)
    assert not browser.fetcher.unsettled
    browser.close()
    # 1 may come last: the closed consumer's prefetched copy is returned concurrently
    assert sorted(m.body for m in receive_all(receiver(conn, address, credit=10), 3)) == [1, 2, 3]
    conn.close()


def test_unknown_address_is_refused_when_auto_create_is_off(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_AUTO_CREATE_QUEUES': 'false', 'SHOAL_AUTO_CREATE_TOPICS': 'false'})
    conn = connect(b.url)
    with pytest.raises(Exception, match='amqp:not-found'):
        sender(conn, address)
    conn.close()
    conn = connect(b.url)
    with pytest.raises(Exception, match='amqp:not-found'):
        receiver(conn, address)
    conn.close()
    conn = connect(b.url)
    anonymous = sender(conn, None)
    with pytest.raises(SendException) as refused:
        anonymous.send(Message(address=address, body='x'))
    assert refused.value.state == Delivery.REJECTED
    conn.close()


@pytest.mark.parametrize(('count', 'released'), [(6, 3), (600, 500)])  # 600: past ACCEPTS_CAP
def test_accepts_that_arrive_with_the_detach_consume_their_messages(
    broker: BrokerProcess, address: str, count: int, released: int
) -> None:
    """The broker settles a consumer's plain accepts on its way through the engine's events and
    applies them together: they must still count before the detach that followed them on the
    wire (which returns what is unsettled), and an outcome among them that is not an accept
    keeps its own effect."""
    conn = connect(broker.url)
    send_all(conn, address, range(count))
    peer = EnginePeer(broker.port)
    peer.connection.open()
    session = peer.connection.session()
    session.open()
    link = session.receiver('accept-then-detach')
    link.source.address = address
    link.target.address = address
    link.open()
    link.flow(count)
    deliveries = []

    def read() -> bool:
        while (delivery := link.current) is not None and not delivery.partial:
            link.recv(delivery.pending)
            deliveries.append(delivery)
            link.advance()
        return len(deliveries) == count

    assert peer.pump(20, until=read)
    for i, delivery in enumerate(deliveries):  # one write: the accepts, a release, the detach
        delivery.update(Delivery.RELEASED if i == released else Delivery.ACCEPTED)
        delivery.settle()
    link.close()
    assert peer.pump(10, until=lambda: bool(link.state & Endpoint.REMOTE_CLOSED))
    second = receiver(conn, address, credit=10)
    again = receive_all(second, 1)
    assert [(m.body, m.delivery_count) for m in again] == [(released, 0)]  # count unchanged
    assert nothing_more(second)
    peer.close()
    conn.close()


def test_undeliverable_here_keeps_a_message_from_that_consumer_only(
    broker: BrokerProcess, address: str
) -> None:
    """modified(undeliverable-here): never offered to that consumer again, not even after it
    went back to the queue (PARK_SECONDS) and was fetched anew for it alone; another consumer
    gets it, its delivery count unchanged (the outcome did not say delivery-failed)."""
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='x'))
    first = receiver(conn, address, credit=5)
    assert first.receive(timeout=5).body == 'x'
    settle(first, Delivery.MODIFIED, undeliverable=True)
    assert nothing_more(first, wait=PARK_SECONDS + 2)
    second = receiver(conn, address, credit=5)
    again = second.receive(timeout=10)
    second.accept()
    assert (again.body, again.delivery_count) == ('x', 0)
    assert nothing_more(first)
    conn.close()
