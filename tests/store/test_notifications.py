"""Wake-ups between replicas, on a real redis-server: the notification channel read straight off
its connection (messages in order with their channel, confirmations and pongs skipped, a quiet
channel pinged, a dead one raising so the store re-subscribes), and a publish notifying only
when another replica watches the address."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
from processes import RedisServer

from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.storage import OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store.notifications import NotificationReader
from shoal_broker.store.redisstore import RedisStore


@pytest.fixture
async def pubsub(client: redis.asyncio.Redis) -> AsyncIterator[Any]:
    p = client.pubsub()
    yield p
    await p.aclose()


Replica = tuple[str, RedisStore]


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[Replica, Replica]]:
    """Two replicas' stores, started, on one Redis: (replica id, store) each."""
    ids = [f'r-{uuid.uuid4().hex[:6]}' for _ in range(2)]
    stores = [RedisStore.from_url(redis_server.url, replica) for replica in ids]
    for store in stores:
        await store.start()
    yield (ids[0], stores[0]), (ids[1], stores[1])
    for store in stores:
        await store.close()


async def _messages(reader: NotificationReader, count: int) -> list[tuple[bytes, bytes]]:
    found: list[tuple[bytes, bytes]] = []
    async with asyncio.timeout(10):
        while len(found) < count:
            found += await reader.messages()
    return found


async def test_messages_arrive_in_order_with_their_channel(
    client: redis.asyncio.Redis, pubsub: Any
) -> None:
    first, second = (f'chan-{uuid.uuid4().hex}' for _ in range(2))
    await pubsub.subscribe(first)
    await pubsub.subscribe(second)  # two confirmations the reader must skip
    reader = NotificationReader(pubsub, idle_seconds=5)
    for i in range(50):
        assert await client.publish(first if i % 2 else second, f'm{i}') == 1
    found = await _messages(reader, 50)
    assert found == [((first if i % 2 else second).encode(), f'm{i}'.encode()) for i in range(50)]


async def test_a_quiet_channel_is_pinged_and_keeps_working(
    client: redis.asyncio.Redis, pubsub: Any
) -> None:
    channel = f'chan-{uuid.uuid4().hex}'
    await pubsub.subscribe(channel)
    reader = NotificationReader(pubsub, idle_seconds=0.2)
    assert await _messages(reader, 0) == []
    assert await reader.messages() == []  # confirmation read; then silence: a ping goes out
    assert await reader.messages() == []  # the pong answers it
    await client.publish(channel, 'after the ping')
    assert await _messages(reader, 1) == [(channel.encode(), b'after the ping')]


async def test_a_dead_channel_raises(client: redis.asyncio.Redis, pubsub: Any) -> None:
    name = f'notify-{uuid.uuid4().hex[:8]}'
    await pubsub.subscribe(f'chan-{uuid.uuid4().hex}')
    await pubsub.execute_command('CLIENT', 'SETNAME', name)
    reader = NotificationReader(pubsub, idle_seconds=5)
    [victim] = [c for c in await client.client_list() if c['name'] == name]
    await client.client_kill_filter(_id=victim['id'])
    with pytest.raises(redis.exceptions.ConnectionError):
        await _until_it_raises(reader)


async def _until_it_raises(reader: NotificationReader) -> None:
    async with asyncio.timeout(10):
        while True:
            await reader.messages()


async def test_a_publish_wakes_other_watching_replicas_and_only_them(
    replicas: tuple[Replica, Replica], client: redis.asyncio.Redis, pubsub: Any
) -> None:
    (id_a, a), (id_b, b) = replicas
    address = f'addr-{uuid.uuid4().hex[:10]}'
    await a.registry.create_address(address, AddressKind.QUEUE)
    channel = f'shoal:{{a:{address}}}:notify'
    await pubsub.ssubscribe(channel)  # an outside listener sees what is sent on the shard channel
    outside = NotificationReader(pubsub, idle_seconds=5)
    await _messages(outside, 0)
    woken_a: list[str] = []
    woken_b: asyncio.Queue[str] = asyncio.Queue()

    a.watching.watch(address, woken_a.append)
    await _until(lambda: _watchers(client, address), {id_a})
    await a.messages.publish(
        address, AddressKind.QUEUE, OutgoingMessage(0, b'', b'only a listens', 0)
    )
    b.watching.watch(address, woken_b.put_nowait)
    await _until(lambda: _watchers(client, address), {id_a, id_b})
    assert await asyncio.wait_for(woken_b.get(), 10) == address  # it looked once on watching
    await a.messages.publish(
        address, AddressKind.QUEUE, OutgoingMessage(0, b'', b'b listens too', 0)
    )
    assert await asyncio.wait_for(woken_b.get(), 10) == address
    # the first publish sent nothing (a alone watched); the second reached b and the outsider
    assert await _messages(outside, 1) == [(channel.encode(), id_a.encode())]
    assert woken_a == [address]  # its own look on watching; its own publishes wake it in-process

    b.watching.unwatch(address, woken_b.put_nowait)
    await _until(lambda: _watchers(client, address), {id_a})
    await client.delete(f'shoal:{{a:{address}}}:watchers')  # e.g. a Redis that restarted empty
    await a.watching.assert_watches()  # what a re-subscribe does (a renewal: a slice, tested below)
    assert await _watchers(client, address) == {id_a}


async def test_a_publish_into_a_bounded_backlog_wakes_other_replicas_too(
    replicas: tuple[Replica, Replica], client: redis.asyncio.Redis
) -> None:
    # publish_limited.lua notifies like publish.lua
    (_, a), (id_b, b) = replicas
    address = f'addr-{uuid.uuid4().hex[:10]}'
    a.upkeep.limit_backlog(10, 'reject-publish')
    await a.registry.create_address(address, AddressKind.QUEUE)
    woken_b: asyncio.Queue[str] = asyncio.Queue()
    b.watching.watch(address, woken_b.put_nowait)
    await _until(lambda: _watchers(client, address), {id_b})
    assert await asyncio.wait_for(woken_b.get(), 10) == address  # its look on watching
    assert await a.messages.publish(address, AddressKind.QUEUE, OutgoingMessage(0, b'', b'one', 0))
    assert await asyncio.wait_for(woken_b.get(), 10) == address


async def test_a_partial_assert_relists_a_slice_and_the_next_ones_the_rest(
    replicas: tuple[Replica, Replica], client: redis.asyncio.Redis
) -> None:
    (replica, store), _ = replicas
    addresses = [f'addr-{uuid.uuid4().hex[:10]}' for _ in range(5)]
    for address in addresses:
        await store.registry.create_address(address, AddressKind.QUEUE)
        store.watching.watch(address, lambda _: None)
    for address in addresses:
        await _until(lambda address=address: _watchers(client, address), {replica})
    await client.delete(*(f'shoal:{{a:{address}}}:watchers' for address in addresses))

    async def listed() -> int:
        return sum([replica in await _watchers(client, address) for address in addresses])

    await store.watching.assert_watches(2)  # what a lease renewal does, 2 at a time
    assert await listed() == 2
    await store.watching.assert_watches(2)
    assert await listed() == 4
    await store.watching.assert_watches(2)  # wraps round to the first ones
    assert await listed() == 5


async def test_a_renewal_with_redis_gone_says_so(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    address = f'addr-{uuid.uuid4().hex[:10]}'
    await own_store.registry.create_address(address, AddressKind.QUEUE)
    own_store.watching.watch(address, lambda _: None)
    await own_store.watching.assert_watches(2)
    own_redis.stop()
    with pytest.raises(StoreUnavailable, match='watchers not listed'):
        await own_store.watching.assert_watches(2)


async def test_a_burst_of_watches_is_listed_in_batches_each_to_its_latest_wish(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    # an attach burst: 1 200 addresses watched at once, then half of them unwatched and one of
    # those watched again before Redis heard of any of it
    client = redis.asyncio.Redis.from_url(own_redis.url)
    replica = own_store.replica_id
    addresses = [f'addr-{i:04}' for i in range(1200)]
    woken: list[str] = []
    await client.config_resetstat()
    for address in addresses:
        own_store.watching.watch(address, woken.append)
    for address in addresses[::2]:
        own_store.watching.unwatch(address, woken.append)
    own_store.watching.watch(addresses[0], woken.append)
    wanted = {addresses[0], *addresses[1::2]}

    async def listed() -> set[str]:
        return {a for a in addresses if replica in await _watchers(client, a)}

    await _until(listed, wanted)
    stats = await client.info('commandstats')
    # three batches of at most 500: one SSUBSCRIBE and one pipeline each, not two round trips
    # per address
    assert stats['cmdstat_ssubscribe']['calls'] <= 3
    channels = [f'shoal:{{a:{a}}}:notify' for a in addresses[:4]]
    counts = await client.execute_command('PUBSUB', 'SHARDNUMSUB', *channels)
    assert counts[1::2] == [1, 1, 0, 1]  # the channels listened to are the listed addresses'
    assert sorted(set(woken)) == sorted(wanted)  # each looked once on being listed
    await client.aclose()


async def _watchers(client: redis.asyncio.Redis, address: str) -> set[str]:
    return {k.decode() for k in await client.hkeys(f'shoal:{{a:{address}}}:watchers')}


async def _until(probe: Any, expected: Any) -> None:
    for _ in range(500):  # ~10 s
        if (got := await probe()) == expected:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f'{got} is still not {expected}')
