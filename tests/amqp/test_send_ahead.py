"""
At-least-once messages sent to a waiting consumer on the publishing replica while Redis stores
them (``LocalSubscription.ahead``): the consumer has the message before Redis answers, the
producer is answered only after, and whatever the consumer decides meanwhile is applied once
Redis has named the entry. Redis is frozen (SIGSTOP) to hold a claim open for as long as a test
needs, so these tests run on a Redis and broker of their own.
"""

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from amqpclient import connect, drain, flush, nothing_more, receive_all, receiver, sender, settle
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Described, Message, ulong
from txnclient import Controller, accept_in

from shoal_broker.store import keys

TIMEOUT = 10.0
REPLICA = 'ahead-a'
"""The module's broker (``ahead_broker``)."""


@pytest.fixture(scope='module')
def frozen_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.process.send_signal(signal.SIGCONT)  # a failed test may have left it stopped
    server.stop()


@pytest.fixture(scope='module')
def ahead_broker(frozen_redis: RedisServer) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(frozen_redis.url, replica_id=REPLICA)
    yield broker
    broker.stop()


class Frozen:
    """Redis stopped for the ``with`` block, and running again after it."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def __enter__(self) -> None:
        self.server.process.send_signal(signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        self.server.process.send_signal(signal.SIGCONT)


def _client(server: RedisServer) -> Any:
    return redis.Redis.from_url(server.url)


def _stream(address: str) -> str:
    return f'shoal:{{a:{address}}}:p:5'


def _pending(server: RedisServer, address: str) -> int:
    """Entries of the queue delivered to a replica and not yet acked."""
    client = _client(server)
    try:
        return int(client.xpending(_stream(address), 'queue')['pending'])
    finally:
        client.close()


def _added(server: RedisServer, address: str) -> int:
    client = _client(server)
    try:
        return int(client.xinfo_stream(_stream(address))['entries-added'])
    except redis.ResponseError:  # no such key: nothing was ever added
        return 0
    finally:
        client.close()


def _start_send(conn: Any, snd: Any, body: Any) -> Delivery:
    """Send one message without waiting for its outcome."""
    conn.wait(lambda: snd.link.credit > 0, timeout=TIMEOUT, msg='credit')
    delivery = snd.link.delivery(str(time.monotonic_ns()))
    snd.link.send(Message(body=body).encode())
    snd.link.advance()
    flush(conn)
    return cast(Delivery, delivery)


@contextlib.contextmanager
def _sent_ahead(
    server: RedisServer, producing: Any, consuming: Any, address: str, body: str
) -> Iterator[tuple[Any, Delivery, Message]]:
    """A waiting consumer on ``consuming`` and a message sent to it from ``producing`` while
    Redis is stopped: (receiver, the producer's delivery, the message received) inside the
    block, Redis still stopped."""
    rcv = _waiting_consumer(server, consuming, address)
    snd = sender(producing, address)
    with Frozen(server):
        delivery = _start_send(producing, snd, body)
        got = rcv.receive(timeout=5)  # Redis cannot have answered: it is stopped
        assert got.body == body
        yield rcv, delivery, got


def _waiting_consumer(
    server: RedisServer, conn: Any, address: str, credit: int = 10, replica: str = REPLICA
) -> Any:
    """A consumer whose subscription found the queue empty and fetches no more until something
    is announced: the next message may go ahead. Seen, not slept on: the broker (``replica``)
    lists itself among the address's watchers and then looks once more, and it answers a drain
    only once a fetch came back short, after that look (amqp/subscriptions.py)."""
    rcv = receiver(conn, address, credit=0)
    key = keys.AddressKeys.of(address).watchers
    client = _client(server)
    try:
        wait_for(lambda: client.hexists(key, replica), TIMEOUT, 'watching the address')
    finally:
        client.close()
    drain(conn, rcv, credit)
    assert not rcv.fetcher.has_message  # the queue was empty
    rcv.link.flow(credit)
    flush(conn)
    return rcv


def test_the_consumer_has_the_message_before_redis_answers_and_the_producer_after(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    conn = connect(ahead_broker.url)
    with _sent_ahead(frozen_redis, conn, conn, address, 'ahead') as (rcv, delivery, got):
        assert not delivery.settled  # the producer waits for the store
        assert got.delivery_count == 0
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='the producer answered')
    assert delivery.remote_state == Delivery.ACCEPTED
    assert _added(frozen_redis, address) == 1  # stored all the same
    wait_for(lambda: _pending(frozen_redis, address) == 1, 5, 'claimed by this replica')
    rcv.accept()
    flush(conn)
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'the accept applied')
    assert nothing_more(rcv)
    conn.close()


def test_a_second_message_goes_ahead_while_the_first_claim_is_out_and_a_third_waits(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """Two claims may be in flight: a message that comes while Redis has not answered the last
    claim goes ahead too; one more waits for the store (publish and fetch), in order."""
    conn = connect(ahead_broker.url)
    rcv = _waiting_consumer(frozen_redis, conn, address)
    snd = sender(conn, address)
    with Frozen(frozen_redis):
        deliveries = [_start_send(conn, snd, 'first')]
        assert rcv.receive(timeout=5).body == 'first'
        deliveries.append(_start_send(conn, snd, 'second'))
        assert rcv.receive(timeout=5).body == 'second'  # Redis cannot have answered the first
        deliveries.append(_start_send(conn, snd, 'third'))
        assert nothing_more(rcv, wait=0.5)  # two claims out: this one goes through the store
    assert rcv.receive(timeout=TIMEOUT).body == 'third'
    conn.wait(lambda: all(d.settled for d in deliveries), timeout=TIMEOUT, msg='all answered')
    assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
    for _ in range(3):
        rcv.accept()
    flush(conn)
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'all three acked')
    assert _added(frozen_redis, address) == 3
    assert nothing_more(rcv)
    conn.close()


def test_an_accept_before_redis_answers_is_applied_once_it_does(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    conn = connect(ahead_broker.url)
    with _sent_ahead(frozen_redis, conn, conn, address, 'accepted early') as (rcv, delivery, _):
        rcv.accept()  # before the store has even named the entry
        flush(conn)
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='the producer answered')
    wait_for(
        lambda: _added(frozen_redis, address) == 1 and _pending(frozen_redis, address) == 0,
        5,
        'stored, claimed and acked',
    )
    assert nothing_more(rcv, wait=0.5)  # never delivered again
    conn.close()


@pytest.mark.parametrize(
    ('state', 'failures'),
    [(Delivery.RELEASED, 0), (Delivery.MODIFIED, 1)],
    ids=['released', 'modified-delivery-failed'],
)
def test_a_message_given_back_before_redis_answers_comes_again(
    frozen_redis: RedisServer,
    ahead_broker: BrokerProcess,
    address: str,
    state: int,
    failures: int,
) -> None:
    conn = connect(ahead_broker.url)
    with _sent_ahead(frozen_redis, conn, conn, address, 'back') as (rcv, _, _):
        settle(rcv, state, failed=True)
        flush(conn)
    again = rcv.receive(timeout=TIMEOUT)
    assert again.body == 'back'
    assert again.delivery_count == failures  # JMSRedelivered after a failed attempt
    rcv.accept()
    flush(conn)
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'the second accept applied')
    assert nothing_more(rcv)
    conn.close()


def test_a_consumer_gone_before_redis_answers_leaves_its_message_for_the_next(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    producing = connect(ahead_broker.url)
    consuming = connect(ahead_broker.url)
    with _sent_ahead(frozen_redis, producing, consuming, address, 'orphan') as (rcv, delivery, _):
        rcv.close()  # unsettled: it goes back as modified(delivery-failed)
    producing.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='the producer answered')
    assert delivery.remote_state == Delivery.ACCEPTED
    later = receiver(consuming, address)
    again = later.receive(timeout=TIMEOUT)
    assert (again.body, again.delivery_count) == ('orphan', 1)
    later.accept()
    flush(consuming)
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'accepted the second time')
    producing.close()
    consuming.close()


@pytest.mark.parametrize('commit', [True, False], ids=['commit', 'rollback'])
def test_a_transactional_accept_before_redis_answers_waits_for_its_discharge(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str, commit: bool
) -> None:
    conn = connect(ahead_broker.url)
    controller = Controller(conn)
    txn = controller.declare()
    with _sent_ahead(frozen_redis, conn, conn, address, 'in a transaction') as (rcv, _, _):
        accept_in(rcv, txn)
        flush(conn)
    wait_for(lambda: _pending(frozen_redis, address) == 1, 5, 'stored and claimed')
    assert nothing_more(rcv)  # held by the transaction, not given back
    assert controller.discharge(txn, fail=not commit).remote_state == Delivery.ACCEPTED
    if commit:
        wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'acked by the commit')
        assert nothing_more(rcv)
    else:
        again = rcv.receive(timeout=TIMEOUT)
        assert (again.body, again.delivery_count) == ('in a transaction', 1)
        rcv.accept()
        flush(conn)
    conn.close()


def test_a_commit_sent_before_redis_answers_the_send_still_takes_the_accept(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """Receive, accept in a transaction and commit, all before the store has named the entry:
    the discharge waits for it, so the commit acks it instead of finding the transaction's
    accept missing and the message coming back."""
    conn = connect(ahead_broker.url)
    controller = Controller(conn)
    txn = controller.declare()
    with _sent_ahead(frozen_redis, conn, conn, address, 'committed early') as (rcv, _, _):
        accept_in(rcv, txn)
        discharge = controller.link.delivery(b'discharge')
        controller.link.send(Message(body=Described(ulong(0x32), [txn, False])).encode())
        controller.link.advance()
        flush(conn)
    conn.wait(lambda: discharge.settled, timeout=TIMEOUT, msg='the discharge answered')
    assert discharge.remote_state == Delivery.ACCEPTED
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'acked by the commit')
    assert nothing_more(rcv, wait=0.5)  # not given back as if rolled back
    conn.close()


def test_entries_another_replica_appended_unannounced_follow_the_message_sent_ahead(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """Entries appended without a notification (as another replica's would be, within the
    notification's delay) sit ahead of the message in the stream: the claim reads them too, more
    than one read's worth, and they are delivered right after it, neither stranded nor delivered
    twice."""
    count = 600  # past the claim's 500 entries per read
    conn = connect(ahead_broker.url)
    rcv = _waiting_consumer(frozen_redis, conn, address)
    client = _client(frozen_redis)
    try:
        for i in range(count):  # messages with no header section
            client.xadd(_stream(address), {'h': b'', 'r': Message(body=i).encode()})
    finally:
        client.close()
    sender(conn, address).send(Message(body='sent here'))
    bodies = [m.body for m in receive_all(rcv, count + 1)]
    assert bodies == ['sent here', *range(count)]
    assert nothing_more(rcv, wait=0.5)
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'all accepted')
    conn.close()


def test_a_message_redis_refuses_is_refused_to_its_producer_though_sent_ahead(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """The one case where the consumer sees what the producer is told was not taken: Redis at
    maxmemory refuses the append after the message went out. The producer may send it again (a
    duplicate, which at-least-once allows); nothing is lost, and the consumer's accept of a
    message that was never stored is harmless."""
    conn = connect(ahead_broker.url)
    rcv = _waiting_consumer(frozen_redis, conn, address)
    snd = sender(conn, address)
    client = _client(frozen_redis)
    try:
        client.config_set('maxmemory', 1)
        try:
            delivery = _start_send(conn, snd, 'refused')
            assert rcv.receive(timeout=5).body == 'refused'
            conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='the producer answered')
        finally:
            client.config_set('maxmemory', 0)
    finally:
        client.close()
    assert delivery.remote_state == Delivery.REJECTED
    condition = delivery.remote.condition
    assert condition is not None
    assert condition.name == 'amqp:resource-limit-exceeded'
    rcv.accept()
    flush(conn)
    assert _added(frozen_redis, address) == 0
    snd.send(Message(body='after'))  # the queue works on
    assert [m.body for m in receive_all(rcv, 1)] == ['after']
    conn.close()


def _lane_connection(client: Any) -> str:
    """The id of the broker's connection that carried its last publish: its store's lane,
    which carries the fetches too. A publish goes as EVAL; nothing else of the broker's does."""
    [lane] = [c['id'] for c in client.client_list() if c['cmd'] == 'eval']
    return str(lane)


def _waits_in_redis(client: Any, connection: str) -> bool:
    """The connection's command is held by CLIENT PAUSE (flag ``b``, blocked)."""
    return any(c['id'] == connection and 'b' in c['flags'] for c in client.client_list())


def test_a_message_published_after_a_failed_fetch_does_not_pass_what_is_stored(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """A fetch whose connection was cut while Redis held it (CLIENT PAUSE, then CLIENT KILL)
    leaves the subscription not knowing what is stored. Until a fetch comes back short, a
    message published here is stored behind what is there, not sent ahead of it
    (``_exhausted``); the retry then delivers them all in order."""
    conn = connect(ahead_broker.url)
    snd = sender(conn, address)
    for body in range(5):
        snd.send(Message(body=body))  # nobody consumes yet: stored
    rcv = receiver(conn, address, credit=0)  # no credit: nothing fetched
    client = _client(frozen_redis)
    try:
        lane = _lane_connection(client)
        client.client_pause(int(TIMEOUT * 1000), all=False)  # writes wait in Redis, fetches too
        try:
            rcv.link.flow(10)
            flush(conn)
            wait_for(lambda: _waits_in_redis(client, lane), 5, 'the fetch waits in Redis')
            client.client_kill_filter(_type='normal', skipme=True)
        finally:
            client.client_unpause()
    finally:
        client.close()
    failed = f'fetch from {address}/queue failed'
    wait_for(lambda: failed in ahead_broker.log(), TIMEOUT, 'the fetch failed')
    delivery = _start_send(conn, snd, 5)  # before the retry (0.25 s after the failure)
    assert [m.body for m in receive_all(rcv, 6)] == list(range(6))
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='the producer answered')
    assert delivery.remote_state == Delivery.ACCEPTED
    assert nothing_more(rcv)
    conn.close()


def test_order_holds_when_a_slow_consumer_mixes_sent_ahead_and_fetched_messages(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """A producer sending without waiting to a consumer with a prefetch of three: some messages
    go ahead, the rest are stored and fetched when credit comes back."""
    count = 1500
    conn = connect(ahead_broker.url)
    rcv = _waiting_consumer(frozen_redis, conn, address, credit=3)
    snd = sender(conn, address)
    deliveries, received = [], []
    for body in range(count):
        deliveries.append(_start_send(conn, snd, body))
        if body % 7 == 0:  # now and then, read one while sending
            received.append(rcv.receive(timeout=TIMEOUT).body)
            rcv.accept()
    received += [m.body for m in receive_all(rcv, count - len(received))]
    conn.wait(lambda: all(d.settled for d in deliveries), timeout=TIMEOUT, msg='all answered')
    assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
    assert received == list(range(count))
    assert nothing_more(rcv)
    wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'everything acked')
    conn.close()


def test_producers_and_consumers_on_two_replicas_get_every_message_once(
    frozen_redis: RedisServer, ahead_broker: BrokerProcess, address: str
) -> None:
    """Each replica sends its own producer's messages ahead to its own consumer and claims what
    the other appended meanwhile; the other's fetches take the rest."""
    other = BrokerProcess(frozen_redis.url, replica_id='ahead-b')
    count = 400
    try:
        conns = [connect(ahead_broker.url), connect(other.url)]
        receivers = [
            _waiting_consumer(frozen_redis, conn, address, credit=20, replica=broker.replica_id)
            for broker, conn in zip((ahead_broker, other), conns, strict=True)
        ]
        senders = [sender(conn, address) for conn in conns]
        deliveries: list[list[Delivery]] = [[], []]
        for i in range(count):
            side = i % 2
            deliveries[side].append(_start_send(conns[side], senders[side], i))
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            for rcv in receivers:
                while True:
                    try:
                        message = rcv.receive(timeout=0.05)
                    except Exception:  # proton.utils Timeout: nothing more here for now
                        break
                    got.append(message.body)
                    rcv.accept()
        for conn, sent in zip(conns, deliveries, strict=True):
            conn.wait(
                lambda sent=sent: all(d.settled for d in sent), timeout=TIMEOUT, msg='answers'
            )
        assert sorted(got) == list(range(count))  # none lost, none twice
        assert all(d.remote_state == Delivery.ACCEPTED for sent in deliveries for d in sent)
        for conn in conns:
            flush(conn)
        wait_for(lambda: _pending(frozen_redis, address) == 0, 5, 'everything acked')
        for conn in conns:
            conn.close()
    finally:
        other.stop()


def test_with_deliver_ahead_off_the_consumer_waits_for_redis(
    frozen_redis: RedisServer, address: str
) -> None:
    broker = BrokerProcess(frozen_redis.url, env={'SHOAL_DELIVER_AHEAD': 'false'})
    try:
        conn = connect(broker.url)
        rcv = _waiting_consumer(frozen_redis, conn, address, replica=broker.replica_id)
        snd = sender(conn, address)
        with Frozen(frozen_redis):
            delivery = _start_send(conn, snd, 'stored first')
            assert nothing_more(rcv, wait=1.0)
        assert rcv.receive(timeout=TIMEOUT).body == 'stored first'
        conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='the producer answered')
        conn.close()
    finally:
        broker.stop()
