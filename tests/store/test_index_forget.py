"""index_forget.lua: a global index forgets a name only while it still holds the value the
deleting caller saw (docs/redis-modes.md, "Indexes outside the scripts")."""

import uuid

import redis.asyncio

from shoal_broker.store import scripts


async def test_a_name_is_forgotten_only_with_the_value_its_deleter_saw(
    client: redis.asyncio.Redis,
) -> None:
    index = f'shoal:test-index:{uuid.uuid4().hex}'
    forget = scripts.source('index_forget')
    await client.hset(index, mapping={'orders': 'queue:e2', 'prices': 'topic:e1'})
    # a deleter of epoch e1 of orders comes after a creation wrote e2: the entry stays
    assert await client.eval(forget, 1, index, 'orders', 'queue:e1') == 0
    assert await client.hget(index, 'orders') == b'queue:e2'
    assert await client.eval(forget, 1, index, 'prices', 'topic:e1') == 1
    assert not await client.hexists(index, 'prices')
    assert await client.eval(forget, 1, index, 'missing', 'queue:e1') == 0
    await client.delete(index)
