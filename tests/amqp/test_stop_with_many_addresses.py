"""
A replica stops promptly however many addresses Redis holds: on its way out it returns what it
holds and takes itself out of every address's watchers and sharing, which once cost a few round
trips per address (ten thousand idle addresses: about 10 s, past a preStop budget). A replica
that is killed instead is cleaned up by the same walk, run by a survivor.
"""

import asyncio
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from amqpclient import Capabilities, connect, receive_all, receiver, send_all
from processes import BrokerProcess, RedisServer

from shoal_broker.routing.storage import QUEUE_GROUP, AddressKind
from shoal_broker.store import keys
from shoal_broker.store.redisstore import RedisStore

TOPIC = Capabilities('topic')
FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}
NO_DRAIN = {'SHOAL_CONNECTION_DRAIN_SECONDS': '0'}
IDLE_ADDRESSES = 10_000
EXIT_BOUND_SECONDS = 10.0
"""Generous: a hang-up check, not a timing. The idle addresses once took about 10 s on a quiet
machine, and 2.6-3.6 s with a round trip per subscription to give up its message groups (5.7 s
beside the suite's other worker); about 1.1 s with those calls in slices (1.5-1.9 s on the
slower 2-vCPU Intel VM, and 7.2 s there once beside the suite's three workers)."""


@pytest.fixture(scope='module')
def crowded_redis() -> Iterator[RedisServer]:
    """A Redis of this module's own holding ten thousand idle queues (the shared one must not),
    filled once: each test uses addresses and replica ids of its own."""
    server = RedisServer()
    try:
        asyncio.run(_create_idle_queues(server.url, IDLE_ADDRESSES))
        yield server
    finally:
        server.stop()


async def _create_idle_queues(url: str, count: int) -> None:
    store = RedisStore.from_url(url, 'test-setup')
    await store.start()
    try:
        for start in range(0, count, 500):
            await asyncio.gather(*(
                store.registry.create_address(f'idle-{n:05d}', AddressKind.QUEUE)
                for n in range(start, min(count, start + 500))
            ))  # fmt: skip
    finally:
        await store.close()


@pytest.mark.timeout(120)
def test_sigterm_with_ten_thousand_idle_addresses_exits_promptly_and_returns_what_it_held(
    crowded_redis: RedisServer,
) -> None:
    address = 'held-on-the-way-out'
    # no drain: the client below never settles, and the walk over the addresses is timed here
    leaving = BrokerProcess(crowded_redis.url, replica_id='leaving', env=NO_DRAIN)
    try:
        conn = connect(leaving.url)
        send_all(conn, address, range(3))
        rcv = receiver(conn, address, credit=3)
        conn.wait(lambda: rcv.fetcher.has_message == 3, timeout=10)  # held, unsettled
        started = time.monotonic()
        leaving.process.terminate()
        code = leaving.process.wait(timeout=60)
        took = time.monotonic() - started
        conn.close()
    finally:
        leaving.stop()
    assert code == 0
    assert took < EXIT_BOUND_SECONDS, f'stopping took {took:.1f} s'
    client = redis.Redis.from_url(crowded_redis.url)
    try:
        k = keys.AddressKeys.of(address)
        assert not client.hexists(k.watchers, 'leaving')
        assert not client.hexists(k.shares(QUEUE_GROUP), 'leaving')
    finally:
        client.close()
    other = BrokerProcess(crowded_redis.url, replica_id='other')
    try:
        conn = connect(other.url)
        again = receive_all(receiver(conn, address, credit=3), 3)
        assert sorted(m.body for m in again) == [0, 1, 2]
        # they went out and were never settled: the next consumer is told they may be repeats
        assert all(m.delivery_count == 1 for m in again)
        conn.close()
    finally:
        other.stop()


def _groups(client: redis.Redis, address: str) -> list[str]:
    streams = keys.AddressKeys.of(address).streams
    return [
        g['name'].decode()
        for stream in streams
        if client.exists(stream)
        for g in client.xinfo_groups(stream)
    ]


@pytest.mark.timeout(120)
def test_a_killed_replica_among_ten_thousand_idle_addresses_is_cleaned_up_by_a_survivor(
    crowded_redis: RedisServer,
) -> None:
    queue, topic = 'held-by-the-dead', 'heard-by-the-dead'
    survivor = BrokerProcess(crowded_redis.url, replica_id='survivor', env=FAST_LEASE)
    doomed = BrokerProcess(crowded_redis.url, replica_id='doomed', env=FAST_LEASE)
    client = redis.Redis.from_url(crowded_redis.url)
    try:
        held_conn = connect(doomed.url)
        send_all(held_conn, queue, range(3))
        held = receiver(held_conn, queue, credit=3)
        receiver(held_conn, topic, TOPIC)  # a private subscription of the doomed replica
        held_conn.wait(lambda: held.fetcher.has_message == 3, timeout=10)  # held, unsettled
        assert any(g.startswith('nd:doomed:') for g in _groups(client, topic))
        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait(timeout=5)
        conn = connect(survivor.url)
        again = receive_all(receiver(conn, queue, credit=3), 3, timeout=60)
        assert sorted(m.body for m in again) == [0, 1, 2]
        assert all(m.delivery_count == 1 for m in again)  # the replica failed them
        conn.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and client.sismember(keys.REPLICAS, 'doomed'):
            time.sleep(0.1)  # reaping ends by leaving the registry
        assert not client.sismember(keys.REPLICAS, 'doomed')
        assert not any(g.startswith('nd:doomed:') for g in _groups(client, topic))
        for address in (queue, topic):
            assert not client.hexists(keys.AddressKeys.of(address).watchers, 'doomed')
        assert not client.hexists(keys.AddressKeys.of(queue).shares(QUEUE_GROUP), 'doomed')
    finally:
        client.close()
        doomed.stop()
        survivor.stop()
