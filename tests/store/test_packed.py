"""Background pipelines packed and read by hiredis (``store/packed.py``) on a real redis-server:
replies in order with error replies in their place, the first error raised only once every
reply is read (so the connection stays in step), a connection Redis closed while it sat in the
pool replaced, and a Redis that is gone reported as a connection error."""

from collections.abc import AsyncIterator

import pytest
import redis.asyncio
import redis.exceptions
from processes import RedisServer

from shoal_broker.store import packed
from shoal_broker.store.lane import CONNECTION_ERRORS


@pytest.fixture
async def client(own_redis: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(own_redis.url, socket_timeout=2)
    yield c
    await c.aclose()


async def test_replies_come_in_order_with_error_replies_in_their_place(
    client: redis.asyncio.Redis,
) -> None:
    replies = await packed.pipeline(
        client,
        [
            ('SET', 'packed-text', 'x'),
            ('INCR', 'packed-text'),  # not a number: an error reply
            ('EVALSHA', '0' * 40, 0),  # a script Redis does not know
            ('INCRBY', 'packed-count', 41),
            ('GET', 'packed-text'),
        ],
        raise_on_error=False,
    )
    assert replies[0] == b'OK'
    assert isinstance(replies[1], redis.exceptions.ResponseError)
    assert isinstance(replies[2], redis.exceptions.NoScriptError)  # redis-py's own classes
    assert replies[3:] == [41, b'x']


async def test_the_first_error_is_raised_once_every_reply_is_read(
    client: redis.asyncio.Redis,
) -> None:
    with pytest.raises(redis.exceptions.ResponseError):
        await packed.pipeline(
            client,
            [('SET', 'packed-a', 'a'), ('INCR', 'packed-a'), ('SET', 'packed-b', 'b')],
            raise_on_error=True,
        )
    assert await client.get('packed-b') == b'b'  # the calls after the error ran
    # the connection went back in step: the next pipeline reads its own replies, not the last's
    assert await packed.pipeline(client, [('GET', 'packed-a')], raise_on_error=True) == [b'a']


async def test_a_connection_redis_closed_in_the_pool_is_replaced(
    client: redis.asyncio.Redis, own_redis: RedisServer
) -> None:
    assert await packed.pipeline(client, [('PING',)], raise_on_error=True) == [b'PONG']
    other = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        killed = await other.client_kill_filter(_type='normal', skipme=True)
    finally:
        await other.aclose()
    assert killed >= 1  # the pooled connection the first pipeline used
    assert await packed.pipeline(client, [('PING',)], raise_on_error=True) == [b'PONG']


async def test_a_redis_that_is_gone_is_a_connection_error(own_redis: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(own_redis.url, socket_timeout=2)
    try:
        assert await packed.pipeline(client, [('PING',)], raise_on_error=True) == [b'PONG']
        own_redis.stop()
        with pytest.raises(CONNECTION_ERRORS):
            await packed.pipeline(client, [('PING',)], raise_on_error=True)
    finally:
        await client.aclose()
