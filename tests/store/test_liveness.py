"""Lease renewal and reaping judged by what happened (renew_lease.lua, Liveness.reap), on the
session's real Redis: a lease that expired while nobody reaped the replica comes back ``late``;
once a reaper holds the lock it is ``lost``; a reaper that finds the lease renewed backs off."""

import uuid

import redis.asyncio

from shoal_broker.store import keys
from shoal_broker.store.calls import as_text
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.replicas import Liveness, renewal_keys

LEASE_MS = 60_000


async def renew(store: RedisStore, replica: str, token: str) -> str:
    reply = await store.evalsha('renew_lease', renewal_keys(replica), (token, LEASE_MS, replica))
    return as_text(reply)


async def test_renewal_outcomes(store: RedisStore, client: redis.asyncio.Redis) -> None:
    replica, token = f'lv-{uuid.uuid4().hex[:8]}', uuid.uuid4().hex
    own = keys.ReplicaKeys.of(replica)
    await Liveness(store, replica, token, LEASE_MS / 1000).join()
    try:
        assert await renew(store, replica, token) == 'renewed'
        await client.delete(own.lease)  # expired, nobody reaped it
        assert await renew(store, replica, token) == 'late'
        assert await client.get(own.lease) == token.encode()
        await client.delete(own.lease)
        await client.set(own.reaping, 'someone', px=LEASE_MS)  # a reaper started
        assert await renew(store, replica, token) == 'lost'
        assert await renew(store, replica, 'another process') == 'taken'
    finally:
        await client.delete(own.lease, own.reaping)
        await client.delete(own.joined, keys.lease(replica))
        await client.srem(keys.REPLICAS, replica)


async def test_a_reaper_that_finds_the_lease_renewed_backs_off(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    replica, token = f'lv-{uuid.uuid4().hex[:8]}', uuid.uuid4().hex
    own = keys.ReplicaKeys.of(replica)
    await Liveness(store, replica, token, LEASE_MS / 1000).join()
    reaper = Liveness(store, f'reaper-{uuid.uuid4().hex[:8]}', uuid.uuid4().hex, 5)
    try:
        # it looked dead a moment ago (dead_replicas), then renewed late before the lock
        assert await reaper.reap(replica) is None
        assert not await client.exists(own.reaping), 'the lock is given back'
        assert await client.sismember(keys.REPLICAS, replica), 'nothing of it was reaped'
        assert await renew(store, replica, token) == 'renewed'
    finally:
        await client.delete(own.lease, own.reaping)
        await client.delete(own.joined, keys.lease(replica))
        await client.srem(keys.REPLICAS, replica)
