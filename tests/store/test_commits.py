"""
Transactions across the shards of a real Redis Cluster (store/commits.py): a commit record
decides, each address applies its part once, and a committer that dies part-way is completed by
another replica with nothing lost and nothing applied twice.
"""

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from redisclusters import ClusterGroup

from shoal_broker.routing.storage import QUEUE_GROUP, Entry, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, scripts
from shoal_broker.store.commit_nodes import ClusterNodes
from shoal_broker.store.commits import CommitLog, plan, spans_slots
from shoal_broker.store.notifications import PoolFor

GROUP = QUEUE_GROUP


@pytest.fixture
async def nodes(
    cluster_client: redis.asyncio.RedisCluster, pool_for: PoolFor
) -> AsyncIterator[ClusterNodes]:
    found = ClusterNodes(cluster_client, pool_for)
    yield found
    await found.aclose()


@pytest.fixture
async def queues(
    redis_cluster: ClusterGroup, cluster_client: redis.asyncio.RedisCluster
) -> list[str]:
    """One queue made on every primary."""
    made = redis_cluster.names_on_every_primary('txq', lambda a: keys.AddressKeys.of(a).groups)
    for address in made:
        k = keys.AddressKeys.of(address)
        for stream in k.streams:
            await cluster_client.xgroup_create(stream, GROUP, '0', mkstream=True)
        await cluster_client.sadd(k.groups, GROUP)
    return made


async def delivered(client: redis.asyncio.RedisCluster, address: str) -> Entry:
    """Put one message in the queue and take it as replica-a's, as a fetch would."""
    stream = keys.AddressKeys.of(address).streams[0]
    await client.xadd(stream, {'h': b'h0', 'r': b'r0'})
    reply = await client.xreadgroup(GROUP, 'replica-a', {stream: '>'}, count=1)
    entry_id = reply[0][1][0][0].decode()
    return Entry(entry_id, 0, b'h0', b'r0', 0, 0)


def message(text: str) -> OutgoingMessage:
    return OutgoingMessage(0, b'header', text.encode())


async def bodies(client: redis.asyncio.RedisCluster, address: str) -> list[bytes]:
    entries = await client.xrange(keys.AddressKeys.of(address).streams[0])
    return [fields[b'r'] for _, fields in entries]


async def pending(client: redis.asyncio.RedisCluster, address: str) -> int:
    info = await client.xpending(keys.AddressKeys.of(address).streams[0], GROUP)
    return int(info['pending'])


async def records_left(client: redis.asyncio.RedisCluster, replica: str) -> int:
    return sum(
        [await client.scard(keys.commit_index(replica, b)) for b in range(keys.COMMIT_BUCKETS)]
    )


async def test_a_commit_over_three_shards_applies_everywhere(
    cluster_client: redis.asyncio.RedisCluster, nodes: ClusterNodes, queues: list[str]
) -> None:
    first, second, acked = queues
    entry = await delivered(cluster_client, acked)
    sends = [
        (first, AddressKind.QUEUE, message('a1')),
        (second, AddressKind.QUEUE, message('b1')),
        (first, AddressKind.QUEUE, message('a2')),
    ]
    acks = [(acked, GROUP, entry)]
    assert spans_slots(plan(sends, acks))

    log = CommitLog(nodes, 'replica-a', replicated=True)  # each primary has a replica to WAIT on
    await log.commit(sends, acks)

    assert await bodies(cluster_client, first) == [b'a1', b'a2']
    assert await bodies(cluster_client, second) == [b'b1']
    assert await pending(cluster_client, acked) == 0
    assert await records_left(cluster_client, 'replica-a') == 0


async def test_a_committer_dying_part_way_is_completed_once(
    cluster_client: redis.asyncio.RedisCluster, nodes: ClusterNodes, queues: list[str]
) -> None:
    first, second, acked = queues
    entry = await delivered(cluster_client, acked)
    parts = plan(
        [(first, AddressKind.QUEUE, message('a1')), (second, AddressKind.QUEUE, message('b1'))],
        [(acked, GROUP, entry)],
    )
    committer = CommitLog(nodes, 'replica-dying')
    record = await committer.record(uuid.uuid4().hex, parts)
    assert await committer.apply(record, parts[0])
    # the committer dies here: what a consumer sees meanwhile is the first address's part alone
    assert await bodies(cluster_client, first) == [b'a1']
    assert await bodies(cluster_client, second) == []
    assert await pending(cluster_client, acked) == 1

    reaper = CommitLog(nodes, 'replica-reaper')
    assert await reaper.complete('replica-dying') == 1

    assert await bodies(cluster_client, first) == [b'a1']  # not applied twice
    assert await bodies(cluster_client, second) == [b'b1']
    assert await pending(cluster_client, acked) == 0
    assert await records_left(cluster_client, 'replica-dying') == 0
    assert not await committer.apply(record, parts[1])  # a late apply from the dead committer
    assert await bodies(cluster_client, second) == [b'b1']


async def test_a_commit_that_never_recorded_leaves_nothing(
    cluster_client: redis.asyncio.RedisCluster, nodes: ClusterNodes, queues: list[str]
) -> None:
    """A committer that dies before its record is durable: nothing to complete, nothing seen."""
    first, second, _ = queues
    reaper = CommitLog(nodes, 'replica-reaper')
    assert await reaper.complete('replica-never-recorded') == 0
    assert await bodies(cluster_client, first) == []
    assert await bodies(cluster_client, second) == []


async def test_markers_outlive_their_record_by_the_grace_period(
    cluster_client: redis.asyncio.RedisCluster, nodes: ClusterNodes, queues: list[str]
) -> None:
    first, second, _ = queues
    parts = plan(
        [(first, AddressKind.QUEUE, message('a1')), (second, AddressKind.QUEUE, message('b1'))],
        [],
    )
    log = CommitLog(nodes, 'replica-a')
    record = await log.record(uuid.uuid4().hex, parts)
    for part in parts:
        await log.apply(record, part)
    later = 10**15  # far past any grace period
    assert await log.sweep_markers([first], now_ms=later) == 0  # the record is not forgotten yet
    await log.forget(record)
    assert await log.sweep_markers([first]) == 0  # within the grace period
    assert await log.sweep_markers([first], now_ms=later) == 1
    markers = keys.AddressKeys.of(second).commit_markers
    assert await cluster_client.hexists(markers, record)


async def test_a_record_rolled_back_turns_away_a_late_write_of_it(
    cluster_client: redis.asyncio.RedisCluster,
) -> None:
    """A record's write whose reply timed out may still run after the commit was rolled back
    (a node slower than the URL's ``socket_timeout``): the rollback's tombstone keeps it out,
    so no ``complete`` applies what the client was told is not (commit_forget.lua,
    commit_record.lua)."""
    record = keys.commit_record('replica-late', 5, uuid.uuid4().hex)
    index = keys.commit_index('replica-late', 5)
    forget, write = scripts.source('commit_forget'), scripts.source('commit_record')
    assert await cluster_client.eval(forget, 2, record, index, 600_000) == 0  # the rollback
    assert (
        await cluster_client.eval(write, 2, record, index, 'replica', 'replica-late', 'n', 1) == 0
    )
    assert await cluster_client.hgetall(record) == {b'void': b'1'}
    assert 0 < await cluster_client.pttl(record) <= 600_000
    assert await cluster_client.scard(index) == 0  # nothing for a complete to find
    await cluster_client.eval(forget, 2, record, index)  # the forgetting after an apply
    assert (
        await cluster_client.eval(write, 2, record, index, 'replica', 'replica-late', 'n', 1) == 1
    )
    assert await cluster_client.smembers(index) == {record.encode()}
    await cluster_client.eval(forget, 2, record, index)
