"""
One lane per primary on a real Redis Cluster (store/lanes.py): units reach the primary serving
their slot, and a slot migrated or failed over under a steady writer is followed without losing,
repeating or reordering a unit that was answered as written.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from prometheus_client import REGISTRY
from redisclusters import ClusterGroup

from shoal_broker.store import keys
from shoal_broker.store.lanes import ClusterLanes, Unit, slot_of
from shoal_broker.store.notifications import PoolFor

WRITES = 1500
WRITE_SECONDS = 40.0
BATCH = 10


@pytest.fixture
async def lanes(
    cluster_client: redis.asyncio.RedisCluster, pool_for: PoolFor
) -> AsyncIterator[ClusterLanes]:
    found = ClusterLanes(cluster_client, pool_for, 4)
    yield found
    await found.close()


class Writer:
    """Appends numbered entries to one stream through the lanes, BATCH units per send, and
    keeps what each unit was answered. ``confirmed``: a unit counts as written only once a
    replica has it (the WAIT of its pipeline), as a message in ``replicated`` mode."""

    def __init__(self, lanes: ClusterLanes, stream: str, *, confirmed: bool = False) -> None:
        self.lanes, self.stream, self.confirmed = lanes, stream, confirmed
        self.written: list[int] = []
        self.failed: list[int] = []
        self.errors: list[object] = []
        self.next = 0

    def unit(self, n: int, answered: asyncio.Future[None]) -> Unit:
        def done(replies: list[Any] | None, error: BaseException | None) -> None:
            ok = error is None and replies and not isinstance(replies[0], Exception)
            if ok and self.confirmed:
                ok = isinstance(replies[-1], int) and replies[-1] >= 1
            if ok:
                self.written.append(n)
            else:
                self.failed.append(n)
                self.errors.append(error or [f'{type(r).__name__}: {r}' for r in replies or ()])
            if not answered.done():
                answered.set_result(None)

        command = ('XADD', self.stream, '*', 'n', n)
        return Unit(slot_of(self.stream), [command], done, confirm=self.confirmed)

    async def batch(self) -> None:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(BATCH)]
        units = [self.unit(self.next + i, f) for i, f in enumerate(futures)]
        self.next += BATCH
        await self.lanes.send(units)
        await asyncio.gather(*futures)


async def stored(client: redis.asyncio.RedisCluster, stream: str) -> list[int]:
    return [int(fields[b'n']) for _, fields in await client.xrange(stream)]


async def test_units_reach_the_primary_of_their_slot(
    redis_cluster: ClusterGroup, cluster_client: redis.asyncio.RedisCluster, lanes: ClusterLanes
) -> None:
    streams = {}
    while len(streams) < 3:
        stream = keys.AddressKeys.of(f'lane-{uuid.uuid4().hex[:8]}').streams[0]
        streams.setdefault(redis_cluster.primary_of(stream).port, stream)
    writers = [Writer(lanes, stream) for stream in streams.values()]
    for _ in range(3):
        await asyncio.gather(*(w.batch() for w in writers))
    for writer in writers:
        assert writer.failed == []
        assert await stored(cluster_client, writer.stream) == list(range(3 * BATCH))
    assert lanes.redirects == 0
    assert len(lanes.nodes) == 3


async def stored_names(client: redis.asyncio.RedisCluster, stream: str) -> list[str]:
    return [fields[b'n'].decode() for _, fields in await client.xrange(stream)]


def pipelines_counted() -> float:
    """``shoal_redis_pipeline_seconds``'s count: the pipelines answered so far in this process."""
    return REGISTRY.get_sample_value('shoal_redis_pipeline_seconds_count') or 0.0


async def test_each_node_pipeline_is_counted(
    redis_cluster: ClusterGroup, cluster_client: redis.asyncio.RedisCluster, lanes: ClusterLanes
) -> None:
    """One send over three primaries is three pipelines, each observed once its node answers,
    in the metric the single lane's pipelines are observed in (bench/cluster.sh reads it)."""
    streams: dict[int, str] = {}
    while len(streams) < 3:
        stream = keys.AddressKeys.of(f'counted-{uuid.uuid4().hex[:8]}').streams[0]
        streams.setdefault(redis_cluster.primary_of(stream).port, stream)
    loop = asyncio.get_running_loop()

    def unit(stream: str, n: int) -> tuple[Unit, asyncio.Future[None]]:
        answered: asyncio.Future[None] = loop.create_future()

        def done(replies: list[Any] | None, error: BaseException | None) -> None:
            answered.set_result(None)

        return Unit(slot_of(stream), [('XADD', stream, '*', 'n', n)], done), answered

    # two units per node, which share their node's pipeline
    sent = [unit(stream, n) for stream in streams.values() for n in range(2)]
    before = pipelines_counted()
    await lanes.send([u for u, _ in sent])
    await asyncio.gather(*(answered for _, answered in sent))
    assert pipelines_counted() - before == 3
    alone, answered = unit(next(iter(streams.values())), 2)
    await lanes.send([alone])
    await answered
    assert pipelines_counted() - before == 4


async def test_units_sharing_an_answer_are_answered_together_per_pipeline(
    redis_cluster: ClusterGroup, cluster_client: redis.asyncio.RedisCluster, lanes: ClusterLanes
) -> None:
    """Units sharing an ``answer`` (a cycle's) are answered once per node pipeline with their
    replies in order; one Redis refused (a MOVED: it claims another node's slot) is sent again
    where Redis said and answered alone, while its pipeline's others are answered together."""
    streams: dict[int, str] = {}
    while len(streams) < 2:
        stream = keys.AddressKeys.of(f'together-{uuid.uuid4().hex[:8]}').streams[0]
        streams.setdefault(redis_cluster.primary_of(stream).port, stream)
    a, b = streams.values()
    answers: list[tuple[list[str], list[Any]]] = []
    all_answered = asyncio.get_running_loop().create_future()

    def answer(units: list[Unit], replies: list[Any] | None, error: BaseException | None) -> None:
        assert error is None
        assert replies is not None
        answers.append(([unit.context for unit in units], replies))
        if sum(len(names) for names, _ in answers) == 5:
            all_answered.set_result(None)

    def unit(stream: str, name: str, slot: int | None = None) -> Unit:
        slot = slot_of(stream) if slot is None else slot
        return Unit(slot, [('XADD', stream, '*', 'n', name)], answer=answer, context=name)

    misrouted = unit(b, 'b9', slot=slot_of(a))  # sent to a's node, which answers MOVED
    await lanes.send([unit(a, 'a0'), unit(b, 'b0'), unit(a, 'a1'), misrouted, unit(b, 'b1')])
    await asyncio.wait_for(all_answered, 10)

    assert sorted(names for names, _ in answers) == [['a0', 'a1'], ['b0', 'b1'], ['b9']]
    for names, replies in answers:
        assert len(replies) == len(names)
        assert not any(isinstance(reply, Exception) for reply in replies)
    assert lanes.redirects == 1
    # each unit got its own entry's id; b9 claimed another slot, so it has no order with b0, b1
    ids = {n: reply for names, replies in answers for n, reply in zip(names, replies, strict=True)}
    entries = [entry for stream in (a, b) for entry in await cluster_client.xrange(stream)]
    assert {fields[b'n'].decode(): entry_id for entry_id, fields in entries} == ids
    assert await stored_names(cluster_client, a) == ['a0', 'a1']
    in_b = await stored_names(cluster_client, b)
    assert in_b.index('b0') < in_b.index('b1')


async def test_a_slot_migrated_under_load_keeps_every_unit_once_and_in_order(
    redis_cluster: ClusterGroup, cluster_client: redis.asyncio.RedisCluster, lanes: ClusterLanes
) -> None:
    k = keys.AddressKeys.of(f'moving-{uuid.uuid4().hex[:8]}')
    stream = k.streams[0]
    for n in range(30):  # more keys in the slot: it moves in several batches
        await cluster_client.set(f'{k.tag}:filler:{n}', n)
    target = next(n for n in redis_cluster.primaries() if n is not redis_cluster.primary_of(stream))
    writer = Writer(lanes, stream)
    await writer.batch()
    loop = asyncio.get_running_loop()
    migration = loop.run_in_executor(
        None,
        lambda: redis_cluster.migrate_slot(
            slot_of(stream), target, batch=3, between_batches=lambda: time.sleep(0.03)
        ),
    )
    deadline = loop.time() + WRITE_SECONDS
    while not migration.done() and writer.next < WRITES and loop.time() < deadline:
        await writer.batch()
    await migration
    for _ in range(5):  # and after it
        await writer.batch()
    assert writer.failed == []
    assert lanes.redirects > 0, 'the writer never met the migration'
    assert await stored(cluster_client, stream) == writer.written == list(range(writer.next))


async def test_a_failover_under_load_loses_no_confirmed_unit(
    redis_cluster: ClusterGroup, cluster_client: redis.asyncio.RedisCluster, lanes: ClusterLanes
) -> None:
    """kill -9 of the slot's primary: units in flight then are answered with the error (a
    producer's messages released); once the replica took over, units go to it; every unit
    confirmed by a replica is stored once, in order."""
    stream = keys.AddressKeys.of(f'failing-{uuid.uuid4().hex[:8]}').streams[0]
    writer = Writer(lanes, stream, confirmed=True)
    for _ in range(3):
        await writer.batch()
    loop = asyncio.get_running_loop()
    kill = loop.run_in_executor(None, redis_cluster.kill_primary_of, stream)
    deadline = loop.time() + WRITE_SECONDS
    while not kill.done() and loop.time() < deadline:
        await writer.batch()
    killed, _, _ = await kill
    try:
        await loop.run_in_executor(None, redis_cluster.restart, killed)  # a replica to WAIT on
        before = len(writer.written)
        while len(writer.written) < before + 3 * BATCH and loop.time() < deadline:
            await writer.batch()
        assert len(writer.written) >= before + 3 * BATCH, writer.errors[-3:]
    finally:
        if not killed.running:
            await loop.run_in_executor(None, redis_cluster.restart, killed)
    assert writer.failed, 'the kill did not meet the writer'
    written = set(writer.written)
    kept = [n for n in await stored(cluster_client, stream) if n in written]
    assert kept == writer.written
