"""
Big messages' bodies beside the scripts (``store/bodies.py``) on a real Redis: stored once under
a key of their own, read back whole by a fetch, a browse and a claim's read ahead, in the
order they were published among small ones, and dropped with their entries (a trim, a refused
publish, a backlog limit's overflow): no body is left behind.
"""

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio

from shoal_broker.errors import BrokerError, StoreFull
from shoal_broker.routing.storage import NORMAL_BAND, QUEUE_GROUP, BrowseCursor, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store import bodies, keys, layout
from shoal_broker.store.calls import Scripts
from shoal_broker.store.redisstore import RedisStore

BIG = 1024
"""The threshold the tests set: rests this long or longer are big."""


@pytest.fixture
def name() -> str:
    return f'big-{uuid.uuid4().hex[:10]}'


@pytest.fixture
def big(store: RedisStore) -> RedisStore:
    store.messages.big_body_bytes = BIG
    return store


def msg(rest: bytes) -> OutgoingMessage:
    return OutgoingMessage(band=NORMAL_BAND, header=b'', rest=rest)


def big_rest(tag: bytes) -> bytes:
    return b'\x00Su\xb0' + (tag * (4 * BIG))[: 4 * BIG]


async def held(client: redis.asyncio.Redis, address: str) -> tuple[int, int]:
    """(bodies, index members) of ``address``."""
    k = keys.AddressKeys.of(address)
    found = [key async for key in client.scan_iter(match=k.body('*'), count=1000)]
    return len(found), int(await client.zcard(k.body_index))


async def test_big_and_small_messages_keep_their_order_and_come_back_whole(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.QUEUE)
    rests = [b'\x00Sw\xa1\x01a', big_rest(b'b'), b'\x00Sw\xa1\x01c', big_rest(b'd')]
    answers: list[list[int]] = []

    def stored(tokens: list[int], kept: bool | None, error: BrokerError | None) -> None:
        assert error is None
        assert kept
        answers.append(tokens)

    for i, rest in enumerate(rests):
        big.messages.publish_then(name, AddressKind.QUEUE, msg(rest), stored, i)
    await big.flush()
    assert answers == [[0, 1, 2, 3]]  # one script call took them all
    assert await held(client, name) == (2, 2)
    stream = await client.xrange(keys.AddressKeys.of(name).streams[NORMAL_BAND])
    assert [len(fields[b'r']) for _, fields in stream] == [6, 33, 6, 33]  # stubs in the stream
    assert all(bodies.is_stub(fields[b'r']) for _, fields in stream[1::2])
    page, _ = await big.messages.browse(name, QUEUE_GROUP, BrowseCursor(), 10)
    assert [e.rest for e in page] == rests
    fetched = await big.messages.fetch(name, QUEUE_GROUP, 10)
    assert [e.rest for e in fetched] == rests
    for entry in fetched:
        await big.messages.ack(name, QUEUE_GROUP, entry)
    await big.flush()
    await big.upkeep.trim()
    assert await held(client, name) == (0, 0)


async def test_a_fetch_callback_gets_the_bodies(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.QUEUE)
    rest = big_rest(b'x')
    assert await big.messages.publish(name, AddressKind.QUEUE, msg(rest)) is True
    got: list[bytes] = []
    big.messages.fetch_then(name, QUEUE_GROUP, 5, lambda f, e: got.extend(x.rest for x in f or ()))
    await big.flush()
    await big.flush()  # the MGET the answer waited for
    assert got == [rest]


async def test_a_topic_nobody_subscribes_to_keeps_no_body(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.TOPIC)
    assert await big.messages.publish(name, AddressKind.TOPIC, msg(big_rest(b't'))) is False
    assert await held(client, name) == (0, 0)


async def test_a_backlog_limit_drops_the_bodies_it_drops_or_refuses(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.QUEUE)
    big.upkeep.limit_backlog(2, 'drop-oldest')
    for tag in (b'1', b'2', b'3', b'4'):
        assert await big.messages.publish(name, AddressKind.QUEUE, msg(big_rest(tag))) is True
    await big.upkeep.trim()
    assert await held(client, name) == (2, 2)  # the two oldest dropped, their bodies by the trim
    fetched = await big.messages.fetch(name, QUEUE_GROUP, 10)
    assert [e.rest for e in fetched] == [big_rest(b'3'), big_rest(b'4')]
    big.upkeep.limit_backlog(2, 'reject-publish')
    with pytest.raises(StoreFull):
        await big.messages.publish(name, AddressKind.QUEUE, msg(big_rest(b'5')))
    assert await held(client, name) == (2, 2)


async def test_a_claim_stores_a_big_message_and_reads_big_ones_ahead_whole(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.QUEUE)
    ahead = big_rest(b'a')
    assert await big.messages.publish(name, AddressKind.QUEUE, msg(ahead)) is True
    answers: list[tuple[list[str], list[bytes]]] = []

    def claimed(tokens: list[str], result: object, error: BrokerError | None) -> None:
        assert error is None
        assert isinstance(result, tuple)
        _, read_ahead = result
        answers.append((list(tokens), [e.rest for e in read_ahead]))

    big.messages.claim_then(name, QUEUE_GROUP, msg(big_rest(b'c')), claimed, 'c')
    await big.flush()
    await big.flush()
    assert answers == [(['c'], [ahead])]
    assert await held(client, name) == (2, 2)


async def test_below_the_threshold_a_message_goes_through_the_script(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.QUEUE)
    rest = b'\x00Su\xb0' + b'x' * (BIG - 5)
    assert await big.messages.publish(name, AddressKind.QUEUE, msg(rest)) is True
    assert await held(client, name) == (0, 0)
    [entry] = await big.messages.fetch(name, QUEUE_GROUP, 10)
    assert entry.rest == rest


async def test_a_trim_finds_the_bodies_of_entries_deleted_inside_a_stream_it_would_skip(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    """A move deletes entries in place (``manage_remove.lua``); a stream left empty is one the
    trimmer skips (``running/backlog.py``), but not while its address holds bodies."""
    await big.registry.create_address(name, AddressKind.QUEUE)
    for tag in (b'1', b'2'):
        assert await big.messages.publish(name, AddressKind.QUEUE, msg(big_rest(tag))) is True
    k = keys.AddressKeys.of(name)
    for entry_id, _ in await client.xrange(k.streams[NORMAL_BAND]):
        await client.xdel(k.streams[NORMAL_BAND], entry_id)
    assert await held(client, name) == (2, 2)
    await big.upkeep.trim(skip=set(k.streams))
    assert await held(client, name) == (0, 0)
    await big.upkeep.trim(skip=set(k.streams))  # nothing more to find: the index is gone
    assert await held(client, name) == (0, 0)


async def test_deleting_an_address_deletes_its_bodies(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    await big.registry.create_address(name, AddressKind.QUEUE)
    for tag in (b'1', b'2', b'3'):
        assert await big.messages.publish(name, AddressKind.QUEUE, msg(big_rest(tag))) is True
    assert await held(client, name) == (3, 3)
    await big.registry.delete_address(name)
    assert await held(client, name) == (0, 0)


async def test_a_body_published_while_its_address_is_deleted_goes_with_it(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    """The deletion deletes bodies a page at a time before its script (``layout.delete_address``);
    one published after the last page is named by the script, which deletes the index, and its
    body is deleted after it."""
    await big.registry.create_address(name, AddressKind.QUEUE)
    assert await big.messages.publish(name, AddressKind.QUEUE, msg(big_rest(b'1'))) is True
    scripts = Scripts(client)
    await scripts.load()

    async def run(script: str, script_keys: Sequence[str], args: Sequence[Any]) -> Any:
        if script == 'delete_address':  # the pages are done; a publish comes in first
            assert await held(client, name) == (0, 0)
            late = msg(big_rest(b'2'))
            assert await big.messages.publish(name, AddressKind.QUEUE, late) is True
            assert await held(client, name) == (1, 1)
        return await scripts.evalsha(script, script_keys, args)

    await layout.delete_address(client, run, name)
    assert await held(client, name) == (0, 0)


async def eventually(check: Any, what: str, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f'{what} not within {seconds} s')


async def test_acks_trim_away_the_bodies_consumed_and_stop_once_none_is_held(
    big: RedisStore, client: redis.asyncio.Redis, name: str
) -> None:
    """``store/body_trims.py``: the acks of a queue whose big bodies pass here trim its stream
    (no trim pass runs in this test); once it holds none, acks of small ones trim nothing."""
    await big.registry.create_address(name, AddressKind.QUEUE)
    trims = big.body_trims
    rests = [big_rest(b'a'), big_rest(b'b'), b'\x00Sw\xa1\x01c']
    for rest in rests:
        assert await big.messages.publish(name, AddressKind.QUEUE, msg(rest)) is True
    assert name in big.messages.recent_bodies.addresses
    fetched = await big.messages.fetch(name, QUEUE_GROUP, 1)
    big.messages.ack_nowait(name, QUEUE_GROUP, fetched[:1])

    async def one_left() -> bool:
        return await held(client, name) == (1, 1)

    await eventually(one_left, 'the first body to go with its ack')
    big.messages.ack_nowait(name, QUEUE_GROUP, await big.messages.fetch(name, QUEUE_GROUP, 10))

    async def none_left() -> bool:
        return await held(client, name) == (0, 0) and (
            name not in big.messages.recent_bodies.addresses
        )

    await eventually(none_left, 'the last body to go and the address to leave the set')
    before = trims.trims
    assert await big.messages.publish(name, AddressKind.QUEUE, msg(b'\x00Sw\xa1\x01d')) is True
    big.messages.ack_nowait(name, QUEUE_GROUP, await big.messages.fetch(name, QUEUE_GROUP, 10))
    await big.flush()
    await asyncio.sleep(0.2)
    assert trims.trims == before  # small ones only: no trim after their acks
    assert await big.messages.publish(name, AddressKind.QUEUE, msg(big_rest(b'e'))) is True
    assert name in big.messages.recent_bodies.addresses


def test_recent_bodies_keep_the_newest_within_their_bound() -> None:
    recent = bodies.RecentBodies(limit=10)
    for stub_id in 'abc':
        recent.keep(
            stub_id, stub_id.encode() * 4, 'a'
        )  # 4 bytes each: the third pushes out the first
    assert [recent.get(s) for s in 'abc'] == [None, b'bbbb', b'cccc']
    recent.keep('big', b'x' * 11, 'a')  # larger than the bound: not kept, nothing pushed out
    assert recent.get('big') is None
    assert len(recent) == 2
