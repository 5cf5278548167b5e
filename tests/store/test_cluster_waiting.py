"""
The store's Redis Cluster client waits for a free connection (store/waiting_cluster.py): a burst
of calls larger than a node's pool is served in turn, as on a standalone Redis, where redis-py's
cluster client refuses every call past the pool's size at once (``MaxConnectionsError``, which the
store reports as "Redis unreachable"). The wait is bounded, and past it the call fails with a
reason.
"""

import asyncio
import uuid

import pytest
from redisclusters import ClusterGroup

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store import connect
from shoal_broker.store.calls import call

BURST = 40
POOL = 2


def same_slot_keys(count: int) -> list[str]:
    """Keys of one slot (one node, one pool): the burst cannot spread over the primaries."""
    tag = uuid.uuid4().hex[:8]
    return [f'{{waiting-{tag}}}:{i}' for i in range(count)]


async def test_a_burst_larger_than_the_pool_is_served_in_turn(redis_cluster: ClusterGroup) -> None:
    client = connect.cluster_client(redis_cluster.url, max_connections=POOL)
    try:
        keys = same_slot_keys(BURST)
        written = await asyncio.gather(*(call(client.set(k, k)) for k in keys))
        read = await asyncio.gather(*(call(client.get(k)) for k in keys))
        assert written == [True] * BURST
        assert read == [k.encode() for k in keys]
    finally:
        await connect.close(client)


async def test_a_burst_of_pipelines_is_served_in_turn(redis_cluster: ClusterGroup) -> None:
    client = connect.cluster_client(redis_cluster.url, max_connections=POOL)
    keys = same_slot_keys(BURST)

    async def pipeline(key: str) -> list[object]:
        pipe = client.pipeline(transaction=False)
        pipe.set(key, 'a')
        pipe.append(key, 'b')
        return list(await call(pipe.execute()))

    try:
        assert await asyncio.gather(*(pipeline(k) for k in keys)) == [[True, 2]] * BURST
    finally:
        await connect.close(client)


async def test_the_wait_is_bounded_and_says_why(redis_cluster: ClusterGroup) -> None:
    """One connection, held by a blocking read: a second call gives up after ``timeout`` s."""
    client = connect.cluster_client(redis_cluster.url, max_connections=1, timeout=0.3)
    key, other = same_slot_keys(2)
    try:
        held = asyncio.ensure_future(call(client.blpop([key], timeout=2)))
        await asyncio.sleep(0.1)  # the read holds the only connection
        with pytest.raises(StoreUnavailable, match=r'no Redis connection free within 0\.3 s'):
            await call(client.get(other))
        assert await asyncio.wait_for(held, 10) is None  # nothing was pushed
        assert await call(client.get(other)) is None  # the connection is free again
    finally:
        await connect.close(client)
