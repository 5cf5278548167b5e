"""The bare message is forwarded byte for byte; only the header changes, and only on redelivery."""

import uuid

from amqpclient import RawCollector, connect, receiver, send_raw, sender, settle
from processes import BrokerProcess
from proton import Delivery, Message, byte, char, decimal64, int32, short, symbol, timestamp, ulong


def _jms_like_message(group_id: str | None = None) -> Message:
    """A message as Qpid JMS sends one, every property section filled; ungrouped unless
    ``group_id`` (a grouped message's first delivery to a consumer gains an annotation)."""
    return Message(
        id=uuid.UUID('12345678-1234-5678-1234-567812345678'),
        correlation_id=b'\x00\x01binary-correlation',
        user_id=b'alice',
        subject='JMSType',
        reply_to='replies',
        content_type='text/plain',
        creation_time=1_700_000_000.123,
        group_id=group_id,
        durable=True,
        priority=7,
        ttl=3600,
        annotations={
            symbol('x-opt-jms-msg-type'): byte(5),
            symbol('x-opt-jms-dest'): byte(0),
            symbol('x-opt-custom'): ulong(2**63),
        },
        properties={
            'int': int32(-5), 'short': short(7), 'char': char('x'), 'ts': timestamp(5),
            'dec': decimal64(3), 'list': [1, 'two'], 'map': {'k': 'v'}, 'bytes': b'\xff',
        },
        body='héllo ' * 100,
    )  # fmt: skip


def _raw_receiver(conn, address: str) -> RawCollector:  # type: ignore[no-untyped-def]
    collector = RawCollector()
    # keep the receiver referenced: proton's BlockingReceiver closes its link when collected
    collector.link = conn.create_receiver(
        address, credit=10, name=f'raw-{uuid.uuid4().hex[:8]}', handler=collector
    )
    return collector


def test_a_delivered_message_is_byte_for_byte_what_was_sent(
    broker: BrokerProcess, address: str
) -> None:
    payload = _jms_like_message().encode()
    conn = connect(broker.url)
    assert send_raw(conn, sender(conn, address), payload) == Delivery.ACCEPTED
    collector = _raw_receiver(conn, address)
    conn.wait(lambda: len(collector.transfers) == 1, timeout=10)
    assert collector.transfers[0] == payload
    decoded = Message()
    decoded.decode(collector.transfers[0])
    assert isinstance(decoded.annotations['x-opt-jms-msg-type'], byte)
    assert isinstance(decoded.id, uuid.UUID)
    # binary stays binary (proton's decoder hands binary over as a memoryview)
    assert bytes(decoded.correlation_id) == b'\x00\x01binary-correlation'
    conn.close()


def test_a_grouped_message_keeps_its_bare_message_and_gains_only_the_first_for_consumer_flag(
    broker: BrokerProcess, address: str
) -> None:
    sent = _jms_like_message(group_id='g')
    payload = sent.encode()
    bare = payload[payload.index(b'\x00\x53\x73') :]  # from the properties section on
    conn = connect(broker.url)
    assert send_raw(conn, sender(conn, address), payload) == Delivery.ACCEPTED
    collector = _raw_receiver(conn, address)
    conn.wait(lambda: len(collector.transfers) == 1, timeout=10)
    delivered = bytes(collector.transfers[0])
    assert delivered.endswith(bare)
    decoded = Message()
    decoded.decode(delivered)
    assert decoded.group_id == 'g'
    assert decoded.annotations == {**sent.annotations, symbol('JMSXGroupFirstForConsumer'): True}
    conn.close()


def test_a_redelivery_changes_only_the_header_delivery_count(
    broker: BrokerProcess, address: str
) -> None:
    original = _jms_like_message()
    payload = original.encode()
    conn = connect(broker.url)
    send_raw(conn, sender(conn, address), payload)
    rcv = receiver(conn, address, credit=1)
    rcv.receive(timeout=5)
    settle(rcv, Delivery.MODIFIED, failed=True)
    rcv.close()
    collector = _raw_receiver(conn, address)
    conn.wait(lambda: len(collector.transfers) == 1, timeout=10)
    again = collector.transfers[0]
    header_end = len(original.encode()) - len(_after_header(payload))
    assert _after_header(again) == payload[header_end:]  # annotations + bare message untouched
    decoded = Message()
    decoded.decode(again)
    assert (decoded.delivery_count, decoded.durable, decoded.priority) == (1, True, 7)
    assert decoded.ttl == original.ttl
    conn.close()


def _after_header(payload: bytes) -> bytes:
    """Everything after the header section (a described list 0x00 0x53 0x70 …)."""
    assert payload[:3] == b'\x00\x53\x70'
    code = payload[3]
    if code == 0x45:
        return payload[4:]
    if code == 0xC0:
        return payload[5 + payload[4] :]
    size = int.from_bytes(payload[4:8], 'big')
    return payload[8 + size :]
