"""
Big messages (``store/bodies.py``): bodies kept beside the Lua scripts come back whole through a
queue, a redelivery, a dead-letter, a browse, and no
body is left in Redis once their messages are consumed or expired.
"""

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from amqpclient import Browse, connect, receive_all, receiver, send_all, settle
from processes import BrokerProcess, wait_for
from proton import Delivery, Message

from shoal_broker.store import keys

SIZES = (64 * 1024, 1024 * 1024)
DLQ = 'big-bodies-dlq'


def body(size: int) -> bytes:
    seed = uuid.uuid4().bytes
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def brokers(start_broker: Callable[..., BrokerProcess]) -> list[BrokerProcess]:
    """Two replicas that trim often and dead-letter a message after two failed attempts."""
    env = {
        'SHOAL_TRIM_INTERVAL_SECONDS': '0.2',
        'SHOAL_MAX_DELIVERY_ATTEMPTS': '2',
        'SHOAL_DEAD_LETTER_ADDRESS': DLQ,
    }
    return [start_broker(env=env, replica_id=f'big-{i}-{uuid.uuid4().hex[:6]}') for i in range(2)]


def no_bodies_left(store_client: Any, *addresses: str) -> None:
    """Every body of ``addresses`` is dropped (by the next trims)."""

    def left() -> bool:
        return all(
            store_client.exists(keys.AddressKeys.of(a).bodies, keys.AddressKeys.of(a).body_index)
            == 0
            for a in addresses
        )

    wait_for(left, 15, 'the bodies to be dropped')


def bodies_held(store_client: Any, address: str) -> int:
    return int(store_client.hlen(keys.AddressKeys.of(address).bodies))


@pytest.mark.parametrize('size', SIZES)
def test_a_big_message_goes_through_a_queue_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str, size: int
) -> None:
    payloads = [body(size) for _ in range(3)]
    conn = connect(brokers[0].url)
    send_all(conn, address, payloads)
    assert bodies_held(store_client, address) == 3
    rcv = receiver(conn, address, credit=5)
    assert [bytes(m.body) for m in receive_all(rcv, 3)] == payloads
    conn.close()
    no_bodies_left(store_client, address)


def test_a_big_message_is_redelivered_and_dead_lettered_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    payload = body(1024 * 1024)
    conn = connect(brokers[0].url)
    send_all(conn, address, [payload])
    rcv = receiver(conn, address, credit=1)
    for attempt in range(2):
        got = rcv.receive(timeout=10)
        assert bytes(got.body) == payload
        assert got.delivery_count == attempt
        settle(rcv, Delivery.MODIFIED, failed=True)
    dead = receiver(conn, DLQ, credit=1)
    [got] = receive_all(dead, 1)
    assert bytes(got.body) == payload
    conn.close()
    no_bodies_left(store_client, address)


def test_a_browser_sees_a_big_message_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    payload = body(64 * 1024)
    conn = connect(brokers[0].url)
    send_all(conn, address, [payload])
    browser = receiver(conn, address, Browse(), credit=5)
    seen = browser.receive(timeout=10)
    assert bytes(seen.body) == payload
    rcv = receiver(conn, address, credit=1)
    [got] = receive_all(rcv, 1)
    assert bytes(got.body) == payload
    conn.close()
    no_bodies_left(store_client, address)


def test_an_expired_big_message_leaves_no_body(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    conn = connect(brokers[0].url)
    snd = conn.create_sender(address)
    snd.send(Message(body=body(64 * 1024), ttl=0.2))
    kept = body(64 * 1024)
    snd.send(Message(body=kept))
    time.sleep(0.5)
    rcv = receiver(conn, address, credit=5)
    [got] = receive_all(rcv, 1)
    assert bytes(got.body) == kept
    conn.close()
    no_bodies_left(store_client, address)
