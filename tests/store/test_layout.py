"""The indexes outside the scripts and their epochs (store/layout.py, docs/redis-modes.md
"Indexes outside the scripts"), on the session's real Redis: an index lists what exists with the
epoch it has, a late forget of an older epoch leaves a new creation listed, and a Redis written
with the older layout is laid out."""

import uuid

import redis.asyncio

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey, SubscriptionSpec
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, layout
from shoal_broker.store.redisstore import RedisStore


async def test_an_address_is_listed_with_its_epoch_and_forgotten_with_it(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    address = f'lay-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    assert await store.registry.create_address(address, AddressKind.QUEUE) is AddressKind.QUEUE
    epoch = await client.hget(k.meta, 'epoch')
    assert await client.hget(keys.ADDRESSES, address) == b'queue:' + epoch
    # created again as a topic: it stays the queue it is, with the same epoch
    assert await store.registry.create_address(address, AddressKind.TOPIC) is AddressKind.QUEUE
    assert await client.hget(keys.ADDRESSES, address) == b'queue:' + epoch
    await store.registry.delete_address(address)
    assert not await client.exists(k.meta, *k.streams, k.groups)
    assert not await client.hexists(keys.ADDRESSES, address)


async def test_a_late_forget_leaves_a_new_creation_listed(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    address = f'lay-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(address, AddressKind.TOPIC)
    old = (await client.hget(keys.ADDRESSES, address)).decode()
    await store.registry.delete_address(address)
    await store.registry.create_address(address, AddressKind.TOPIC)
    new = (await client.hget(keys.ADDRESSES, address)).decode()
    assert new != old  # a new epoch
    assert await store.evalsha('index_forget', (keys.ADDRESSES,), (address, old)) == 0
    assert (await client.hget(keys.ADDRESSES, address)).decode() == new


async def test_a_subscription_is_listed_with_its_definitions_epoch_until_it_goes(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    topic = f'lay-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(topic, AddressKind.TOPIC)
    key = SubscriptionKey(name='vol', scope=Scope.GLOBAL, client_id='', durable=False)
    spec = SubscriptionSpec(key=key, shared=True, topic=topic)
    await store.registry.join_subscription(spec, 'c1', 0)
    await store.registry.join_subscription(spec, 'c2', 0)
    epoch = await client.hget(keys.SubscriptionKeys.of(key.id).definition, 'epoch')
    assert await client.hget(keys.SUBSCRIPTION_INDEX, key.id) == epoch
    assert key.id in [s['id'] for s in await store.registry.subscriptions()]
    assert await store.registry.leave_subscription(key, 'c1') == 1
    assert await client.hget(keys.SUBSCRIPTION_INDEX, key.id) == epoch
    assert await store.registry.leave_subscription(key, 'c2') == 0  # volatile: it goes
    assert not await client.hexists(keys.SUBSCRIPTION_INDEX, key.id)


async def test_the_older_layout_is_laid_out_and_its_set_goes_once_no_older_replica_is_left(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    address, subscription = f'old-{uuid.uuid4().hex[:8]}', f'durable:global:*:{uuid.uuid4().hex}'
    definition = keys.SubscriptionKeys.of(subscription).definition
    older_replica = f'older-{uuid.uuid4().hex[:8]}'  # registered, never joined on its own slot
    await client.hset(keys.ADDRESSES, address, 'queue')
    await client.hset(definition, mapping={'topic': 't', 'durable': '1'})
    await client.sadd(keys.SUBSCRIPTIONS, subscription)
    await client.sadd(keys.REPLICAS, older_replica)
    try:
        # the session's brokers lay out too while SUBSCRIPTIONS exists (dead_replicas): wait
        assert await store.lay_out(wait=True)
        meta = keys.AddressKeys.of(address).meta
        assert await client.hget(meta, 'kind') == b'queue'
        entry = await client.hget(keys.ADDRESSES, address)
        assert entry == b'queue:' + await client.hget(meta, 'epoch')
        assert await client.sismember(keys.AddressKeys.of(address).groups, QUEUE_GROUP)
        epoch = await client.hget(definition, 'epoch')
        assert epoch
        assert await client.hget(keys.SUBSCRIPTION_INDEX, subscription) == epoch
        assert await client.exists(keys.SUBSCRIPTIONS), 'an older replica still writes it'
        await client.srem(keys.REPLICAS, older_replica)
        assert await store.lay_out(wait=True)
        assert not await client.exists(keys.SUBSCRIPTIONS)
        assert await client.hget(definition, 'epoch') == epoch  # idempotent
        await client.set(layout.LOCK, 'another replica')
        assert not await store.lay_out(), 'another replica holds the lock'
    finally:
        await client.delete(layout.LOCK, definition, keys.SUBSCRIPTIONS)
        await client.srem(keys.REPLICAS, older_replica)
        await client.hdel(keys.SUBSCRIPTION_INDEX, subscription)
        await store.registry.delete_address(address)


async def test_two_band_streams_are_left_as_they_are_when_a_priority_stream_was_written(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    """A replica of this version served the address while one of the older version still wrote
    its two-band streams: their entries cannot keep their ids in the priority streams, so the
    laying out writes nothing for the address (and says so), and loses nothing."""
    address = f'bands-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    await store.registry.create_address(address, AddressKind.QUEUE)
    older, _ = k.two_bands
    try:
        await client.xgroup_create(older, QUEUE_GROUP, '0', mkstream=True)
        await client.xadd(older, {'h': b'', 'r': b'older'})
        await client.xadd(k.streams[5], {'h': b'', 'r': b'newer'})
        assert await store.lay_out(wait=True)
        assert await client.xlen(older) == 1
        assert [fields[b'r'] for _, fields in await client.xrange(k.streams[5])] == [b'newer']
        await client.delete(k.streams[5])  # never written: the next start moves it forward
        await store.registry.create_address(address, AddressKind.QUEUE)  # its group again
        assert await store.lay_out(wait=True)
        assert not await client.exists(older)
        fetched = await store.messages.fetch(address, QUEUE_GROUP, 10)
        assert [(e.band, e.rest) for e in fetched] == [(5, b'older')]
    finally:
        await client.delete(older)
        await store.registry.delete_address(address)


async def test_a_last_value_queues_references_follow_their_entries_into_the_priority_streams(
    store: RedisStore, client: redis.asyncio.Redis
) -> None:
    """A last-value queue's newest entry per key value is named with its band: moved forward,
    the name follows the entry to its priority's stream; a name of an entry no longer stored
    goes."""
    address = f'lvq-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    await store.registry.create_address(address, AddressKind.QUEUE)
    await client.delete(*k.streams)
    _, high = k.two_bands
    try:
        await client.xgroup_create(high, QUEUE_GROUP, '0', mkstream=True)
        header = b'\x00\x53\x70\xc0\x04\x02\x41\x50\x07'  # durable, priority 7
        entry = (await client.xadd(high, {'h': header, 'r': b'kept'})).decode()
        ms, seq = entry.split('-')
        ref = f'1|{int(ms):015d}-{int(seq):010d}'
        gone = f'0|{1:015d}-{0:010d}'
        await client.hset(k.last_values, mapping={'device-1': ref, 'device-2': gone})
        await client.zadd(k.last_value_order, {f'{ref}|device-1': 0, f'{gone}|device-2': 0})
        assert await store.lay_out(wait=True)
        moved = f'2{ref[1:]}'  # priority 7's band
        assert await client.hgetall(k.last_values) == {b'device-1': moved.encode()}
        assert await client.zrange(k.last_value_order, 0, -1) == [f'{moved}|device-1'.encode()]
        assert await client.sismember(k.levels, '2')
        fetched = await store.messages.fetch(address, QUEUE_GROUP, 10)
        assert [(e.band, e.rest) for e in fetched] == [(2, b'kept')]
    finally:
        await store.registry.delete_address(address)
