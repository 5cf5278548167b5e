"""
Every limit with its documented error (docs/security.md), and other clients unaffected.
"""

from collections.abc import Callable
from pathlib import Path

import pytest
import redis as redis_lib
from amqpclient import (
    Capabilities,
    connect,
    receive_all,
    receiver,
    send_all,
    send_with_outcome,
    sender,
)
from enginepeer import EnginePeer
from jmswire import JmsSource, jms_connect, subscriber
from processes import BrokerProcess, RedisServer, wait_for
from proton import ConnectionException, Delivery, Endpoint, Message, Timeout, symbol
from proton.utils import BlockingConnection, LinkDetached
from testusers import PASSWORDS

LIMIT = 'amqp:resource-limit-exceeded'
Start = Callable[..., BrokerProcess]


def login(broker: BrokerProcess, user: str) -> BlockingConnection:
    return BlockingConnection(
        broker.url, timeout=10, user=user, password=PASSWORDS[user], allowed_mechs='PLAIN',
        allow_insecure_mechs=True,
    )  # fmt: skip


def works(conn: BlockingConnection, address: str, body: str) -> None:
    """The connection still sends and receives."""
    send_all(conn, address, [body])
    assert [m.body for m in receive_all(receiver(conn, address), 1)] == [body]


def test_max_connections(start_broker: Start, address: str) -> None:
    b = start_broker(env={'SHOAL_MAX_CONNECTIONS': '2'})
    first, second = connect(b.url), connect(b.url)
    with pytest.raises(ConnectionException, match=LIMIT):
        connect(b.url)
    works(first, f'{address}-1', 'first')
    works(second, f'{address}-2', 'second')
    first.close()
    third = connect(b.url)  # a freed place is taken again
    works(third, f'{address}-3', 'third')
    second.close()
    third.close()


def test_max_connections_per_user(start_broker: Start, users_file: Path, address: str) -> None:
    b = start_broker(
        env={'SHOAL_USERS_FILE': str(users_file), 'SHOAL_MAX_CONNECTIONS_PER_USER': '1'}
    )
    carol = login(b, 'carol')
    with pytest.raises(ConnectionException, match=LIMIT):
        login(b, 'carol')
    alice = login(b, 'alice')  # another user has places of their own
    works(alice, f'orders.{address}', 'alice')
    works(carol, address, 'carol')
    alice.close()
    carol.close()


def test_max_sessions_per_connection(start_broker: Start) -> None:
    b = start_broker(env={'SHOAL_MAX_SESSIONS_PER_CONNECTION': '2'})
    peer = EnginePeer(b.port)
    try:
        peer.connection.open()
        sessions = [peer.connection.session() for _ in range(3)]
        for s in sessions:
            s.open()
        answered = Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED
        peer.pump(10, until=lambda: all(s.state & answered for s in sessions))
        refused = sessions[2]
        assert refused.state & Endpoint.REMOTE_CLOSED
        assert refused.remote_condition.name == LIMIT
        assert all(s.state & Endpoint.REMOTE_ACTIVE for s in sessions[:2])
        assert peer.connection.state & Endpoint.REMOTE_ACTIVE  # the connection lives on
    finally:
        peer.close()


def test_too_many_sessions_pipelined_before_open_close_the_connection(
    start_broker: Start, address: str
) -> None:
    """A JMS-style Open (sole-connection: answered only once the ClientID is claimed) with more
    Begins pipelined behind it than allowed: proton cannot answer a session before our Open, so
    the connection is closed with the error instead."""
    b = start_broker(env={'SHOAL_MAX_SESSIONS_PER_CONNECTION': '2'})
    peer = EnginePeer(b.port)
    try:
        peer.connection.container = f'client-{address}'
        peer.connection.desired_capabilities = [symbol('sole-connection-for-container')]
        peer.connection.open()
        for _ in range(3):
            peer.connection.session().open()
        assert peer.pump(10, until=lambda: peer.remote_closed)
        assert peer.connection.remote_condition.name == LIMIT
    finally:
        peer.close()


def test_max_links_per_session(start_broker: Start, address: str) -> None:
    b = start_broker(env={'SHOAL_MAX_LINKS_PER_SESSION': '3'})
    conn = connect(b.url)
    try:
        senders = [sender(conn, f'{address}-{i}') for i in range(3)]
        with pytest.raises(LinkDetached, match=LIMIT):
            sender(conn, f'{address}-3')
        for i, snd in enumerate(senders):
            snd.send(Message(body=i))
        senders[0].close()
        sender(conn, f'{address}-4').send(Message(body='after one closed'))
    finally:
        conn.close()


def test_max_message_size(start_broker: Start, address: str) -> None:
    b = start_broker(env={'SHOAL_MAX_MESSAGE_SIZE': '2000'})
    conn = connect(b.url)
    try:
        big = sender(conn, address)
        small = sender(conn, address)
        with pytest.raises(Exception, match='amqp:link:message-size-exceeded'):
            big.send(Message(body='x' * 5000))
        small.send(Message(body='fits'))  # the other link on the same connection carries on
        assert [m.body for m in receive_all(receiver(conn, address), 1)] == ['fits']
    finally:
        conn.close()


def test_max_subscriptions_per_topic(start_broker: Start, address: str) -> None:
    b = start_broker(env={'SHOAL_MAX_SUBSCRIPTIONS_PER_TOPIC': '2'})
    conn = jms_connect(b.url, f'client-{address}')
    try:
        shared = subscriber(conn, address, 'shared-sub', JmsSource('topic', 'shared'))
        private = subscriber(conn, address, 'private', JmsSource('topic'))
        with pytest.raises(LinkDetached, match=LIMIT):
            subscriber(conn, address, 'one-too-many', JmsSource('topic'))
        # joining an existing subscription adds no subscription: allowed at the limit
        again = subscriber(conn, address, 'shared-sub|2', JmsSource('topic', 'shared'))
        send_all(conn, address, ['t'], Capabilities('topic'))
        assert [m.body for m in receive_all(private, 1)] == ['t']
        got = [m.body for rcv in (shared, again) for m in _all_now(rcv)]
        assert got == ['t']
    finally:
        conn.close()


def _all_now(rcv) -> list[Message]:  # type: ignore[no-untyped-def]
    out = []
    while True:
        try:
            out.append(rcv.receive(timeout=1))
            rcv.accept()
        except Exception:
            return out


def test_backlog_limit_rejects_publishes(start_broker: Start, address: str) -> None:
    b = start_broker(env={'SHOAL_MAX_BACKLOG_PER_ADDRESS': '3'})
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        outcomes = [send_with_outcome(conn, snd, Message(body=i)) for i in range(4)]
        assert outcomes[:3] == [(Delivery.ACCEPTED, None)] * 3
        assert outcomes[3] == (Delivery.REJECTED, LIMIT)
        works(conn, f'{address}-other', 'other address unaffected')
        assert [m.body for m in receive_all(receiver(conn, address), 3)] == [0, 1, 2]
    finally:
        conn.close()


def test_backlog_limit_drops_the_oldest(start_broker: Start, address: str) -> None:
    b = start_broker(
        env={'SHOAL_MAX_BACKLOG_PER_ADDRESS': '3', 'SHOAL_BACKLOG_OVERFLOW': 'drop-oldest'}
    )
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        outcomes = [send_with_outcome(conn, snd, Message(body=i)) for i in range(5)]
        assert outcomes == [(Delivery.ACCEPTED, None)] * 5
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 3)] == [2, 3, 4]
        assert _all_now(rcv) == []
    finally:
        conn.close()


def test_a_drained_backlog_takes_publishes_again_before_the_next_trim(
    start_broker: Start, address: str
) -> None:
    # consumed entries stay in the stream until the periodic trim (an hour here): they must not
    # count against the limit meanwhile
    b = start_broker(
        env={'SHOAL_MAX_BACKLOG_PER_ADDRESS': '3', 'SHOAL_TRIM_INTERVAL_SECONDS': '3600'}
    )
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        assert [send_with_outcome(conn, snd, Message(body=i)) for i in range(3)] == [
            (Delivery.ACCEPTED, None)
        ] * 3
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 3)] == [0, 1, 2]
        rcv.close()
        outcomes = [send_with_outcome(conn, snd, Message(body=i)) for i in range(3, 7)]
        assert outcomes == [(Delivery.ACCEPTED, None)] * 3 + [(Delivery.REJECTED, LIMIT)]
        assert [m.body for m in receive_all(receiver(conn, address), 3)] == [3, 4, 5]
    finally:
        conn.close()


def test_drop_oldest_drops_nothing_for_entries_already_consumed(
    start_broker: Start, address: str
) -> None:
    # three consumed high-priority entries, untrimmed, once made room for new normal-priority
    # ones by dropping the new ones (the normal band is trimmed first)
    b = start_broker(
        env={
            'SHOAL_MAX_BACKLOG_PER_ADDRESS': '3',
            'SHOAL_BACKLOG_OVERFLOW': 'drop-oldest',
            'SHOAL_TRIM_INTERVAL_SECONDS': '3600',
        }
    )
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        for i in range(3):
            assert send_with_outcome(conn, snd, Message(body=f'high {i}', priority=9)) == (
                Delivery.ACCEPTED, None
            )  # fmt: skip
        rcv = receiver(conn, address)
        assert len(receive_all(rcv, 3)) == 3
        rcv.close()
        for i in range(3):
            assert send_with_outcome(conn, snd, Message(body=f'normal {i}')) == (
                Delivery.ACCEPTED, None
            )  # fmt: skip
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 3)] == ['normal 0', 'normal 1', 'normal 2']
        assert _all_now(rcv) == []
    finally:
        conn.close()


def test_memory_ceiling_withholds_producer_credit(
    start_broker: Start, broker: BrokerProcess, address: str
) -> None:
    """A ceiling below what the process already uses: no producer gets credit, consumers work."""
    filler = connect(broker.url)  # another replica, without a ceiling, fills the queue
    send_all(filler, address, ['stored before'])
    filler.close()
    b = start_broker(env={'SHOAL_MEMORY_CEILING_MB': '1'})
    conn = connect(b.url)
    try:
        snd = sender(conn, f'{address}-new')
        with pytest.raises(Timeout):  # no credit for 1.5 s
            conn.wait(lambda: snd.link.credit != 0, timeout=1.5)
        assert [m.body for m in receive_all(receiver(conn, address), 1)] == ['stored before']
    finally:
        conn.close()
    assert 'over the ceiling: producers paused' in b.log()


def test_redis_maxmemory_refuses_producers_and_loses_nothing_accepted(
    start_broker: Start, address: str
) -> None:
    redis = RedisServer(None, '--maxmemory', '24mb', '--maxmemory-policy', 'noeviction')
    try:
        b = start_broker(
            redis_url=redis.url,
            env={'SHOAL_TRIM_INTERVAL_SECONDS': '0.5'},
        )
        conn = connect(b.url)
        snd = sender(conn, address)
        accepted, refusal = [], None
        for i in range(3000):  # 20 KB each: the watermark (90 %) is reached well before
            state, condition = send_with_outcome(conn, snd, Message(body=f'{i:05d}' + 'x' * 20000))
            if state != Delivery.ACCEPTED:
                refusal = (state, condition)
                break
            accepted.append(i)
        assert refusal == (Delivery.REJECTED, LIMIT)
        assert accepted
        # every accepted message is there, once, in order
        rcv = receiver(conn, address, credit=50)
        got = [int(m.body[:5]) for m in receive_all(rcv, len(accepted))]
        assert got == accepted
        # consumed and trimmed, the memory is free again: producers are accepted again
        wait_for(lambda: send_with_outcome(conn, snd, Message(body='again'))[0]
                 == Delivery.ACCEPTED, 30, 'publishing after the backlog was consumed')  # fmt: skip
        conn.close()
    finally:
        redis.stop()


def test_entries_a_full_redis_would_not_take_back_are_returned_once_it_has_room(
    start_broker: Start, address: str
) -> None:
    """A consumer goes away while Redis refuses writes: giving its unsettled entries back fails,
    and they stay pending on this replica (nothing else would return them while it lives) until
    a retry gets through once Redis has room again."""
    redis = RedisServer(None, '--maxmemory-policy', 'noeviction')
    admin = redis_lib.Redis.from_url(redis.url)
    try:
        b = start_broker(redis_url=redis.url, env={'SHOAL_REDIS_MEMORY_HIGH_WATERMARK': '0'})
        conn = connect(b.url)
        send_all(conn, address, [f'held {i}' for i in range(5)])
        holder = receiver(conn, address, credit=5)
        held = [holder.receive(timeout=10).body for _ in range(5)]  # out, never settled
        # A limit of one byte refuses every write. Filled with messages up to a real limit, it
        # sat just under it once the refused one's buffer was freed, and a small write could
        # get through (19 of 20 tries by hand).
        admin.config_set('maxmemory', 1)
        holder.close()  # its five entries go back: Redis refuses
        wait_for(lambda: 'failed' in b.log() and 'again in' in b.log(), 10, 'a refused release')
        admin.config_set('maxmemory', 0)  # room again
        again = receiver(conn, address, credit=5)
        got = [again.receive(timeout=10) for _ in range(5)]
        assert sorted(m.body for m in got) == sorted(held)
        assert all(m.delivery_count >= 1 for m in got)  # handed out before: redelivered
        conn.close()
    finally:
        admin.close()
        redis.stop()


def test_redis_refusing_a_write_refuses_the_message(start_broker: Start, address: str) -> None:
    """Without the watermark, Redis's own OOM error still becomes resource-limit-exceeded
    (rejected, never released as if it might be retried into the same wall)."""
    redis = RedisServer(None, '--maxmemory', '3mb', '--maxmemory-policy', 'noeviction')
    try:
        b = start_broker(redis_url=redis.url, env={'SHOAL_REDIS_MEMORY_HIGH_WATERMARK': '0'})
        conn = connect(b.url)
        snd = sender(conn, address)
        outcome = None
        for i in range(1000):
            outcome = send_with_outcome(conn, snd, Message(body=f'{i:05d}' + 'x' * 20000))
            if outcome[0] != Delivery.ACCEPTED:
                break
        assert outcome == (Delivery.REJECTED, LIMIT)
        conn.close()
    finally:
        redis.stop()
