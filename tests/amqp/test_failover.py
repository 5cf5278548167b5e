"""A replica killed with SIGKILL: the survivors take over what it held, and nothing else."""

import signal
import time

import redis
from amqpclient import connect, nothing_more, receive_all, receiver, send_all
from jmswire import JmsSource, jms_connect, subscriber
from processes import BrokerProcess

FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}


def _kill(b: BrokerProcess) -> float:
    b.process.send_signal(signal.SIGKILL)
    b.process.wait(timeout=5)
    return time.monotonic()


def test_in_flight_deliveries_of_a_killed_replica_are_redelivered_by_another(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    survivor, doomed = start_broker(env=FAST_LEASE), start_broker(env=FAST_LEASE)
    conn = connect(survivor.url)
    send_all(conn, address, range(5))
    held_conn = connect(doomed.url)
    held = receiver(held_conn, address, credit=5)
    held_conn.wait(lambda: held.fetcher.has_message == 5, timeout=10)  # unsettled, on the doomed
    rcv = receiver(conn, address, credit=10)
    assert nothing_more(rcv)  # held by a live replica: never robbed
    killed_at = _kill(doomed)
    again = receive_all(rcv, 5, timeout=15)
    took = time.monotonic() - killed_at
    assert sorted(m.body for m in again) == [0, 1, 2, 3, 4]
    assert all(m.delivery_count == 1 for m in again)
    assert took < 10  # the default bound; here the lease is 1.5 s
    conn.close()


def test_a_killed_replicas_claims_and_registrations_are_released(
    start_broker, store_client: redis.Redis, address: str
) -> None:  # type: ignore[no-untyped-def]
    survivor, doomed = start_broker(env=FAST_LEASE), start_broker(env=FAST_LEASE)
    holder = jms_connect(doomed.url, 'client-of-the-dead')
    source = JmsSource('topic', 'shared', 'global')
    subscriber(holder, address, 'vol|global-volatile1', source)  # its only consumer is there
    durable = JmsSource('topic', durable=True)
    subscriber(holder, address, 'kept', durable)
    _kill(doomed)
    client = store_client
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and client.hexists('shoal:clients', 'client-of-the-dead'):
        time.sleep(0.1)
    assert not client.hexists('shoal:clients', 'client-of-the-dead')
    ids = {i.decode() for i in client.hkeys('shoal:subscription-index')}
    assert 'volatile:global:*:vol' not in ids  # deleted with its last (dead) consumer
    assert 'durable:client:client-of-the-dead:kept' in ids  # durable: kept, with no consumer
    assert client.hlen('shoal:{s:durable:client:client-of-the-dead:kept}:consumers') == 0
    again = jms_connect(survivor.url, 'client-of-the-dead')  # the ClientID is free again
    subscriber(again, address, 'kept', durable)  # and the exclusive subscription too
    again.close()


def test_a_replica_that_stops_cleanly_leaves_nothing_to_reap(
    start_broker, store_client: redis.Redis
) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env=FAST_LEASE, replica_id='clean-exit')
    client = store_client
    assert client.sismember('shoal:replicas', 'clean-exit')
    assert b.stop() == 0
    assert not client.sismember('shoal:replicas', 'clean-exit')
    assert not client.exists('shoal:lease:clean-exit', 'shoal:{r:clean-exit}:lease')
    assert not client.exists('shoal:{r:clean-exit}:joined')
