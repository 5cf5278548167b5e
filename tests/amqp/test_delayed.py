"""JMS delivery delay: x-opt-delivery-time holds a message until then (DELAYED_DELIVERY)."""

import time

from amqpclient import Capabilities, connect, nothing_more, receive_all, receiver, sender
from processes import BrokerProcess
from proton import Message


def _delayed(body: str, delay_s: float) -> Message:
    due = int((time.time() + delay_s) * 1000)
    return Message(body=body, annotations={'x-opt-delivery-time': due})


def test_a_delayed_message_arrives_at_its_delivery_time_not_before(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    sender(conn, address).send(_delayed('later', 1.5))
    sender(conn, address).send(Message(body='now'))
    consumer_conn = connect(second_broker.url)  # moved by whichever replica, seen by any
    rcv = receiver(consumer_conn, address, credit=5)
    started = time.monotonic()
    assert [m.body for m in receive_all(rcv, 1)] == ['now']
    assert nothing_more(rcv, wait=0.8)
    late = receive_all(rcv, 1, timeout=5)[0]
    assert late.body == 'later'
    assert time.monotonic() - started >= 1.0
    assert late.annotations['x-opt-delivery-time'] > 0  # kept for JMSDeliveryTime
    consumer_conn.close()
    conn.close()


def test_a_delayed_topic_message_reaches_the_subscribers_present_when_it_is_due(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    sub = receiver(conn, address, Capabilities('topic'), credit=5)
    sender(conn, address, Capabilities('topic')).send(_delayed('tick', 0.5))
    assert [m.body for m in receive_all(sub, 1, timeout=5)] == ['tick']
    conn.close()


def test_a_delivery_time_in_the_past_is_delivered_at_once(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    sender(conn, address).send(_delayed('overdue', -10))
    assert [m.body for m in receive_all(receiver(conn, address, credit=1), 1, timeout=2)] == [
        'overdue'
    ]
    conn.close()
