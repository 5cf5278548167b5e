"""
Wake-ups on Redis Cluster (store/notifications.py): shard channels subscribed on the primary
serving each one's slot, read straight off those connections, and subscribed again where the
slot went when it moves to another node or its primary is killed and a replica takes over.
"""

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio.cluster
from redisclusters import ClusterGroup

from shoal_broker.store import keys
from shoal_broker.store.notifications import PoolFor, ShardedNotifications

IDLE_SECONDS = 5.0


@pytest.fixture
async def channels(
    cluster_client: redis.asyncio.RedisCluster, pool_for: PoolFor
) -> AsyncIterator[ShardedNotifications]:
    notifications = ShardedNotifications(cluster_client, pool_for, IDLE_SECONDS)
    yield notifications
    await notifications.aclose()


def addresses_on_every_primary(cluster: ClusterGroup) -> list[str]:
    """One address (its notification channel) per primary."""
    return cluster.names_on_every_primary('q', lambda a: keys.AddressKeys.of(a).notify)


RECEIVE_SECONDS = 10.0


async def received(
    channels: ShardedNotifications, want: int
) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """Messages and moved channels until ``want`` messages arrived (within RECEIVE_SECONDS)."""
    messages: list[tuple[bytes, bytes]] = []
    moved: list[bytes] = []
    async with asyncio.timeout(RECEIVE_SECONDS):
        while len(messages) < want:
            found, again = await channels.messages()
            messages += found
            moved += again
    return messages, moved


async def test_each_channel_is_heard_from_the_primary_serving_it(
    redis_cluster: ClusterGroup,
    cluster_client: redis.asyncio.RedisCluster,
    channels: ShardedNotifications,
) -> None:
    notify = [keys.AddressKeys.of(a).notify for a in addresses_on_every_primary(redis_cluster)]
    await channels.subscribe(*notify)
    for channel in notify:  # SPUBLISH reaches only the subscribers of the channel's own shard
        assert await cluster_client.spublish(channel, 'replica-x') == 1
    messages, moved = await received(channels, 3)
    assert sorted(messages) == sorted((c.encode(), b'replica-x') for c in notify)
    assert moved == []

    await channels.unsubscribe(notify[0])
    assert await cluster_client.spublish(notify[1], 'replica-y') == 1
    messages, moved = await received(channels, 1)
    assert messages == [(notify[1].encode(), b'replica-y')]
    assert moved == []
    assert await cluster_client.spublish(notify[0], 'replica-z') == 0


async def test_a_channel_whose_slot_moves_is_subscribed_where_it_went(
    redis_cluster: ClusterGroup,
    cluster_client: redis.asyncio.RedisCluster,
    channels: ShardedNotifications,
) -> None:
    address, other, _ = addresses_on_every_primary(redis_cluster)
    channel = keys.AddressKeys.of(address).notify
    await channels.subscribe(channel)
    target = redis_cluster.primary_of(keys.AddressKeys.of(other).notify)
    await asyncio.to_thread(redis_cluster.migrate_slot, redis_cluster.keyslot(channel), target)

    _, moved = await channels.messages()  # the old node unsubscribed it: subscribed again
    assert moved == [channel.encode()]
    await cluster_client.nodes_manager.initialize()
    assert await cluster_client.spublish(channel, 'after-move') == 1
    messages, _ = await received(channels, 1)
    assert messages == [(channel.encode(), b'after-move')]


async def test_a_channel_outlives_its_primary(
    redis_cluster: ClusterGroup,
    cluster_client: redis.asyncio.RedisCluster,
    channels: ShardedNotifications,
) -> None:
    address = addresses_on_every_primary(redis_cluster)[0]
    channel = keys.AddressKeys.of(address).notify
    await channels.subscribe(channel)
    killed, promoted, _ = await asyncio.to_thread(redis_cluster.kill_primary_of, channel)
    try:
        async with asyncio.timeout(40):
            _, moved = await channels.messages()
        assert moved == [channel.encode()]
        await cluster_client.nodes_manager.initialize()
        assert cluster_client.get_node_from_key(channel).port == promoted
        assert await cluster_client.spublish(channel, 'after-failover') == 1
        messages, _ = await received(channels, 1)
        assert messages == [(channel.encode(), b'after-failover')]
        assert channels.resubscribes == 1
    finally:
        await asyncio.to_thread(redis_cluster.restart, killed)
