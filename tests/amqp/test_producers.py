"""Producer links: credit, named targets, the anonymous relay, temporary nodes, large messages."""

from collections.abc import Callable

import pytest
from amqpclient import (
    Capabilities,
    DynamicTarget,
    connect,
    nothing_more,
    receive_all,
    receiver,
    sender,
)
from processes import BrokerProcess
from proton import Delivery, Message, byte
from proton.utils import LinkDetached, SendException

Start = Callable[..., BrokerProcess]


def test_a_producer_is_granted_credit_promptly_and_topped_up(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    conn.wait(lambda: snd.link.credit > 0, timeout=5)
    initial = snd.link.credit
    for i in range(initial + 50):  # more than the first grant: needs top-ups
        snd.send(Message(body=i))
    assert initial >= 100
    rcv = receiver(conn, address, credit=initial + 50)
    assert len(receive_all(rcv, initial + 50)) == initial + 50
    conn.close()


def test_a_producer_sending_one_message_at_a_time_is_topped_up_once_per_half_window(
    start_broker: Start, address: str
) -> None:
    """A synchronous sender (one message, then its outcome) gets no flow frame with each accept:
    its credit is topped up once half the window is used, back to the whole window."""
    b = start_broker(env={'SHOAL_PRODUCER_CREDIT': '10'})
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        conn.wait(lambda: snd.link.credit == 10, timeout=5)
        for i in range(4):
            snd.send(Message(body=i))  # waits for its accept
        assert snd.link.credit == 6  # more than half left: nothing granted
        snd.send(Message(body=4))
        conn.wait(lambda: snd.link.credit == 10, timeout=5)  # half used: the whole window again
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 5)] == [0, 1, 2, 3, 4]
    finally:
        conn.close()


def test_the_anonymous_relay_routes_by_to_and_jms_dest(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    queue, topic = f'{address}-q', f'{address}-t'
    to_queue = receiver(conn, queue, credit=10)
    to_topic = receiver(conn, topic, Capabilities('topic'), credit=10)
    relay = sender(conn, None)
    relay.send(Message(address=queue, body='q', annotations={'x-opt-jms-dest': byte(0)}))
    relay.send(Message(address=topic, body='t', annotations={'x-opt-jms-dest': byte(1)}))
    assert [m.body for m in receive_all(to_queue, 1)] == ['q']
    assert [m.body for m in receive_all(to_topic, 1)] == ['t']
    conn.close()


def test_the_anonymous_relay_rejects_a_message_without_an_address(
    broker: BrokerProcess,
) -> None:
    conn = connect(broker.url)
    relay = sender(conn, None)
    with pytest.raises(SendException) as refused:
        relay.send(Message(body='nowhere'))
    assert refused.value.state == Delivery.REJECTED
    relay.send(Message(address='still-works', body='ok'))  # the link stays usable
    conn.close()


def test_a_relay_message_whose_kind_contradicts_the_address_is_rejected(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='makes it a queue'))
    relay = sender(conn, None)
    with pytest.raises(SendException):
        relay.send(Message(address=address, body='x', annotations={'x-opt-jms-dest': byte(1)}))
    conn.close()


def test_a_temporary_queue_lives_as_long_as_its_creating_link(
    broker: BrokerProcess,
) -> None:
    conn = connect(broker.url)
    creator = sender(conn, None, DynamicTarget('temporary-queue'))
    temp = creator.link.remote_target.address
    assert temp
    assert temp.startswith('temp-queue://')
    rcv = receiver(conn, temp, Capabilities('temporary-queue'), credit=5)
    sender(conn, temp).send(Message(body='to temp'))
    assert [m.body for m in receive_all(rcv, 1)] == ['to temp']

    def delete_and_wait() -> None:  # the client raises while closing or while waiting
        creator.close()
        conn.wait(lambda: rcv.link.state & rcv.link.REMOTE_CLOSED, timeout=5)

    with pytest.raises(LinkDetached, match='amqp:resource-deleted'):
        delete_and_wait()
    conn.close()
    conn = connect(broker.url)  # the node is gone: with auto-create it would be a new, empty one
    assert nothing_more(receiver(conn, temp, credit=5))
    conn.close()


def test_a_dynamic_receiver_gets_a_fresh_queue(broker: BrokerProcess) -> None:
    conn = connect(broker.url)
    rcv = receiver(conn, None, credit=5, dynamic=True)
    temp = rcv.link.remote_source.address
    assert temp
    assert temp.startswith('temp-queue://')
    sender(conn, temp).send(Message(body='reply'))
    assert [m.body for m in receive_all(rcv, 1)] == ['reply']
    conn.close()


@pytest.mark.parametrize('size', [100_000, 3_000_000])
def test_large_messages_cross_in_several_frames_both_ways(
    broker: BrokerProcess, address: str, size: int
) -> None:
    body = bytes(range(256)) * (size // 256)
    conn = connect(broker.url)
    sender(conn, address).send(Message(body=body))
    rcv = receiver(conn, address, credit=1)
    assert rcv.receive(timeout=10).body == body
    rcv.accept()
    conn.close()


def test_a_message_over_the_size_limit_closes_the_link_and_stores_nothing(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_MAX_MESSAGE_SIZE': '50000'})
    conn = connect(b.url)
    snd = sender(conn, address)
    with pytest.raises(Exception, match='message-size-exceeded'):
        snd.send(Message(body=b'x' * 60_000))
    conn.close()
    conn = connect(b.url)
    rcv = receiver(conn, address, credit=5)
    assert nothing_more(rcv)
    sender(conn, address).send(Message(body=b'small'))
    assert receive_all(rcv, 1)[0].body == b'small'
    conn.close()


def test_a_temporary_queue_is_deleted_when_its_connection_ends(
    broker: BrokerProcess, redis_server
) -> None:  # type: ignore[no-untyped-def]
    import time

    import redis

    conn = connect(broker.url)
    creator = sender(conn, None, DynamicTarget('temporary-topic'))
    temp = creator.link.remote_target.address
    assert temp.startswith('temp-topic://')
    conn.close()
    client = redis.Redis.from_url(redis_server.url)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and client.hexists('shoal:addresses', temp):
        time.sleep(0.05)
    assert not client.hexists('shoal:addresses', temp)
    client.close()
