"""SHOAL_DURABILITY: a message is accepted only once it reached the promised point."""

import signal

import pytest
import redis
from amqpclient import connect, nothing_more, receive_all, receiver, sender
from exposition import samples, value
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message
from proton.utils import SendException

from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.store import keys


def test_fsync_refuses_to_start_on_a_redis_that_does_not_fsync(address: str) -> None:
    server = RedisServer()  # appendonly no
    try:
        with pytest.raises(AssertionError, match='appendfsync always'):
            BrokerProcess(server.url, env={'SHOAL_DURABILITY': 'fsync'})
    finally:
        server.stop()


def test_fsync_accepts_on_a_redis_that_fsyncs_every_write(address: str) -> None:
    server = RedisServer(None, '--appendonly', 'yes', '--appendfsync', 'always')
    b = BrokerProcess(server.url, env={'SHOAL_DURABILITY': 'fsync'})
    try:
        conn = connect(b.url)
        sender(conn, address).send(Message(body='on disk', durable=True))
        assert receive_all(receiver(conn, address, credit=1), 1)[0].body == 'on disk'
        conn.close()
    finally:
        b.stop()
        server.stop()


@pytest.mark.parametrize(
    ('hold', 'state'), [('1', Delivery.REJECTED), ('0', Delivery.RELEASED)], ids=['held', 'no-hold']
)
def test_replicated_never_accepts_what_no_replica_confirmed(
    address: str, hold: str, state: int
) -> None:
    """Kept while no replica confirms it, for SHOAL_STORE_HOLD_SECONDS, then rejected with the
    reason, not held again (store/confirming.py); with the hold off, released at once (the
    client may send it again)."""
    server = RedisServer()  # no replica at all
    env = {
        'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '200',
        'SHOAL_STORE_HOLD_SECONDS': hold,
    }  # fmt: skip
    b = BrokerProcess(server.url, env=env)
    try:
        conn = connect(b.url)
        with pytest.raises(SendException) as refused:
            sender(conn, address).send(Message(body='unconfirmed', durable=True))
        assert refused.value.state == state  # the condition: tests/chaos/test_store_hold.py
        given_up = value(samples(b), 'shoal_held_sends_given_up_total', reason='time')
        assert given_up == (1 if hold != '0' else 0)
        conn.close()
    finally:
        b.stop()
        server.stop()


def test_replicated_accepts_once_a_replica_has_the_message(address: str) -> None:
    primary = RedisServer()
    replica = RedisServer(None, '--replicaof', '127.0.0.1', str(primary.port))
    b = BrokerProcess(primary.url, env={'SHOAL_DURABILITY': 'replicated'})
    try:
        conn = connect(b.url)
        snd = sender(conn, address)
        for attempt in range(50):  # the replica's first sync may take a moment
            try:
                snd.send(Message(body='confirmed', durable=True))
                break
            except SendException:
                assert attempt < 49
        assert receive_all(receiver(conn, address, credit=1), 1)[0].body == 'confirmed'
        conn.close()
    finally:
        b.stop()
        replica.stop()
        primary.stop()


def test_replicated_delivers_only_what_a_replica_knows_is_claimed(address: str) -> None:
    """A fetch waits for a replica too: a message is handed to a consumer once the replica has
    its claim, so a failover cannot make the delivery look new (docs/redis-modes.md)."""
    primary = RedisServer()
    replica = RedisServer(None, '--replicaof', '127.0.0.1', str(primary.port))
    b = BrokerProcess(
        primary.url, env={'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '8000'}
    )
    frozen = False
    try:
        wait_for(replica.linked, 20, 'the replica')
        conn = connect(b.url)
        sender(conn, address).send(Message(body='claimed', durable=True))
        replica.process.send_signal(signal.SIGSTOP)
        frozen = True
        rcv = receiver(conn, address, credit=1)
        assert nothing_more(rcv, wait=1.5)  # its claim is not on the replica yet
        replica.process.send_signal(signal.SIGCONT)
        frozen = False
        assert rcv.receive(timeout=20).body == 'claimed'
        on_replica = redis.Redis(host='127.0.0.1', port=replica.port)
        stream = keys.AddressKeys.of(address).streams[5]
        assert on_replica.xpending(stream, QUEUE_GROUP)['pending'] == 1
        on_replica.close()
        conn.close()
    finally:
        if frozen:
            replica.process.send_signal(signal.SIGCONT)
        b.stop()
        replica.stop()
        primary.stop()
