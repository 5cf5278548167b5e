"""The pipeline lane on a primary demoted to a replica (what a Sentinel failover does to a primary
that is still up): a READONLY reply counts as a lost connection, so the next pipeline goes out on
a fresh one, which through Sentinel finds the new primary."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions
from lanes import send
from processes import LOOPBACK, RedisServer, free_port

from shoal_broker.store.lane import Lane


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


async def test_a_readonly_reply_fails_the_pipeline_and_the_next_gets_a_new_connection(
    own_redis: RedisServer,
) -> None:
    pool = redis.asyncio.ConnectionPool.from_url(own_redis.url)
    lane = Lane(pool, max_in_flight=4)
    try:
        assert await _send(lane, [('CLIENT', 'SETNAME', 'lane-old'), ('SET', 'k', 'v')]) == [
            b'OK',
            b'OK',
        ]
        admin = redis.Redis(host=LOOPBACK, port=own_redis.port)
        try:  # demoted: a replica of a primary that is not there, read-only
            admin.replicaof(LOOPBACK, free_port())
        finally:
            admin.close()
        with pytest.raises(redis.exceptions.ConnectionError, match='now a replica'):
            await _send(lane, [('SET', 'k', 'w')])
        assert await _send(lane, [('CLIENT', 'GETNAME'), ('GET', 'k')]) == [None, b'v']
    finally:
        await lane.close()
        await pool.disconnect()


async def _send(lane: Lane, commands: list[tuple[Any, ...]]) -> list[Any]:
    return await asyncio.wait_for(await send(lane, commands), 10)
