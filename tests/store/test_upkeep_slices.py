"""The background passes in slices (docs/performance.md#background-work-in-slices): the trim
pass and the metric records go to Redis in pipelines of at most ``CALLS_PER_PIPELINE`` calls
(``RECORDS_PER_SLICE`` records), one pipeline at a time per node, on a standalone Redis and on
a cluster, and the records are built a slice at a time, the loop serving other tasks between
slices; on a cluster the watchers' re-listing reaches each address's own primary. Pipelines are
watched through a proxy in front of each node (``pipelinewatch``)."""

import asyncio
import hashlib
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio
from pipelinewatch import PipelineWatch, cluster_url, watched_cluster
from processes import RedisServer
from redisclusters import ClusterGroup
from startedstores import started_store

from shoal_broker.amqp.broker import Broker
from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.storage import NORMAL_BAND, QUEUE_GROUP, OutgoingMessage
from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.running.reporting import (
    RECORDS_PER_SLICE,
    RecordedFigures,
    metric_records,
    write_records,
)
from shoal_broker.settings import AddressKind, BrokerSettings
from shoal_broker.store import keys, scripts
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.slices import CALLS_PER_PIPELINE

TRIM = 'EVALSHA ' + hashlib.sha1(scripts.source('trim').encode()).hexdigest()
APPEND = f'XADD {keys.METRICS}'
LENGTH = BrokerSettings().store.metrics_stream_length


@pytest.fixture
def watch(own_redis: RedisServer) -> Iterator[PipelineWatch]:
    """In front of a Redis of the test's own: a session broker's trim would take the test's
    consumed entries before the pass it watches (``own_redis``)."""
    proxy = PipelineWatch(own_redis.port)
    yield proxy
    proxy.close()


@pytest.fixture
async def watched_store(watch: PipelineWatch) -> AsyncIterator[RedisStore]:
    async with started_store(watch.url) as store:
        yield store


async def _addresses(store: RedisStore, count: int) -> list[str]:
    names = [f'slices-{uuid.uuid4().hex[:8]}-{n}' for n in range(count)]
    for name in names:
        await store.registry.create_address(name, AddressKind.QUEUE)
    return names


async def _on_every_primary(store: RedisStore, each: int) -> list[str]:
    """New addresses on a cluster, at least ``each`` served by every primary."""
    cluster: Any = store.client  # a cluster client
    names: list[str] = []
    by_node: dict[str, int] = {}
    for n in range(100 * each):
        if len(by_node) == 3 and min(by_node.values()) >= each:
            break
        name = f'slices-{uuid.uuid4().hex[:8]}-{n}'
        node = cluster.get_node_from_key(keys.AddressKeys.of(name).streams[0])
        by_node[node.name] = by_node.get(node.name, 0) + 1
        await store.registry.create_address(name, AddressKind.QUEUE)
        names.append(name)
    assert len(by_node) == 3
    assert min(by_node.values()) >= each
    return names


async def _consumed(store: RedisStore, name: str, count: int, band: int = NORMAL_BAND) -> None:
    """``count`` messages on queue ``name``'s ``band``, fetched and acknowledged: for trim to
    remove."""
    for i in range(count):
        message = OutgoingMessage(band, b'', b'%d' % i, 0)
        await store.messages.publish(name, AddressKind.QUEUE, message)
    for entry in await store.messages.fetch(name, QUEUE_GROUP, count):
        await store.messages.ack(name, QUEUE_GROUP, entry)


async def test_the_trim_pass_sends_pipelines_of_at_most_a_slice(
    watched_store: RedisStore, watch: PipelineWatch, own_redis: RedisServer
) -> None:
    names = await _addresses(watched_store, 250)  # 250 default bands: three slices
    await _consumed(watched_store, names[0], 5)
    await _consumed(watched_store, names[1], 4, band=2)
    watch.reset()
    assert await watched_store.upkeep.trim() == 9
    # one call a stream that can hold entries (a small consumed part goes in one): each
    # address's default band, and the one band written at another priority (its levels SET);
    # the 2 250 bands never written are not asked about
    assert watch.sent[TRIM] == 251
    assert watch.deepest[TRIM] == CALLS_PER_PIPELINE
    assert watch.widest[TRIM] == 1  # one pipeline at a time
    client = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        assert await client.xlen(keys.AddressKeys.of(names[0]).streams[5]) == 0
        assert await client.xlen(keys.AddressKeys.of(names[1]).streams[2]) == 0
        # trimmed empty, the band left the levels SET: the next pass leaves it alone
        assert await client.smembers(keys.AddressKeys.of(names[1]).levels) == set()
    finally:
        await client.aclose()
    watch.reset()
    assert await watched_store.upkeep.trim() == 0
    assert watch.sent[TRIM] == 250


@pytest.fixture(scope='module')
def watched() -> Iterator[tuple[ClusterGroup, list[PipelineWatch]]]:
    """A cluster of three primaries, each behind a proxy (a few seconds to start)."""
    with watched_cluster() as found:
        yield found


@pytest.fixture
async def cluster_store(
    watched: tuple[ClusterGroup, list[PipelineWatch]],
) -> AsyncIterator[RedisStore]:
    async with started_store(cluster_url(watched[1])) as store:
        yield store


async def test_on_a_cluster_the_trim_pass_sends_one_slice_at_a_time_to_each_primary(
    cluster_store: RedisStore, watched: tuple[ClusterGroup, list[PipelineWatch]]
) -> None:
    """Not 16 calls in flight on a node (as before the slices): pipelines of at most
    ``CALLS_PER_PIPELINE`` trim.lua calls on each primary's own connection, one at a time."""
    cluster, watches = watched
    # a default band each, 100 on each primary at least
    names = await _on_every_primary(cluster_store, CALLS_PER_PIPELINE)
    await _consumed(cluster_store, names[0], 5)
    client = cluster.client()
    try:
        addresses = client.hlen(keys.ADDRESSES)  # the module's other tests may have made some
        for watch in watches:
            watch.reset()
        assert await cluster_store.upkeep.trim() == 5
        # one call an address: no address of the module has written another band
        assert sum(watch.sent[TRIM] for watch in watches) == addresses
        for watch in watches:
            assert watch.deepest[TRIM] == CALLS_PER_PIPELINE, watch.deepest
            assert watch.widest[TRIM] == 1, watch.widest
        assert client.xlen(keys.AddressKeys.of(names[0]).streams[5]) == 0
    finally:
        client.close()


@pytest.mark.timeout(120)
async def test_a_primary_out_of_reach_fails_the_trim_pass_after_the_others_are_trimmed() -> None:
    with watched_cluster() as (cluster, watches):
        store = RedisStore.from_url(cluster_url(watches), 'trimming')
        await store.start()
        try:
            await _on_every_primary(store, CALLS_PER_PIPELINE)
            # the walk reads the index of addresses: its primary stays in reach (the slot map
            # names the proxies' ports)
            index_port = cluster.owner_of_slot(cluster.keyslot(keys.ADDRESSES))
            gone = next(watch for watch in watches if watch.port != index_port)
            gone.close()
            with pytest.raises(StoreUnavailable):
                await store.upkeep.trim()
            others = [watch for watch in watches if watch is not gone]
            assert all(watch.sent[TRIM] >= CALLS_PER_PIPELINE for watch in others)
        finally:
            await store.close()


async def test_on_a_cluster_metric_records_are_appended_a_slice_to_a_pipeline(
    cluster_store: RedisStore, watched: tuple[ClusterGroup, list[PipelineWatch]]
) -> None:
    watches = watched[1]
    addresses = [f'records-{uuid.uuid4().hex[:8]}-{n}' for n in range(250)]
    broker = _broker_with_tallies(cluster_store, addresses)
    backlog = BacklogSnapshot(cluster_url(watches), 10.0)
    figures = RecordedFigures(60_000, 10_000)
    for watch in watches:
        watch.reset()
    try:
        records = metric_records(broker, backlog, 'r1', 1000, figures=figures)
        assert await write_records(cluster_store, records, LENGTH, figures) == 250
    finally:
        await backlog.close()
    assert sum(watch.sent[APPEND] for watch in watches) == 250
    assert max(watch.deepest[APPEND] for watch in watches) == RECORDS_PER_SLICE
    assert max(watch.widest[APPEND] for watch in watches) == 1


async def test_on_a_cluster_watches_are_listed_again_on_each_primary(
    cluster_store: RedisStore, watched: tuple[ClusterGroup, list[PipelineWatch]]
) -> None:
    names = await _on_every_primary(cluster_store, 3)
    for name in names:
        cluster_store.watching.watch(name, lambda _: None)
    client = watched[0].client()
    listings = [keys.AddressKeys.of(name).watchers for name in names]
    try:
        await cluster_store.watching.assert_watches()
        for key in listings:
            client.delete(key)  # e.g. a primary that restarted empty
        await cluster_store.watching.assert_watches()  # each HSET on its own primary
        replica = cluster_store.replica_id
        assert [client.hexists(key, replica) for key in listings] == [True] * len(names)
    finally:
        client.close()


def _broker_with_tallies(store: RedisStore, addresses: list[str]) -> Broker:
    broker = Broker(BrokerSettings(), store, 'test')
    for address in addresses:
        broker.counters.enqueued(address)
    return broker


async def test_metric_records_are_built_a_slice_at_a_time_with_the_loop_turning_between(
    store: RedisStore, plain_redis: RedisServer
) -> None:
    addresses = [f'records-{uuid.uuid4().hex[:8]}-{n}' for n in range(1000)]
    broker = _broker_with_tallies(store, addresses)
    backlog = BacklogSnapshot(plain_redis.url, 10.0)
    turns = 0

    async def ticker() -> None:
        nonlocal turns
        for _ in range(100_000):
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(ticker())
    try:
        await asyncio.sleep(0)
        seen: list[tuple[int, int]] = []  # (loop turns so far, records in the slice)
        async for batch in metric_records(broker, backlog, 'r1', 1000):
            seen.append((turns, len(batch)))
            assert {r.enqueued for r in batch} == {1}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backlog.close()
    assert [n for _, n in seen] == [RECORDS_PER_SLICE] * (1000 // RECORDS_PER_SLICE)
    assert all(later > earlier for (earlier, _), (later, _) in itertools.pairwise(seen))


async def test_metric_records_are_appended_a_slice_to_a_pipeline(
    watched_store: RedisStore, watch: PipelineWatch, own_redis: RedisServer
) -> None:
    addresses = [f'records-{uuid.uuid4().hex[:8]}-{n}' for n in range(250)]
    broker = _broker_with_tallies(watched_store, addresses)
    backlog = BacklogSnapshot(own_redis.url, 10.0)
    figures = RecordedFigures(60_000, 10_000)
    replica = f'r-{uuid.uuid4().hex[:6]}'
    client = redis.asyncio.Redis.from_url(own_redis.url)
    last = await client.xrevrange(keys.METRICS, count=1)
    watch.reset()
    try:
        records = metric_records(broker, backlog, replica, 1000, figures=figures)
        assert await write_records(watched_store, records, LENGTH, figures) == 250
    finally:
        await backlog.close()
    assert watch.sent[APPEND] == 250
    assert watch.deepest[APPEND] == RECORDS_PER_SLICE
    assert watch.widest[APPEND] == 1
    assert {entity[0] for entity in figures.last} == set(addresses)
    try:  # what was written since, whatever other replicas wrote meanwhile
        written = await client.xrange(keys.METRICS, min=f'({last[0][0].decode()}' if last else '-')
    finally:
        await client.aclose()
    mine = {f[b'address'].decode() for _, f in written if f[b'replica'] == replica.encode()}
    assert mine == set(addresses)
