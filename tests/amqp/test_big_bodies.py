"""
Big messages (``store/bodies.py``): bodies kept beside the Lua scripts come back whole through a
queue, a redelivery, a dead-letter, a browse, the management API (browse, move, purge) and a
topic's subscriptions on two replicas; no body is left in Redis once their messages are
consumed, moved, purged or expired.
"""

import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from amqpclient import Browse, Capabilities, connect, receive_all, receiver, send_all, settle
from jmswire import JmsSource
from mgmtapi import Api, quoted
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message, Timeout
from proton.utils import SendException
from txnclient import Controller, accept_in, send_in

from shoal_broker.store import keys

SIZES = (64 * 1024, 1024 * 1024)
TOPIC = Capabilities('topic')
SHARED_DURABLE = JmsSource('topic', 'shared', 'global', durable=True)


def body(size: int) -> str:
    """A text body of ``size`` characters, different each time (text: proton hands a binary
    body out as a view of its own buffer, which the next delivery may reuse)."""
    seed = uuid.uuid4().hex
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def dlq(address: str) -> str:
    return f'{address}-dlq'


@pytest.fixture
def brokers(start_broker: Callable[..., BrokerProcess], dlq: str) -> list[BrokerProcess]:
    """Two replicas that trim often and dead-letter a message after two failed attempts."""
    env = {
        'SHOAL_TRIM_INTERVAL_SECONDS': '0.2',
        'SHOAL_MAX_DELIVERY_ATTEMPTS': '2',
        'SHOAL_DEAD_LETTER_ADDRESS': dlq,
    }
    return [start_broker(env=env, replica_id=f'big-{i}-{uuid.uuid4().hex[:6]}') for i in range(2)]


def no_bodies_left(store_client: Any, *addresses: str) -> None:
    """Every body of ``addresses`` is dropped (by the next trims)."""

    def left() -> bool:
        return not any(
            store_client.exists(keys.AddressKeys.of(a).body_index) or bodies_held(store_client, a)
            for a in addresses
        )

    wait_for(left, 15, 'the bodies to be dropped')


def bodies_held(store_client: Any, address: str) -> int:
    pattern = keys.AddressKeys.of(address).body('*')
    return sum(1 for _ in store_client.scan_iter(match=pattern, count=1000))


@pytest.mark.parametrize('size', SIZES)
def test_a_big_message_goes_through_a_queue_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str, size: int
) -> None:
    payloads = [body(size) for _ in range(3)]
    conn = connect(brokers[0].url)
    send_all(conn, address, payloads)
    assert bodies_held(store_client, address) == 3
    rcv = receiver(conn, address, credit=5)
    assert taken(rcv, 3) == payloads
    conn.close()
    no_bodies_left(store_client, address)


def test_a_big_message_is_redelivered_and_dead_lettered_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str, dlq: str
) -> None:
    payload = body(1024 * 1024)
    conn = connect(brokers[0].url)
    send_all(conn, address, [payload])
    rcv = receiver(conn, address, credit=1)
    for attempt in range(2):
        got = rcv.receive(timeout=10)
        assert got.body == payload
        assert got.delivery_count == attempt
        settle(rcv, Delivery.MODIFIED, failed=True)
    dead = receiver(conn, dlq, credit=1)
    [got] = receive_all(dead, 1)
    assert got.body == payload
    conn.close()
    no_bodies_left(store_client, address, dlq)


def test_a_browser_sees_a_big_message_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    payload = body(64 * 1024)
    conn = connect(brokers[0].url)
    send_all(conn, address, [payload])
    browser = receiver(conn, address, Browse(), credit=5)
    seen = browser.receive(timeout=10)
    assert seen.body == payload
    rcv = receiver(conn, address, credit=1)
    [got] = receive_all(rcv, 1)
    assert got.body == payload
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
    assert got.body == kept
    conn.close()
    no_bodies_left(store_client, address)


def test_the_management_api_shows_moves_and_purges_big_messages_whole(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    texts = [body(64 * 1024), body(1024 * 1024), body(64 * 1024)]
    target, purged = f'{address}-moved', f'{address}-purged'
    conn = connect(brokers[0].url)
    send_all(conn, address, texts)
    send_all(conn, purged, texts[:2])
    moved = receiver(conn, target, credit=5)  # the target queue exists
    api = Api(brokers[1])
    shown = api.get(f'/queues/{quoted(address)}/messages')['messages']
    assert [(m['body']['kind'], m['body']['size']) for m in shown] == [
        ('text', len(t)) for t in texts
    ]
    assert api.post(f'/queues/{quoted(address)}/move', {'target': target})['moved'] == 3
    assert api.post(f'/queues/{quoted(purged)}/purge')['purged'] == 2
    assert taken(moved, 3) == texts
    conn.close()
    no_bodies_left(store_client, address, target, purged)


def taken(rcv: Any, count: int) -> list[str]:
    """``count`` bodies, each accepted."""
    return [m.body for m in receive_all(rcv, count)]


def test_a_topics_subscriptions_get_big_messages_whole_on_two_replicas(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    """A shared durable subscription with a consumer on each replica and a plain one: each
    message whole to one consumer of the first and to the second."""
    conns = [connect(b.url) for b in brokers]
    shared = [
        c.create_receiver(address, name=f'{address}|global', credit=10, options=[SHARED_DURABLE])
        for c in conns
    ]
    plain = receiver(conns[0], address, TOPIC, credit=10)
    payloads = [body(64 * 1024) for _ in range(4)] + [body(1024 * 1024)]
    send_all(conns[1], address, payloads, TOPIC)
    assert sorted(taken(plain, len(payloads))) == sorted(payloads)
    got: list[str] = []
    for _ in range(200):  # bounded: each turn waits at most a second
        for rcv in shared:
            while rcv.fetcher.has_message and len(got) < len(payloads):
                got.append(rcv.receive(timeout=1).body)
                rcv.accept()
        if len(got) == len(payloads):
            break
        for c in conns:
            with contextlib.suppress(Timeout):
                c.wait(lambda: any(r.fetcher.has_message for r in shared), timeout=0.5)
    assert sorted(got) == sorted(payloads)
    for c in conns:
        c.close()
    no_bodies_left(store_client, address)


def test_replicated_accepts_a_big_message_once_a_replica_has_its_body(address: str) -> None:
    """``SHOAL_DURABILITY=replicated``: the body's ``SET`` goes in the publish's ``MULTI``,
    before the pipeline's ``WAIT``, so an accepted message's body is on the replica too."""
    primary = RedisServer()
    replica = RedisServer(None, '--replicaof', '127.0.0.1', str(primary.port))
    b = BrokerProcess(primary.url, env={'SHOAL_DURABILITY': 'replicated'})
    try:
        payload = body(1024 * 1024)
        conn = connect(b.url)
        snd = conn.create_sender(address)
        for attempt in range(50):  # the replica's first sync may take a moment
            try:
                snd.send(Message(body=payload, durable=True))
                break
            except SendException:
                assert attempt < 49
        copy = redis.Redis(port=replica.port)
        assert bodies_held(copy, address) == 1  # there once accepted: no wait
        copy.close()
        assert taken(receiver(conn, address, credit=1), 1) == [payload]
        conn.close()
    finally:
        b.stop()
        replica.stop()
        primary.stop()


def test_a_transaction_sends_a_big_message_whole_and_acks_a_stored_one(
    brokers: list[BrokerProcess], store_client: Any, address: str
) -> None:
    """A transaction's sends keep their bodies in the commit's script; its acks settle entries
    stored beside, whose bodies go with the next trims."""
    stored, sent = body(1024 * 1024), body(64 * 1024)
    target = f'{address}-txn'
    conn = connect(brokers[0].url)
    send_all(conn, address, [stored])
    controller = Controller(conn)
    txn = controller.declare()
    rcv = receiver(conn, address, credit=1)
    assert rcv.receive(timeout=10).body == stored
    accept_in(rcv, txn)
    send_in(conn, conn.create_sender(target), txn, sent)
    assert controller.discharge(txn, fail=False).remote_state == Delivery.ACCEPTED
    assert taken(receiver(conn, target, credit=1), 1) == [sent]
    conn.close()
    no_bodies_left(store_client, address, target)


@pytest.fixture
def untrimmed(start_broker: Callable[..., BrokerProcess]) -> list[BrokerProcess]:
    """Two replicas whose trim pass does not come round while a test runs."""
    env = {'SHOAL_TRIM_INTERVAL_SECONDS': '3600'}
    return [start_broker(env=env, replica_id=f'big-{i}-{uuid.uuid4().hex[:6]}') for i in range(2)]


def test_consumed_bodies_go_as_they_are_accepted_not_at_the_trim_pass(
    untrimmed: list[BrokerProcess], store_client: Any, address: str
) -> None:
    """Sent through one replica, consumed on the other: the bodies of the messages accepted go
    with their acks (store/body_trims.py), those still queued stay, and every message arrives
    whole once."""
    producing, consuming = (connect(b.url) for b in untrimmed)
    payloads = [body(256 * 1024) for _ in range(6)]
    send_all(producing, address, payloads)
    assert bodies_held(store_client, address) == 6
    first = receiver(consuming, address, credit=4)
    got = taken(first, 4)
    wait_for(lambda: bodies_held(store_client, address) == 2, 15, 'the accepted ones to go')
    time.sleep(0.5)
    assert bodies_held(store_client, address) == 2  # the two not consumed stay
    first.close()
    got += taken(receiver(consuming, address, credit=2), 2)
    assert got == payloads
    wait_for(lambda: bodies_held(store_client, address) == 0, 15, 'the rest to go')
    producing.close()
    consuming.close()


def test_a_body_stays_while_another_subscription_still_needs_it(
    untrimmed: list[BrokerProcess], store_client: Any, address: str
) -> None:
    """A topic's two subscriptions on two replicas: one accepting every message deletes no body
    the other has not consumed; once it has, they go."""
    conns = [connect(b.url) for b in untrimmed]
    fast = receiver(conns[0], address, TOPIC, credit=10)
    slow = receiver(conns[1], address, TOPIC, credit=1)
    payloads = [body(64 * 1024) for _ in range(4)]
    send_all(conns[0], address, payloads, TOPIC)
    assert taken(fast, 4) == payloads
    time.sleep(1.0)  # the fast one's acks answered and its trims run
    assert bodies_held(store_client, address) == 4
    assert taken(slow, 1) == payloads[:1]
    slow.flow(3)
    assert taken(slow, 3) == payloads[1:]
    wait_for(lambda: bodies_held(store_client, address) == 0, 15, 'the bodies to go')
    for c in conns:
        c.close()
