"""
The first message to the first consumer: the JMS 2.0 TCK's shared-subscription cases.

jakartaee/platform-tck ``jms/core20`` (sessiontests ``createSharedConsumerTopicTest1/2``,
``createSharedDurableConsumerTopicTest1/2/3``; jmscontexttopictests ``createSharedConsumerTest1/2``,
``createSharedDurableConsumerTest1/3``) attach two consumers of one shared subscription on one
connection, both with prefetch credit, publish one message, and expect it at the consumer created
first and nothing at the second; the next message goes to the second. A Session and a JMSContext
put the same frames on the wire, so each case below runs the TCK's steps once per ClientID
setting, with the attaches Qpid JMS sends (jms-amqp-facts §2.2 and §4.2: link names, source
capabilities, durability) and its close: detach(closed=false) for a durable consumer.
"""

import uuid
from collections.abc import Iterator

import pytest
from amqpclient import Capabilities, nothing_more, receiver, sender
from jmswire import JmsSource, NullSource, durable_detach, jms_connect, subscriber
from processes import BrokerProcess
from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

PREFETCH = 1000
"""Qpid JMS's default prefetch: the credit each consumer grants as it is created."""

LAST_MESSAGE = 'lastMessage = TRUE'
NUM_MESSAGES = 3
QUIET = 1.0
"""How long a consumer that should get nothing is watched (the TCK waits its jms_timeout)."""


class JmsSession:
    """One Qpid JMS connection (with or without a ClientID), a producer to the topic and the
    shared consumers it creates, named as Qpid JMS names them on one connection."""

    def __init__(self, url: str, topic: str, client_id: str | None) -> None:
        self.conn: BlockingConnection = jms_connect(url, client_id)
        self.topic = topic
        self.has_cid = client_id is not None
        self.producer: BlockingSender = sender(self.conn, topic, Capabilities('topic'))
        self._count: dict[tuple[str, bool], int] = {}

    def shared_consumer(
        self, name: str, *, durable: bool, selector: str | None = None
    ) -> BlockingReceiver:
        """createSharedConsumer / createSharedDurableConsumer: the per-connection counter counts
        every consumer added while one is active (facts §4.2)."""
        number = self._count[name, durable] = self._count.get((name, durable), 0) + 1
        caps = ('topic', 'shared') if self.has_cid else ('topic', 'shared', 'global')
        if durable and self.has_cid:
            link = name if number == 1 else f'{name}|{number}'
        elif durable:
            link = f'{name}|global' if number == 1 else f'{name}|global{number}'
        else:
            link = f'{name}|volatile{number}' if self.has_cid else f'{name}|global-volatile{number}'
        source = JmsSource(*caps, durable=durable, selector=selector)
        return subscriber(self.conn, self.topic, link, source, credit=PREFETCH)

    def send(self, body: str, **properties: object) -> None:
        self.producer.send(Message(body=body, properties=properties or None))

    def unsubscribe(self, name: str) -> None:
        """Session.unsubscribe: the null-source lookup link, closed; refused while a consumer of
        the subscription is still active."""
        link = name if self.has_cid else f'{name}|global'
        lookup = self.conn.create_receiver(None, name=link, options=[NullSource()])
        lookup.close()
        assert lookup.link.remote_condition is None, lookup.link.remote_condition


def receive_one(rcv: BlockingReceiver) -> str:
    """consumer.receive(timeout) in AUTO_ACKNOWLEDGE: the message's body, accepted."""
    message = rcv.receive(timeout=10)
    rcv.accept()
    body: str = message.body
    return body


def send_batch(session: JmsSession, prefix: str) -> None:
    """The TCK's selector cases: ``NUM_MESSAGES`` messages, only the last with lastMessage=true."""
    for i in range(1, NUM_MESSAGES + 1):
        session.send(f'{prefix} {i}', lastMessage=i == NUM_MESSAGES)


@pytest.fixture(params=[False, True], ids=['no-client-id', 'client-id'])
def session(
    request: pytest.FixtureRequest, broker: BrokerProcess, address: str
) -> Iterator[JmsSession]:
    client_id = f'tck-{uuid.uuid4().hex[:8]}' if request.param else None
    opened = JmsSession(broker.url, address, client_id)
    yield opened
    opened.conn.close()


def subscription_name(tck_case: str) -> str:
    """The TCK names each subscription after its test; the suffix keeps global names apart from
    other runs against the same store."""
    return f'{tck_case}-{uuid.uuid4().hex[:8]}'


@pytest.mark.parametrize(
    'tck_case', ['createSharedConsumerTopicTest1', 'createSharedConsumerTest1']
)
def test_a_shared_consumer_gets_the_first_message_and_the_second_the_next(
    session: JmsSession, tck_case: str
) -> None:
    name = subscription_name(tck_case)
    consumer = session.shared_consumer(name, durable=False)
    consumer2 = session.shared_consumer(name, durable=False)
    session.send('Where are you! 1')
    assert receive_one(consumer) == 'Where are you! 1'
    assert nothing_more(consumer2, wait=QUIET)
    session.send('Where are you! 2')
    assert receive_one(consumer2) == 'Where are you! 2'
    assert nothing_more(consumer, wait=QUIET)
    consumer.close()
    consumer2.close()


@pytest.mark.parametrize(
    'tck_case', ['createSharedConsumerTopicTest2', 'createSharedConsumerTest2']
)
def test_shared_consumers_with_a_selector_take_turns_from_the_first(
    session: JmsSession, tck_case: str
) -> None:
    name = subscription_name(tck_case)
    consumer = session.shared_consumer(name, durable=False, selector=LAST_MESSAGE)
    consumer2 = session.shared_consumer(name, durable=False, selector=LAST_MESSAGE)
    send_batch(session, 'Message')
    assert receive_one(consumer) == f'Message {NUM_MESSAGES}'
    assert nothing_more(consumer2, wait=QUIET)
    send_batch(session, 'Message')
    assert receive_one(consumer2) == f'Message {NUM_MESSAGES}'
    assert nothing_more(consumer, wait=QUIET)
    consumer.close()
    consumer2.close()


@pytest.mark.parametrize(
    'tck_case',
    [
        'createSharedDurableConsumerTopicTest1',
        'createSharedDurableConsumerTopicTest3',
        'createSharedDurableConsumerTest1',
        'createSharedDurableConsumerTest3',
    ],
)
def test_a_shared_durable_consumer_gets_the_first_message_and_the_second_takes_over(
    session: JmsSession, tck_case: str
) -> None:
    name = subscription_name(tck_case)
    consumer = session.shared_consumer(name, durable=True)
    consumer2 = session.shared_consumer(name, durable=True)
    session.send('Message1!')
    assert receive_one(consumer) == 'Message1!'
    durable_detach(consumer)  # consumer.close() on a durable consumer
    session.send('Message2!')
    assert receive_one(consumer2) == 'Message2!'
    consumer = session.shared_consumer(name, durable=True)  # nothing left for anyone
    assert nothing_more(consumer, wait=QUIET)
    assert nothing_more(consumer2, wait=QUIET)
    durable_detach(consumer)
    durable_detach(consumer2)
    session.unsubscribe(name)


def test_a_shared_durable_consumer_with_a_selector_gets_the_first_match(
    session: JmsSession,
) -> None:
    name = subscription_name('createSharedDurableConsumerTopicTest2')
    consumer = session.shared_consumer(name, durable=True, selector=LAST_MESSAGE)
    consumer2 = session.shared_consumer(name, durable=True, selector=LAST_MESSAGE)
    send_batch(session, 'Message')
    assert receive_one(consumer) == f'Message {NUM_MESSAGES}'
    assert nothing_more(consumer2, wait=QUIET)
    durable_detach(consumer)
    durable_detach(consumer2)
    session.unsubscribe(name)


def test_consumers_of_a_queue_on_one_connection_are_served_oldest_first(
    broker: BrokerProcess, address: str
) -> None:
    """The same rule on a queue: two consumers with credit, the first message to the first."""
    conn = jms_connect(broker.url)
    producer = sender(conn, address, Capabilities('queue'))
    first = receiver(conn, address, Capabilities('queue'), credit=PREFETCH)
    second = receiver(conn, address, Capabilities('queue'), credit=PREFETCH)
    for body in ('one', 'two', 'three'):
        producer.send(Message(body=body))
    assert receive_one(first) == 'one'
    assert receive_one(second) == 'two'
    assert receive_one(first) == 'three'
    assert nothing_more(second, wait=QUIET)
    conn.close()
