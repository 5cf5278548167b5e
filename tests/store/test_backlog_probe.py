"""
The backlog walk's look at an address it last found empty (``store/backlog_reads.py``): two
plain commands instead of ``backlog.lua``, in every store mode, and never a stale figure: an
entry at any priority, a released one, or a big message's body left behind makes the walk read
the address whole again; and the trim pass leaves alone an address found empty so.
"""

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from processes import RedisServer
from startedstores import started_store

from shoal_broker.routing.storage import NORMAL_BAND, QUEUE_GROUP, OutgoingMessage
from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.settings import AddressKind
from shoal_broker.store import connect, keys
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.registry import Registry

BIG = 1024  # bytes after the header from which a body is stored beside the scripts
TOP_BAND = 0  # JMS priority 9: a band other than the default one, listed in the levels SET


async def yes() -> bool:
    return True


def message(band: int, rest: bytes = b'x') -> OutgoingMessage:
    return OutgoingMessage(band=band, header=b'', rest=rest, expiry_ms=0)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[RedisStore]:
    async with started_store(store_url) as s:
        yield s


async def backlog_of(walker: BacklogSnapshot, queue: str) -> float:
    assert await walker.refresh()
    return walker.by_label()[(queue, 'queue')]


async def test_an_address_found_empty_is_read_whole_again_once_anything_lands_in_it(
    store_url: str, store: RedisStore
) -> None:
    queue = f'probe-{uuid.uuid4().hex[:8]}'
    async with Registry.from_url(store_url) as registry:
        await registry.declare_queue(queue, 'ns/probe')
    k = keys.AddressKeys.of(queue)
    walker = BacklogSnapshot(store_url, 5.0, shared=store.upkeep, walks=yes)
    try:
        assert await backlog_of(walker, queue) == 0
        assert await backlog_of(walker, queue) == 0  # looked at by the two commands now
        assert k.tag in walker.settled()  # the whole address, bodies included
        # a message at another priority than the default: its band is in the levels SET
        assert await store.messages.publish(queue, AddressKind.QUEUE, message(TOP_BAND))
        await store.flush()
        assert await backlog_of(walker, queue) == 1
        assert k.tag not in walker.settled()
        [entry] = await store.messages.fetch(queue, QUEUE_GROUP, 1)
        await store.messages.ack(queue, QUEUE_GROUP, entry)
        await store.flush()
        await store.upkeep.trim(walker.settled())
        assert await backlog_of(walker, queue) == 0
        # one in the default band, handed out then released: still counted until consumed
        assert await store.messages.publish(queue, AddressKind.QUEUE, message(NORMAL_BAND))
        await store.flush()
        assert await backlog_of(walker, queue) == 1
        [entry] = await store.messages.fetch(queue, QUEUE_GROUP, 1)
        await store.messages.release(queue, QUEUE_GROUP, entry, delivery_failed=False)
        await store.flush()
        assert await backlog_of(walker, queue) == 1
        assert await backlog_of(walker, queue) == 1
    finally:
        await walker.close()


async def test_an_idle_address_costs_the_walk_no_script_call(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    queues = [f'idle-{uuid.uuid4().hex[:8]}' for _ in range(30)]
    async with Registry.from_url(own_redis.url) as registry:
        for queue in queues:
            await registry.declare_queue(queue, 'ns/idle')
    walker = BacklogSnapshot(own_redis.url, 5.0, shared=own_store.upkeep, walks=yes)
    client = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        assert await walker.refresh()  # the first walk reads each address with backlog.lua
        await client.config_resetstat()
        keys.AddressKeys.of.cache_clear()
        assert await walker.refresh()
        # the probe names its keys from the tag: the cache of the addresses in use is left alone
        assert keys.AddressKeys.of.cache_info().misses == 0
        stats = await client.info('commandstats')
        assert 'cmdstat_evalsha' not in stats
        assert stats['cmdstat_xlen']['calls'] == len(queues)
        assert all(walker.by_label()[(q, 'queue')] == 0 for q in queues)
    finally:
        await walker.close()
        await client.aclose()


async def test_the_trim_pass_leaves_an_address_found_empty_but_not_a_body_left_behind(
    own_redis: RedisServer, own_store: RedisStore
) -> None:
    """A move deletes entries inside a stream (``manage_remove.lua``) and leaves their bodies to
    the trim: the walk then finds the stream empty, but the body index says there is more."""
    idle, moved = f'idle-{uuid.uuid4().hex[:8]}', f'moved-{uuid.uuid4().hex[:8]}'
    async with Registry.from_url(own_redis.url) as registry:
        await registry.declare_queue(idle, 'ns/idle')
    client = connect.client_of_any_mode(own_redis.url)
    walker = BacklogSnapshot(own_redis.url, 5.0, shared=own_store.upkeep, walks=yes)
    try:
        assert await walker.refresh()  # backlog.lua: empty
        assert await walker.refresh()  # the two commands: empty, no body index
        assert keys.address_tag(idle) in walker.settled()
        await client.config_resetstat()
        keys.AddressKeys.of.cache_clear()
        await own_store.upkeep.trim(walker.settled())
        assert keys.AddressKeys.of.cache_info().misses == 0  # its keys were not even made
        stats = await client.info('commandstats')
        assert not {'cmdstat_exists', 'cmdstat_evalsha', 'cmdstat_eval'} & set(stats)

        async with Registry.from_url(own_redis.url) as registry:
            await registry.declare_queue(moved, 'ns/moved')
        own_store.messages.big_body_bytes = BIG
        rest = b'\x00Su\xb0' + b'b' * 4 * BIG
        assert await own_store.messages.publish(
            moved, AddressKind.QUEUE, message(NORMAL_BAND, rest)
        )
        await own_store.flush()
        m = keys.AddressKeys.of(moved)
        for entry_id, _ in await client.xrange(m.streams[NORMAL_BAND]):
            await client.xdel(m.streams[NORMAL_BAND], entry_id)
        assert await client.zcard(m.body_index) == 1
        assert await walker.refresh()  # backlog.lua: the stream empty, nothing in flight
        assert await walker.refresh()  # the two commands find the body index: backlog.lua
        settled = walker.settled()
        assert m.tag not in settled
        assert set(m.streams) <= settled
        await own_store.upkeep.trim(settled)
        assert await client.zcard(m.body_index) == 0
        assert not await client.keys(f'{m.tag}:body:*')
    finally:
        await walker.close()
        await connect.close(client)
