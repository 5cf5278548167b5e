"""
A cycle that publishes to many queues sends each publishing script once, as a ``SCRIPT LOAD`` at
the head of each node's pipeline, and the publishes by hash (``store/script_heads.py``); Redis
forgetting its scripts loses and reorders nothing. Real Redis: the session's standalone server,
and a Redis Cluster of three primaries, whose pipelines each get a head of their own.
"""

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio
from processes import RedisServer
from redisclusters import ClusterGroup
from startedstores import started_store

from shoal_broker.routing.storage import QUEUE_GROUP, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store import scripts
from shoal_broker.store.calls import SCRIPTS
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.script_heads import with_heads

QUEUES = 60


@pytest.fixture(scope='module')
def own_redis() -> Iterator[RedisServer]:
    """A server of this module's own: the test makes it forget its scripts."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(params=['standalone', 'cluster'])
async def nodes_and_store(
    request: pytest.FixtureRequest, own_redis: RedisServer
) -> AsyncIterator[tuple[list[redis.asyncio.Redis], RedisStore]]:
    """The store and a client of each node that holds queues (each primary of the cluster).
    The session's cluster, which other store tests share, has its scripts loaded again after."""
    if request.param == 'standalone':
        urls, store_url = [own_redis.url], own_redis.url
    else:
        cluster: ClusterGroup = request.getfixturevalue('redis_cluster')
        primaries = cluster.client().get_primaries()
        urls = [f'redis://{node.host}:{node.port}' for node in primaries]
        store_url = cluster.url
    clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    try:
        async with started_store(store_url, 'heads') as store:
            yield clients, store
    finally:
        for client in clients:
            for name in SCRIPTS:
                await client.script_load(scripts.source(name))
            await client.aclose()


async def _calls(clients: list[redis.asyncio.Redis]) -> dict[str, int]:
    """Calls per command on all the nodes since their last ``CONFIG RESETSTAT``."""
    calls: dict[str, int] = {}
    for client in clients:
        for name, stats in (await client.info('commandstats')).items():
            command = name.removeprefix('cmdstat_')
            calls[command] = calls.get(command, 0) + int(stats['calls'])
    return calls


def _message(body: bytes) -> OutgoingMessage:
    return OutgoingMessage(band=4, header=b'', rest=body, expiry_ms=0)


async def _publish_to_each(store: RedisStore, names: list[str], body: bytes) -> list[Any]:
    # all queued before the cycle runs: one cycle, one pipeline a node
    published = [store.messages.publish(n, AddressKind.QUEUE, _message(body)) for n in names]
    return list(await asyncio.gather(*published))


async def test_a_cycle_over_many_queues_sends_each_script_once_and_stores_every_message(
    nodes_and_store: tuple[list[redis.asyncio.Redis], RedisStore],
) -> None:
    clients, store = nodes_and_store
    names = [f'heads-{uuid.uuid4().hex[:6]}-{i}' for i in range(QUEUES)]
    for name in names:
        await store.registry.create_address(name, AddressKind.QUEUE)
    await store.flush()
    for client in clients:
        await client.config_resetstat()
    assert await _publish_to_each(store, names, b'first') == [True] * QUEUES
    calls = await _calls(clients)
    assert calls.get('eval', 0) < QUEUES // 4, calls  # one EVAL per queue without the heads
    assert calls.get('evalsha', 0) >= QUEUES, calls
    assert 1 <= calls.get('script|load', 0) <= 2 * len(clients), calls

    for client in clients:  # Redis forgets every script: the next cycle's heads load them again
        await client.script_flush()
    assert await _publish_to_each(store, names, b'second') == [True] * QUEUES
    for name in names:  # each stored once, in the order sent
        entries = await store.messages.fetch(name, QUEUE_GROUP, 10)
        assert [e.rest for e in entries] == [b'first', b'second'], name


def test_only_a_script_sent_by_source_more_than_once_is_loaded_at_the_head() -> None:
    publish = scripts.source('publish')
    once = [('EVAL', publish, 1, 'k1', 'a'), ('XACK', 'k1', 'g', '1-1')]
    assert with_heads(once) == (once, 0)
    rewritten, heads = with_heads([*once, ('EVAL', publish, 1, 'k2', 'b')])
    assert heads == 1
    assert rewritten[0] == ('SCRIPT', 'LOAD', publish)
    sha = hashlib.sha1(publish.encode()).hexdigest()
    assert rewritten[1:] == [
        ('EVALSHA', sha, 1, 'k1', 'a'),
        once[1],
        ('EVALSHA', sha, 1, 'k2', 'b'),
    ]
