"""Message groups in ``fetch.lua``, ``groups_drop.lua``, ``groups_forget.lua`` and ``reclaim.lua``
on a real Redis, standalone and a Redis Cluster: the replica that meets a group first owns it,
another replica's fetch parks the group's entries for the owner, the owner takes them in order
with its returned ones, and a replica's leaving or reaping hands everything on in order."""

import uuid
from typing import Any

import pytest
import redis.asyncio

from shoal_broker.store import keys, scripts
from shoal_broker.store.fetch_command import fetch_call
from shoal_broker.store.groups import drop_keys

GROUP = 'queue'


@pytest.fixture(params=['standalone', 'cluster'])
def any_client(
    request: pytest.FixtureRequest,
    client: redis.asyncio.Redis,
    cluster_client: redis.asyncio.RedisCluster,
) -> Any:
    return client if request.param == 'standalone' else cluster_client


class Queue:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.address = f'groups-{uuid.uuid4().hex[:8]}'
        self.k = keys.AddressKeys.of(self.address)

    async def create(self) -> 'Queue':
        await self.client.xgroup_create(self.k.streams[5], GROUP, '$', mkstream=True)
        return self

    async def add(self, body: str, group: str = '') -> str:
        fields = {'h': b'', 'r': body.encode()}
        if group:
            fields['g'] = group.encode()
        return (await self.client.xadd(self.k.streams[5], fields)).decode()

    async def run(self, name: str, keys_: tuple[str, ...], *args: object) -> Any:
        return await self.client.eval(scripts.source(name), len(keys_), *keys_, *args)

    async def fetch(self, replica: str, count: int) -> list[tuple[str, str, int]]:
        """(body, group, delivery count) of what ``replica`` is handed, in order."""
        script_keys, args = fetch_call(self.address, GROUP, replica, count)
        reply = await self.run('fetch', script_keys, *args)
        flat = reply[3:]
        return [
            (flat[i + 3].decode(), flat[i + 7].decode(), int(flat[i + 5]))
            for i in range(0, len(flat), 8)
        ]

    async def release(self, entry_id: str) -> None:
        await self.client.zadd(self.k.returned(GROUP), {keys.entry_member(5, entry_id): 0})

    async def owner(self, group: str) -> str | None:
        found = await self.client.hget(self.k.group_owners(GROUP), group)
        return found.decode() if found else None


async def test_the_first_fetcher_owns_a_group_and_another_replica_parks_it_in_order(
    any_client: Any,
) -> None:
    q = await Queue(any_client).create()
    ids = [await q.add(f'a{i}', 'a') for i in range(2)]
    assert await q.fetch('r1', 2) == [('a0', 'a', 0), ('a1', 'a', 0)]
    assert await q.owner('a') == 'r1'
    for i in range(2, 5):
        await q.add(f'a{i}', 'a')
    await q.add('plain')
    # r2 reads them all: the group's go to r1's parking, the ungrouped one to r2
    assert await q.fetch('r2', 10) == [('plain', '', 0)]
    await q.release(ids[1])  # r1 gives a1 back: it goes out again ahead of the parked ones
    assert await q.fetch('r1', 10) == [('a1', 'a', 0), ('a2', 'a', 0), ('a3', 'a', 0),
                                       ('a4', 'a', 0)]  # fmt: skip
    pending = await any_client.xpending_range(q.k.streams[5], GROUP, '-', '+', 10, 'r2')
    assert len(pending) == 1  # only the ungrouped entry is r2's: the parked ones went to r1


async def test_a_look_cut_short_lets_nothing_newer_of_a_group_overtake(any_client: Any) -> None:
    q = await Queue(any_client).create()
    await q.add('x0', 'x')
    assert await q.fetch('r2', 1) == [('x0', 'x', 0)]
    await q.add('b0', 'b')
    assert await q.fetch('r1', 1) == [('b0', 'b', 0)]
    x1 = await q.add('x1', 'x')
    for i in range(1, 3):
        await q.add(f'b{i}', 'b')
    assert await q.fetch('r2', 10) == [('x1', 'x', 0)]  # b1 and b2 parked for r1
    await q.release(x1)  # r2 gives x1 back
    # r1's look at one returned entry (x1, parked for r2: no credit spent) ends before b1
    assert await q.fetch('r1', 1) == []
    assert await q.fetch('r1', 1) == [('b1', 'b', 0)]
    assert await q.fetch('r1', 5) == [('b2', 'b', 0)]
    assert await q.fetch('r2', 5) == [('x1', 'x', 0)]


async def test_leaving_hands_the_groups_and_what_was_parked_on_in_order(any_client: Any) -> None:
    q = await Queue(any_client).create()
    await q.add('c0', 'c')
    assert await q.fetch('r1', 1) == [('c0', 'c', 0)]
    for i in range(1, 3):
        await q.add(f'c{i}', 'c')
    assert await q.fetch('r2', 10) == []
    dropped = await q.run('groups_drop', drop_keys(q.address, GROUP), 'r1', q.k.notify)
    assert dropped == 1 + 2  # one group, two parked entries
    assert await q.owner('c') is None
    await q.add('c3', 'c')
    assert [b for b, _, _ in await q.fetch('r2', 10)] == ['c1', 'c2', 'c3']
    assert await q.owner('c') == 'r2'


async def test_a_reaped_owner_s_parked_entries_come_back_uncounted(any_client: Any) -> None:
    q = await Queue(any_client).create()
    await q.add('d0', 'd')
    assert await q.fetch('dead', 1) == [('d0', 'd', 0)]  # in flight at the dead replica
    await q.add('d1', 'd')
    assert await q.fetch('r2', 10) == []  # parked for the dead one
    reclaim_keys = (q.k.streams[5], q.k.returned(GROUP), q.k.delivery_counts(GROUP),
                    q.k.group_parked(GROUP))  # fmt: skip
    assert await q.run('reclaim', reclaim_keys, GROUP, 'dead', 5, 100, '1') == 2
    await q.run('groups_drop', drop_keys(q.address, GROUP), 'dead', q.k.notify)
    # the one in flight counts an attempt, the parked one does not
    assert await q.fetch('r2', 10) == [('d0', 'd', 1), ('d1', 'd', 0)]


async def test_forgetting_a_group_leaves_one_another_replica_owns(any_client: Any) -> None:
    q = await Queue(any_client).create()
    await q.add('e0', 'e')
    await q.fetch('r1', 1)
    forget_keys = (q.k.group_owners(GROUP), q.k.group_held(GROUP))
    assert await q.run('groups_forget', forget_keys, 'r2', 'e') == 0
    assert await q.owner('e') == 'r1'
    assert await q.run('groups_forget', forget_keys, 'r1', 'e') == 1
    assert await q.owner('e') is None
