"""Non-durable topic subscriptions: fan-out to whoever is subscribed at publish time."""

from amqpclient import Capabilities, connect, nothing_more, receive_all, receiver, sender
from processes import BrokerProcess
from proton import Message

TOPIC = Capabilities('topic')


def test_every_subscriber_gets_every_message(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    subscribers = [receiver(conn, address, TOPIC, credit=20) for _ in range(3)]
    snd = sender(conn, address, TOPIC)
    for i in range(10):
        snd.send(Message(body=i))
    for sub in subscribers:
        assert [m.body for m in receive_all(sub, 10)] == list(range(10))
        assert nothing_more(sub)
    conn.close()


def test_messages_published_before_a_subscriber_attached_are_not_delivered_to_it(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    early = receiver(conn, address, TOPIC, credit=20)
    snd = sender(conn, address, TOPIC)
    snd.send(Message(body='before'))
    late = receiver(conn, address, TOPIC, credit=20)
    snd.send(Message(body='after'))
    assert [m.body for m in receive_all(early, 2)] == ['before', 'after']
    assert [m.body for m in receive_all(late, 1)] == ['after']
    assert nothing_more(late)
    conn.close()


def test_nothing_is_retained_once_the_last_subscriber_leaves(
    broker: BrokerProcess, address: str, store_client
) -> None:  # type: ignore[no-untyped-def]
    conn = connect(broker.url)
    sub = receiver(conn, address, TOPIC, credit=20)
    snd = sender(conn, address, TOPIC)
    snd.send(Message(body='kept for the subscriber'))
    receive_all(sub, 1)
    sub.close()
    snd.send(Message(body='nobody is listening'))
    again = receiver(conn, address, TOPIC, credit=20)
    assert nothing_more(again)
    again.close()
    conn.close()
    client = store_client
    tag = f'shoal:{{a:{address}}}'
    assert client.scard(f'{tag}:groups') == 0  # every subscription was removed
    groups = [g for band in range(10) for g in _groups(client, f'{tag}:p:{band}')]
    assert groups == []


def _groups(client, stream: str) -> list[object]:  # type: ignore[no-untyped-def]
    return list(client.xinfo_groups(stream)) if client.exists(stream) else []


def test_a_subscriber_on_another_replica_gets_the_messages(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    conn_a = connect(broker.url)
    conn_b = connect(second_broker.url)
    here = receiver(conn_a, address, TOPIC, credit=20)
    there = receiver(conn_b, address, TOPIC, credit=20)
    snd = sender(conn_a, address, TOPIC)
    for i in range(5):
        snd.send(Message(body=i))
    assert [m.body for m in receive_all(here, 5)] == list(range(5))
    assert [m.body for m in receive_all(there, 5)] == list(range(5))
    conn_a.close()
    conn_b.close()
