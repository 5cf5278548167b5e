"""
The backlog gauges' snapshot on real Redis: one replica walks every stream and shares what it
read, the others read that one key (and walk themselves when it is missing), and the figures are
those of the streams: backlog, in flight, the oldest waiting message, the declaring resource.
"""

import uuid

import redis.asyncio
from processes import RedisServer

from shoal_broker.routing.storage import QUEUE_GROUP, OutgoingMessage
from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.registry import Registry


def message(body: bytes) -> OutgoingMessage:
    return OutgoingMessage(band=0, header=b'', rest=body, expiry_ms=0)


async def yes() -> bool:
    return True


async def no() -> bool:
    return False


async def test_one_replica_walks_and_the_others_read_the_snapshot_it_shared(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    queue, idle = f'q-{uuid.uuid4().hex[:8]}', f'idle-{uuid.uuid4().hex[:8]}'
    unread = f'unread-{uuid.uuid4().hex[:8]}'
    async with Registry.from_url(own_redis.url) as registry:
        await registry.declare_queue(queue, 'ns/orders')
        await registry.declare_queue(idle, 'ns/idle')
        await registry.declare_queue(unread, 'ns/unread')
    await own_store.messages.publish(unread, AddressKind.QUEUE, message(b'x'))
    for body in (b'a', b'b', b'c'):
        await own_store.messages.publish(queue, AddressKind.QUEUE, message(body))
    [entry] = await own_store.messages.fetch(queue, QUEUE_GROUP, 1)  # one in flight
    assert entry
    await own_store.flush()
    walker = BacklogSnapshot(own_redis.url, 5.0, shared=own_store.upkeep, walks=yes)
    reader = BacklogSnapshot(own_redis.url, 5.0, shared=own_store.upkeep, walks=no)
    try:
        assert await walker.refresh()
        assert await reader.refresh()
        assert (walker.walked, reader.walked) == (1, 0)
        for snapshot in (walker, reader):
            assert snapshot.by_label()[(queue, 'queue')] == 3
            assert snapshot.by_label()[(idle, 'queue')] == 0
            assert dict((tuple(k), v) for k, v in snapshot.in_flight)[(queue, 'queue')] == 1
            assert snapshot.oldest_ms[(queue, 'queue')] is not None
            assert snapshot.oldest_ms[(idle, 'queue')] is None
            assert ([queue, 'queue', 'ns', 'orders'], 1.0) in snapshot.declared
        # what the walk saw nothing to trim in: the trimmer skips it until the next walk
        settled = walker.settled()
        assert keys.AddressKeys.of(idle).streams[0] in settled  # empty
        assert keys.AddressKeys.of(unread).streams[0] in settled  # nothing read yet
        assert keys.AddressKeys.of(queue).streams[0] not in settled  # one handed out
        assert reader.settled() == set()  # it did not walk: it trims nothing it cannot see
        # the walker gone and its snapshot expired: the reader walks, and sees what changed since
        client = redis.asyncio.Redis.from_url(own_redis.url)
        try:
            assert await client.pttl(keys.BACKLOGS) > 0  # it expires: never read as current
            await client.delete(keys.BACKLOGS)
        finally:
            await client.aclose()
        await own_store.messages.publish(idle, AddressKind.QUEUE, message(b'd'))
        await own_store.flush()
        assert await reader.refresh()
        assert reader.walked == 1
        assert reader.by_label()[(idle, 'queue')] == 1
    finally:
        await walker.close()
        await reader.close()


async def test_a_refresh_without_redis_says_so_and_keeps_the_last_figures(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    queue = f'q-{uuid.uuid4().hex[:8]}'
    async with Registry.from_url(own_redis.url) as registry:
        await registry.declare_queue(queue, 'ns/orders')
    await own_store.messages.publish(queue, AddressKind.QUEUE, message(b'a'))
    await own_store.flush()
    snapshot = BacklogSnapshot(own_redis.url, 5.0)
    try:
        assert await snapshot.refresh()
        own_redis.stop()
        assert not await snapshot.refresh()
        assert snapshot.by_label()[(queue, 'queue')] == 1
    finally:
        await snapshot.close()


async def test_the_trimmer_leaves_the_streams_it_is_told_to_skip(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    queue = f'q-{uuid.uuid4().hex[:8]}'
    async with Registry.from_url(own_redis.url) as registry:
        await registry.declare_queue(queue, 'ns/orders')
    for body in (b'a', b'b', b'c'):
        await own_store.messages.publish(queue, AddressKind.QUEUE, message(body))
    for entry in await own_store.messages.fetch(queue, QUEUE_GROUP, 10):
        await own_store.messages.ack(queue, QUEUE_GROUP, entry)
    await own_store.flush()
    stream = keys.AddressKeys.of(queue).streams[0]
    client = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        assert await client.xlen(stream) == 3  # consumed, not trimmed yet
        assert await own_store.upkeep.trim({stream}) == 0
        assert await client.xlen(stream) == 3
        assert await own_store.upkeep.trim() == 3
        assert await client.xlen(stream) == 0
    finally:
        await client.aclose()
