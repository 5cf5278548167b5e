"""A plain read of new entries (``lane.READ_ENTRIES``) on the store lane, against a real
redis-server: its reply is handed on as the entries, made in C, wherever it sits among other
replies in RESP2 and RESP3, whole in one read or gathered over several; a read that fails
answers its own command only."""

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
import redis.exceptions
from lanes import send
from processes import RedisServer

from shoal_broker.routing.storage import NORMAL_BAND, Entry
from shoal_broker.store.lane import READ_ENTRIES, Lane


@pytest.fixture(params=[2, 3], ids=['RESP2', 'RESP3'])
async def resp_client(request: pytest.FixtureRequest, plain_redis: RedisServer
                      ) -> AsyncIterator[redis.asyncio.Redis]:  # fmt: skip
    c = redis.asyncio.Redis.from_url(plain_redis.url, protocol=request.param)
    yield c
    await c.aclose()


async def appended(client: redis.asyncio.Redis, stream: str, count: int, size: int = 100
                   ) -> list[Entry]:  # fmt: skip
    """``count`` entries as append_entries.lua writes them (header, rest, then an expiry, an
    origin or a group on some), and the entries a fetch makes of them."""
    made = []
    for i in range(count):
        header, rest = b'\x00Sp\xc0' + bytes([i % 256]), bytes([65 + i % 26]) * size
        fields: dict[str, bytes] = {'h': header, 'r': rest}
        expiry, origin, group = (1_700_000_000_000 + i if i % 3 == 1 else 0), f'conn-{i % 2}', ''
        if expiry:
            fields['x'] = b'%d' % expiry
        fields['c'] = origin.encode()
        if i % 4 == 3:
            group = f'gröup-{i}'
            fields['g'] = group.encode()
        entry_id = await client.xadd(stream, fields)  # type: ignore[arg-type]
        made.append(Entry(entry_id.decode(), NORMAL_BAND, header, rest, expiry, 0, origin, group))
    return made


def read(group: str, stream: str, count: int) -> tuple[object, ...]:
    return (READ_ENTRIES, 'GROUP', group, 'replica-1', 'COUNT', count, 'STREAMS', stream, '>')


async def test_a_read_of_new_entries_is_answered_with_the_entries_among_other_replies(
    resp_client: redis.asyncio.Redis,
) -> None:
    stream, empty, key = (f'lane-entries-{uuid.uuid4().hex}-{n}' for n in range(3))
    await resp_client.xgroup_create(stream, 'g', id='0', mkstream=True)
    await resp_client.xgroup_create(empty, 'g', id='0', mkstream=True)
    expected = await appended(resp_client, stream, 12)
    lane = Lane(resp_client.connection_pool, max_in_flight=4)
    try:
        replies = await (await send(lane, [
            ('SET', key, 'v'), read('g', stream, 5), ('GET', key), read('nope', stream, 5),
            read('g', empty, 5), read('g', stream, 100), ('INCR', key), ('XLEN', stream),
        ]))  # fmt: skip
    finally:
        await lane.close()
    assert replies[0] in (b'OK', 'OK', True)
    assert replies[1] == expected[:5]
    assert all(type(entry) is Entry for entry in replies[1])  # made by the lane, not hiredis
    assert replies[2] == b'v'
    assert isinstance(replies[3], redis.exceptions.ResponseError)  # NOGROUP: only its own
    assert 'NOGROUP' in str(replies[3])
    assert replies[4] == []
    assert replies[5] == expected[5:]
    assert isinstance(replies[6], redis.exceptions.ResponseError)
    assert replies[7] == 12


async def test_a_read_whose_reply_comes_over_several_reads_answers_its_own_command(
    resp_client: redis.asyncio.Redis,
) -> None:
    # ~1.2 MiB of entries: the reply spans reads and is gathered whole, then read; the replies
    # after it are read as before, small reads of new entries included
    big, small = (f'lane-entries-{uuid.uuid4().hex}-{n}' for n in range(2))
    for stream in (big, small):
        await resp_client.xgroup_create(stream, 'g', id='0', mkstream=True)
    many = await appended(resp_client, big, 300, size=4096)
    few = await appended(resp_client, small, 3)
    lane = Lane(resp_client.connection_pool, max_in_flight=4)
    try:
        first = await send(lane, [('PING',), read('g', big, 1000), read('g', small, 2)])
        second = await send(lane, [read('g', small, 2), ('XLEN', big)])
        one, two = await first, await second
    finally:
        await lane.close()
    assert one[1] == many
    assert all(type(entry) is Entry for entry in one[1])
    assert one[2] == few[:2]
    assert two == [few[2:], 300]


async def test_many_small_reads_of_new_entries_in_one_read_each_go_to_their_pipeline(
    resp_client: redis.asyncio.Redis,
) -> None:
    streams = [f'lane-entries-{uuid.uuid4().hex}-{i}' for i in range(150)]
    expected = []
    for stream in streams:
        await resp_client.xgroup_create(stream, 'g', id='0', mkstream=True)
        expected.append(await appended(resp_client, stream, 2, size=700))
    lane = Lane(resp_client.connection_pool, max_in_flight=64)
    try:
        pipelines = [await send(lane, [('ECHO', s), read('g', s, 10)]) for s in streams]
        for stream, pipeline, entries in zip(streams, pipelines, expected, strict=True):
            echoed, found = await pipeline
            assert echoed in (stream.encode(), stream)
            assert found == entries
    finally:
        await lane.close()
