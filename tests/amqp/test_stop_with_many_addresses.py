"""
A replica stops promptly however many addresses Redis holds: on its way out it returns what it
holds and takes itself out of every address's watchers and sharing, which once cost a few round
trips per address (ten thousand idle addresses: about 10 s, past a preStop budget).
"""

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
from amqpclient import connect, receive_all, receiver, send_all
from processes import BrokerProcess, RedisServer

from shoal_broker.routing.storage import AddressKind
from shoal_broker.store import keys
from shoal_broker.store.redisstore import RedisStore

IDLE_ADDRESSES = 10_000
EXIT_BOUND_SECONDS = 5.0
"""Generous: a hang-up check, not a timing (the idle addresses once took about 10 s)."""


@pytest.fixture
def crowded_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own holding ten thousand idle queues (the shared one must not)."""
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
                store.create_address(f'idle-{n:05d}', AddressKind.QUEUE)
                for n in range(start, min(count, start + 500))
            ))  # fmt: skip
    finally:
        await store.close()


@pytest.mark.timeout(120)
def test_sigterm_with_ten_thousand_idle_addresses_exits_promptly_and_returns_what_it_held(
    crowded_redis: RedisServer,
) -> None:
    address = 'held-on-the-way-out'
    leaving = BrokerProcess(crowded_redis.url, replica_id='leaving')
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
        assert not client.hexists(k.shares(keys.QUEUE_GROUP), 'leaving')
    finally:
        client.close()
    other = BrokerProcess(crowded_redis.url, replica_id='other')
    try:
        conn = connect(other.url)
        again = receive_all(receiver(conn, address, credit=3), 3)
        assert sorted(m.body for m in again) == [0, 1, 2]
        assert all(m.delivery_count == 0 for m in again)  # a shutdown is not a failed delivery
        conn.close()
    finally:
        other.stop()
