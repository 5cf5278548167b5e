"""
The redelivery delay in the scripts, on a real Redis: ``release_later.lua`` and ``reclaim.lua``
give a returned entry the due time ``routing/redelivery.py`` computes (on Redis's clock), and
``fetch.lua`` leaves an entry that is not due yet while the entries behind it go out, answering
when it is due.
"""

import asyncio
import uuid

import redis.asyncio

from shoal_broker.routing.redelivery import Backoff
from shoal_broker.store import keys, scripts
from shoal_broker.store.fetch_command import fetch_call

GROUP = 'queue'


async def _now_ms(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _queue_with(
    client: redis.asyncio.Redis, count: int, address: str = ''
) -> tuple[keys.AddressKeys, list[str]]:
    k = keys.AddressKeys.of(address or f'redelay-{uuid.uuid4().hex[:8]}')
    await client.xgroup_create(k.streams[5], GROUP, '$', mkstream=True)
    ids = [(await client.xadd(k.streams[5], {'h': b'', 'r': f'm{i}'})).decode()
           for i in range(count)]  # fmt: skip
    await client.xreadgroup(GROUP, 'gone', {k.streams[5]: '>'}, count=count)
    return k, ids


def _eval(client: redis.asyncio.Redis, name: str, keys_: tuple[str, ...], *args: object) -> object:
    return client.eval(scripts.source(name), len(keys_), *keys_, *args)


async def test_a_delayed_release_is_due_after_its_delay_and_counts_the_attempt(
    client: redis.asyncio.Redis,
) -> None:
    k, ids = await _queue_with(client, 1)
    member, field = keys.entry_member(5, ids[0]), keys.entry_field(5, ids[0])
    before = await _now_ms(client)
    due = int(await _eval(client, 'release_later', (k.returned(GROUP), k.delivery_counts(GROUP)),
                          member, field, '1', 400))  # fmt: skip
    assert before + 400 <= due <= await _now_ms(client) + 400
    assert await client.zscore(k.returned(GROUP), member) == due
    assert await client.hget(k.delivery_counts(GROUP), field) == b'1'


async def test_a_crash_reclaim_waits_by_the_count_it_reaches(client: redis.asyncio.Redis) -> None:
    k, ids = await _queue_with(client, 2)
    counts = k.delivery_counts(GROUP)
    await client.hset(counts, keys.entry_field(5, ids[1]), 2)  # failed twice before
    rule = Backoff(200, 2.0, 600)
    before = await _now_ms(client)
    moved = await _eval(client, 'reclaim', (k.streams[5], k.returned(GROUP), counts),
                        GROUP, 'gone', 5, 100, '1', *rule.script_args)  # fmt: skip
    after = await _now_ms(client)
    assert moved == 2
    for entry_id, count in ((ids[0], 1), (ids[1], 3)):
        score = await client.zscore(k.returned(GROUP), keys.entry_member(5, entry_id))
        wait = rule.wait_ms(count)  # 200, then 800 capped at 600
        assert before + wait <= score <= after + wait
    # a clean exit returns without counting and without a wait
    k2, ids2 = await _queue_with(client, 1)
    await _eval(client, 'reclaim', (k2.streams[5], k2.returned(GROUP), k2.delivery_counts(GROUP)),
                GROUP, 'gone', 5, 100, '0', *rule.script_args)  # fmt: skip
    assert await client.zscore(k2.returned(GROUP), keys.entry_member(5, ids2[0])) == 0


async def test_a_fetch_leaves_a_waiting_entry_and_hands_out_the_rest(
    client: redis.asyncio.Redis,
) -> None:
    address = f'redelay-{uuid.uuid4().hex[:8]}'
    k, ids = await _queue_with(client, 1, address)
    member, field = keys.entry_member(5, ids[0]), keys.entry_field(5, ids[0])
    await _eval(client, 'release_later', (k.returned(GROUP), k.delivery_counts(GROUP)),
                member, field, '1', 60_000)  # fmt: skip
    await client.xadd(k.streams[5], {'h': b'', 'r': b'behind'})
    script_keys, args = fetch_call(address, GROUP, 'r1', 10)
    reply = await _eval(client, 'fetch', script_keys, *args)
    found, left, wait = reply[:3]  # type: ignore[index]
    entries = reply[3:]  # type: ignore[index]
    assert (found, left) == (0, -1)
    assert 59_000 < wait <= 60_000
    assert entries[3] == b'behind'  # the new entry went past the waiting one
    assert len(entries) == 8
    assert await client.zscore(k.returned(GROUP), member) is not None  # still waiting


async def test_entries_returned_behind_follow_the_waiting_one_and_precede_new_ones(
    client: redis.asyncio.Redis,
) -> None:
    """``release_behind.lua``: what an exclusive entity's fetch brought while its consumer gave
    an entry back shares that entry's due time and sorts after it, ahead of the new entries."""
    address = f'redelay-{uuid.uuid4().hex[:8]}'
    k, ids = await _queue_with(client, 3, address)
    members = [keys.entry_member(5, i) for i in ids]
    await _eval(client, 'release_later', (k.returned(GROUP), k.delivery_counts(GROUP)),
                members[0], keys.entry_field(5, ids[0]), '1', 1)  # fmt: skip
    due = await client.zscore(k.returned(GROUP), members[0])
    assert await _eval(client, 'release_behind', (k.returned(GROUP),), *members[2:0:-1]) == due
    assert await client.zrange(k.returned(GROUP), 0, -1) == [m.encode() for m in members]
    assert await client.hget(k.delivery_counts(GROUP), keys.entry_field(5, ids[1])) is None
    await client.xadd(k.streams[5], {'h': b'', 'r': b'new'})
    for _ in range(100):  # due 1 ms after the release
        if await _now_ms(client) > due:
            break
        await asyncio.sleep(0.005)
    script_keys, args = fetch_call(address, GROUP, 'r1', 10)
    reply = await _eval(client, 'fetch', script_keys, *args)
    entries = reply[3:]  # type: ignore[index]
    assert [entries[i + 3] for i in range(0, len(entries), 8)] == [b'm0', b'm1', b'm2', b'new']
    assert [entries[i + 5] for i in range(0, len(entries), 8)] == [b'1', b'0', b'0', b'0']
