"""The notification channel read straight off its connection, on a real redis-server: messages
come through in order with their channel, subscribe confirmations and pongs are skipped, a quiet
channel is pinged, and a dead one raises so the store re-subscribes."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
from processes import RedisServer

from shoal_broker.store.notifications import NotificationReader


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(redis_server.url)
    yield c
    await c.aclose()


@pytest.fixture
async def pubsub(client: redis.asyncio.Redis) -> AsyncIterator[Any]:
    p = client.pubsub()
    yield p
    await p.aclose()


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
