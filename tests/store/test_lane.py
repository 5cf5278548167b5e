"""The store's pipeline lane on a real redis-server: several pipelines in flight on one
connection, applied and answered in the order written; a failed connection is never reused."""

import asyncio
import gc
import uuid
from typing import Any

import hiredis
import pytest
import redis.asyncio
import redis.exceptions
from lanes import send
from processes import RedisServer

from shoal_broker.settings import AddressKind
from shoal_broker.store import connect, keys
from shoal_broker.store.lane import (
    BULK_HEADS,
    CACHED_BULK_HEADS,
    CRLF,
    Encoded,
    Lane,
    encode,
    pack,
    pieces,
)
from shoal_broker.store.redisstore import RedisStore


def test_commands_are_packed_as_resp_arrays_of_bulk_strings() -> None:
    packed = pack([('SET', 'k', b'v\r\n', 7), ('INCRBYFLOAT', 'f', 1.5)])
    assert packed == (
        b'*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$1\r\n7\r\n'
        b'*3\r\n$11\r\nINCRBYFLOAT\r\n$1\r\nf\r\n$3\r\n1.5\r\n'
    )
    assert pack([('SET', 'é', 'ü')]) == b'*3\r\n$3\r\nSET\r\n$2\r\n\xc3\xa9\r\n$2\r\n\xc3\xbc\r\n'
    with pytest.raises(TypeError):
        pack([('SET', 'k', None)])
    for unpackable in [('SET', 'k', True), ('SET', 'k', bytearray(b'v')), ['SET', 'k', 'v']]:
        with pytest.raises(TypeError):
            pack([unpackable])  # type: ignore[list-item]


def test_encoded_arguments_end_a_command_as_if_hiredis_had_packed_them() -> None:
    values = [b'', b'v\r\n', b'x' * CACHED_BULK_HEADS, 'é'.encode()]  # one head not cached
    encoded = Encoded([encode(*values[:2]), encode(values[2]), BULK_HEADS[2], values[3], CRLF], 4)
    assert pack([('RPUSH', 'k', encoded), ('LLEN', 'k')]) == pack(
        [('RPUSH', 'k', *values), ('LLEN', 'k')]
    )
    assert pack([('EVAL', 's', 0, Encoded([], 0))]) == pack([('EVAL', 's', 0)])
    assert CACHED_BULK_HEADS not in BULK_HEADS  # a length made once, not kept: no unbounded cache


async def test_encoded_arguments_reach_redis_as_the_values_they_encode(
    client: redis.asyncio.Redis,
) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    lane = Lane(client.connection_pool, max_in_flight=2)
    values = [b'a', b'', b'\r\n*1\r\n', b'z' * (CACHED_BULK_HEADS + 1)]
    replies = await send(lane, [('RPUSH', key, b'first', Encoded([encode(*values)], 4))])
    assert await replies == [5]
    assert await client.lrange(key, 0, -1) == [b'first', *values]
    await lane.close()


def test_a_pipeline_with_parts_apart_keeps_them_as_they_are() -> None:
    body = b'b' * (1 << 20)
    apart = Encoded([BULK_HEADS[len(body)], body, CRLF], 1, apart=True)
    commands = [('SET', 'k', apart), ('RPUSH', 'l', Encoded([encode(b'v')], 1)), ('GET', 'k')]
    parts, is_apart = pieces(commands)
    assert is_apart
    assert any(part is body for part in parts)  # the body itself, not a copy of it
    assert (
        b''.join(parts)
        == pack(commands)
        == pack([('SET', 'k', body), ('RPUSH', 'l', b'v'), ('GET', 'k')])
    )
    assert pieces(commands[1:])[1] is False


async def test_a_pipeline_written_in_pieces_reaches_redis_whole(
    client: redis.asyncio.Redis,
) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    lane = Lane(client.connection_pool, max_in_flight=2)
    body = bytes(range(256)) * 4096
    apart = Encoded([BULK_HEADS[len(body)], body, CRLF], 1, apart=True)
    replies = await (await send(lane, [('SET', key, apart), ('STRLEN', key), ('GET', key)]))
    assert replies == [b'OK', len(body), body]
    await lane.close()


async def test_pipelines_in_flight_are_applied_and_answered_in_the_order_written(
    client: redis.asyncio.Redis,
) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    lane = Lane(client.connection_pool, max_in_flight=8)
    futures = []
    for i in range(8):  # none awaited before the next is written
        await lane.wait_for_room()
        futures.append(await send(lane, [('RPUSH', key, i), ('LLEN', key)]))
    assert lane.in_flight > 0 or all(f.done() for f in futures)
    replies = await asyncio.gather(*futures)
    assert replies == [[i + 1, i + 1] for i in range(8)]
    assert await client.lrange(key, 0, -1) == [b'%d' % i for i in range(8)]
    await lane.close()


async def test_an_error_reply_belongs_to_its_command_only(client: redis.asyncio.Redis) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    lane = Lane(client.connection_pool, max_in_flight=2)
    replies = await (await send(lane, [('SET', key, 'x'), ('INCR', key), ('GET', key)]))
    assert replies[0] == b'OK'
    assert isinstance(replies[1], redis.exceptions.ResponseError)
    assert replies[2] == b'x'
    await lane.close()


async def test_a_killed_connection_fails_what_is_in_flight_and_the_next_pipeline_gets_a_new_one(
    client: redis.asyncio.Redis,
) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    lane = Lane(client.connection_pool, max_in_flight=4)
    name = f'lane-{uuid.uuid4().hex[:8]}'
    await (await send(lane, [('CLIENT', 'SETNAME', name)]))
    blocked = await send(lane, [('BLPOP', f'{key}-never', 0)])  # holds the connection's replies
    behind = await send(lane, [('SET', key, 'after')])
    await asyncio.sleep(0.2)
    clients = await client.client_list()
    [victim] = [c for c in clients if c['name'] == name]
    await client.client_kill_filter(_id=victim['id'])
    for future in (blocked, behind):
        with pytest.raises(redis.exceptions.ConnectionError):
            await asyncio.wait_for(future, 10)
    assert await client.get(key) is None  # queued behind BLPOP on the killed connection
    assert await (await send(lane, [('SET', key, 'fresh'), ('GET', key)])) == [b'OK', b'fresh']
    await lane.close()


async def test_a_pooled_connection_redis_closed_while_idle_is_not_written_to(
    plain_redis: RedisServer, client: redis.asyncio.Redis
) -> None:
    """An idle connection of the pool that Redis closed (CLIENT KILL, its ``timeout``, a
    restart): its end has been read, so its transport no longer reads, and redis-py's pool hands
    it out unchecked. A pipeline written on it would hear nothing until the socket timeout fails
    it; the lane connects afresh instead."""
    pool = redis.asyncio.ConnectionPool.from_url(plain_redis.url, socket_timeout=1)
    idle = redis.asyncio.Redis(connection_pool=pool)
    name = f'idle-{uuid.uuid4().hex[:8]}'
    await idle.client_setname(name)  # made, then back in the pool
    [victim] = [c for c in await client.client_list() if c['name'] == name]
    await client.client_kill_filter(_id=victim['id'])
    conn = pool._available_connections[-1]  # the one the lane is about to get
    for _ in range(500):  # the loop reads the end of the killed connection meanwhile
        if conn._reader.at_eof():
            break
        await asyncio.sleep(0.01)
    assert conn._reader.at_eof()
    lane = Lane(pool, max_in_flight=4)
    key = f'lane-{uuid.uuid4().hex}'
    assert await (await send(lane, [('SET', key, 'v'), ('GET', key)])) == [b'OK', b'v']
    await lane.close()
    await pool.disconnect()


async def test_the_stores_clients_connect_again_for_a_pooled_connection_redis_closed(
    plain_redis: RedisServer, client: redis.asyncio.Redis
) -> None:
    """The store's pools keep redis-py's check of an idle connection (``store/stale.py``): the
    first command after Redis closed it (a restart, CLIENT KILL) is answered, not failed with
    "Connection closed by server"."""
    store_client = connect.client(plain_redis.url)
    name = f'idle-{uuid.uuid4().hex[:8]}'
    await store_client.client_setname(name)
    [victim] = [c for c in await client.client_list() if c['name'] == name]
    await client.client_kill_filter(_id=victim['id'])
    await asyncio.sleep(0.2)  # the end of the killed connection arrives meanwhile
    assert await store_client.ping() is True
    await store_client.aclose()


async def test_replies_split_over_many_reads_are_put_together_for_their_pipeline(
    client: redis.asyncio.Redis,
) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    big = bytes(range(256)) * 12_288  # 3 MiB: its reply arrives in many reads
    await client.set(key, big)
    lane = Lane(client.connection_pool, max_in_flight=4)
    first = await send(lane, [('GET', key), ('STRLEN', key), ('GET', key)])
    second = await send(lane, [('APPEND', key, 'x')])
    assert await first == [big, len(big), big]
    assert await second == [len(big) + 1]
    await lane.close()


async def test_many_small_replies_in_one_read_are_each_matched_with_their_pipeline(
    client: redis.asyncio.Redis,
) -> None:
    # hundreds of KiB of replies of 1-3 KiB each arrive together and are read in pieces
    # (lane.FEED_BYTES): every reply, wherever a piece ends, goes to its own pipeline
    keys = [f'lane-{uuid.uuid4().hex}-{i}' for i in range(300)]
    values = [bytes([i % 251]) * (1000 + 7 * i) for i in range(len(keys))]
    await client.mset(dict(zip(keys, values, strict=True)))
    lane = Lane(client.connection_pool, max_in_flight=64)
    pipelines = [await send(lane, [('GET', key), ('STRLEN', key)]) for key in keys]
    for pipeline, value in zip(pipelines, values, strict=True):
        assert await pipeline == [value, len(value)]
    await lane.close()


async def test_a_pipeline_answered_while_its_write_drains_gets_its_replies_in_order(
    client: redis.asyncio.Redis,
) -> None:
    # 4 MiB of ECHOs: past WRITE_HIGH_WATER, so the lane waits for the write to drain while
    # Redis already answers the first of them; those replies are read and held, not left in the
    # reader, then handed to the pipeline once it is owed them, and the next pipeline its own
    payloads = [bytes([65 + i % 26]) * 1024 + str(i).encode() for i in range(4096)]
    lane = Lane(client.connection_pool, max_in_flight=4)
    big = await send(lane, [('ECHO', p) for p in payloads])
    small = await send(lane, [('ECHO', 'after')])
    assert await big == payloads
    assert await small == [b'after']
    await lane.close()


async def test_a_connection_silent_past_its_socket_timeout_fails_what_it_owes(
    plain_redis: RedisServer,
) -> None:
    key = f'lane-{uuid.uuid4().hex}'
    pool = redis.asyncio.ConnectionPool.from_url(plain_redis.url, socket_timeout=0.5)
    lane = Lane(pool, max_in_flight=4)
    blocked = await send(lane, [('BLPOP', f'{key}-never', 0)])  # Redis answers it never
    behind = await send(lane, [('SET', key, 'after')])
    done, _ = await asyncio.wait({blocked, behind}, timeout=5)
    assert done == {blocked, behind}
    for future in done:
        assert isinstance(future.exception(), TimeoutError | redis.exceptions.TimeoutError)
    # the next pipeline goes out on a fresh connection, not behind the BLPOP
    assert await (await send(lane, [('SET', key, 'fresh'), ('GET', key)])) == [b'OK', b'fresh']
    await lane.close()
    await pool.disconnect()


async def test_a_malformed_reply_fails_what_the_connection_owes_and_it_is_replaced() -> None:
    """A server that answers PING with bytes that are no RESP at all (and everything else with
    +OK): the lane fails the pipelines owed on that connection with the parser's error, as its
    own decision (not through an error the event loop reports), and the next pipeline goes out
    on a fresh connection."""
    connections = 0
    loop_errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: loop_errors.append(context))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        requests = hiredis.Reader()
        while data := await reader.read(65536):
            requests.feed(data)
            while (command := requests.gets()) is not False:
                bad = command[0].upper() == b'PING' and connections == 1
                writer.write(b'@not resp\r\n' if bad else b'+OK\r\n')
        writer.close()

    server = await asyncio.start_server(serve, '127.0.0.1', 0)
    port = server.sockets[0].getsockname()[1]
    pool = redis.asyncio.ConnectionPool.from_url(f'redis://127.0.0.1:{port}/0')
    lane = Lane(pool, max_in_flight=4)
    try:
        broken = await send(lane, [('PING',)])
        behind = await send(lane, [('SET', 'k', 'v')])
        done, _ = await asyncio.wait({broken, behind}, timeout=5)
        assert done == {broken, behind}
        for future in done:
            assert isinstance(future.exception(), redis.exceptions.InvalidResponse)
        assert await (await send(lane, [('SET', 'k', 'v')])) == [b'OK']
        assert connections == 2
        assert loop_errors == []
    finally:
        await lane.close()
        await pool.disconnect()
        server.close()
        await server.wait_closed()


async def test_an_address_is_created_with_its_queue_group_in_one_step(
    plain_redis: RedisServer, client: redis.asyncio.Redis
) -> None:
    stores = [RedisStore.from_url(plain_redis.url, f'r{i}') for i in range(2)]
    for store in stores:
        await store.start()
    name = f'addr-{uuid.uuid4().hex[:10]}'
    kinds = await asyncio.gather(
        stores[0].registry.create_address(name, AddressKind.QUEUE),
        stores[1].registry.create_address(name, AddressKind.TOPIC),
    )
    assert kinds[0] is kinds[1]  # whoever came first decided the kind for both
    if kinds[0] is AddressKind.QUEUE:  # and a queue's group exists as soon as the address does
        for band in range(10):
            groups = await client.xinfo_groups(keys.AddressKeys.of(name).streams[band])
            assert [g['name'] for g in groups] == [b'queue']
    for store in stores:
        await store.close()


async def test_no_collection_runs_while_replies_are_handed_out(client: redis.asyncio.Redis) -> None:
    """The cyclic collector waits while a reply is parsed and answered (``Lane._received``), so
    the reply's lists are gone by the time it looks; it runs again afterwards, also after an
    answer that raised."""
    lane = Lane(client.connection_pool, max_in_flight=2)
    started: list[int] = []
    during: list[tuple[bool, int]] = []
    answered = asyncio.Event()

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == 'start':
            started.append(info['generation'])

    def answer(replies: list[Any] | None, error: BaseException | None) -> None:
        before = len(started)
        young = [[i] for i in range(3 * gc.get_threshold()[0])]  # past the young threshold
        during.append((gc.isenabled(), len(started) - before))
        del young
        answered.set()
        if len(during) == 2:
            raise RuntimeError('an answer that fails')

    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        for sent in (1, 2):
            answered.clear()
            await lane.send_then([('PING',)], answer)
            await asyncio.wait_for(answered.wait(), 10)
            assert len(during) == sent
            assert gc.isenabled()
        assert during == [(False, 0), (False, 0)]
        before = len(started)
        young = [[i] for i in range(3 * gc.get_threshold()[0])]
        assert len(started) > before  # collecting again
        del young
    finally:
        gc.callbacks.remove(count)
        await lane.close()
