"""The short way through ``lua/fetch.lua`` (docs/performance.md#bulk-fetch): a replica fetching
alone (or for a group only it reads) for a subscription read in bulk, with nothing returned, no
other band in use and no message group, gets its answer from four plain reads at most, and
anything that would give the script something to do takes it the whole way: each case below
hands out what the short way would not. And the broker's rule for when a subscription's fetches
go in bulk."""

import asyncio
import contextlib
import uuid
from typing import Any

from fetchscript import CommandsOn
from startedstores import started_store

from shoal_broker.routing.storage import NORMAL_BAND, QUEUE_GROUP, Entry, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, scripts
from shoal_broker.store.fetch_command import fetch_call

GROUP = 'lone-sub'


def _fetch(client: Any, address: str, count: int = 10, *, bulk: bool = True) -> list[Any]:
    """One fetch by replica ``a`` for one consumer; ``bulk``: band 5 left to the caller's own
    read, as the broker sends it once a subscription fetches in bulk."""
    script_keys, args = fetch_call(address, GROUP, 'a', count, consumers=1, read_default=not bulk)
    reply: list[Any] = client.eval(scripts.source('fetch'), len(script_keys), *script_keys, *args)
    return reply


def _handed(reply: list[Any]) -> list[tuple[int, str]]:
    """(band, id) of each entry the reply hands out."""
    return [(int(reply[i]), reply[i + 1].decode()) for i in range(3, len(reply), 8)]


def _address(client: Any) -> tuple[str, keys.AddressKeys]:
    """A new address whose band 5 has the group, and replica ``a``'s record in the sharing
    (its first fetch writes it)."""
    address = f'lone-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    client.xgroup_create(k.streams[5], GROUP, '0', mkstream=True)
    assert _fetch(client, address) == [0, -1, 0]
    assert client.hexists(k.shares(GROUP), 'a')
    return address, k


def test_alone_with_nothing_returned_a_fetch_is_four_reads(store_client: Any) -> None:
    client = store_client
    address, k = _address(client)
    client.xadd(k.streams[5], {'h': b'h', 'r': b'new'})  # the caller's own read takes it
    with contextlib.closing(CommandsOn(client, k.streams[5])) as seen:
        seen.since_last()
        assert _fetch(client, address) == [0, -1, 0]
        ran = [c.split(' ')[0] for c in seen.since_last() if not c.startswith('EVAL')]
    assert ran == ['ZCARD', 'EXISTS', 'HLEN', 'HEXISTS']


def test_a_returned_entry_is_handed_out(store_client: Any) -> None:
    client = store_client
    address, k = _address(client)
    entry = client.xadd(k.streams[5], {'h': b'h', 'r': b'back'}).decode()
    client.xreadgroup(GROUP, 'b', {k.streams[5]: '>'}, count=1)  # held by another replica
    ms, seq = entry.split('-')
    client.zadd(k.returned(GROUP), {f'5|{int(ms):015d}-{int(seq):010d}': 0})  # released
    reply = _fetch(client, address)
    assert (reply[0], _handed(reply)) == (1, [(5, entry)])


def test_an_entry_in_another_band_in_use_is_handed_out(store_client: Any) -> None:
    client = store_client
    address, k = _address(client)
    client.xgroup_create(k.streams[2], GROUP, '0', mkstream=True)
    entry = client.xadd(k.streams[2], {'h': b'h', 'r': b'priority 7'}).decode()
    client.sadd(k.levels, 2)  # as a publish at priority 7 leaves it (mark_band.lua)
    reply = _fetch(client, address)
    assert _handed(reply) == [(2, entry)]


def test_with_message_groups_seen_the_caller_gives_back_its_own_read(store_client: Any) -> None:
    client = store_client
    address, k = _address(client)
    client.hset(k.group_owners(GROUP), 'g1', 'a')
    # a subscription with message groups reports one entry more than new band-5 ones: the
    # caller gives what its plain read took back behind them
    assert _fetch(client, address)[0] == 1


def test_beside_another_replicas_record_the_sharing_rule_decides(store_client: Any) -> None:
    client = store_client
    address, k = _address(client)
    client.xadd(k.streams[5], {'h': b'h', 'r': b'shared'})
    script_keys, args = fetch_call(address, GROUP, 'b', 10, consumers=1, read_default=False)
    client.eval(scripts.source('fetch'), len(script_keys), *script_keys, *args)  # b joins
    reply = _fetch(client, address)
    assert int(reply[1]) >= 0  # what it left for the others: counted, not "alone" (-1)


def test_a_fetch_that_reads_band_5_itself_takes_the_new_entries(store_client: Any) -> None:
    client = store_client
    address, k = _address(client)
    entry = client.xadd(k.streams[5], {'h': b'h', 'r': b'new'}).decode()
    assert _handed(_fetch(client, address, bulk=False)) == [(5, entry)]


def test_a_replica_new_to_the_sharing_writes_its_record(store_client: Any) -> None:
    client = store_client
    address = f'lone-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    client.xgroup_create(k.streams[5], GROUP, '0', mkstream=True)
    script_keys, args = fetch_call(address, GROUP, 'b', 10, consumers=1, read_default=False)
    client.eval(scripts.source('fetch'), len(script_keys), *script_keys, *args)  # b alone
    _fetch(client, address)
    assert client.hexists(k.shares(GROUP), 'a')  # the record b's fetches will see


def _script_reads(commands: list[str]) -> set[str]:
    """The commands ``fetch.lua`` ran that tell its two ways apart: the whole script lists the
    levels SET (``SMEMBERS``); the four reads begin with the returned entries' ``ZCARD``."""
    return {c.split(' ')[0] for c in commands} & {'SMEMBERS', 'ZCARD'}


async def test_fetches_of_two_new_entries_or_more_go_in_bulk_until_one_hands_out_another(
    store_url: str, store_client: Any
) -> None:
    """The broker's side (``BulkFetches.judge``): a fetch that hands out two new priority-4
    entries or more, and nothing else, makes the next fetches of its subscription go in bulk
    (the script's four reads, the band read beside it); a fetch that hands out a returned entry
    ends that, and so does one that comes back with a single entry when it asked for more (at a
    trickle one script call costs the broker less than the pair)."""
    name = f'lone-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(name)
    async with started_store(store_url) as store:
        await store.registry.create_address(name, AddressKind.QUEUE)

        async def publish(*bodies: bytes) -> None:
            for body in bodies:
                message = OutgoingMessage(NORMAL_BAND, b'', body, 0)
                await store.messages.publish(name, AddressKind.QUEUE, message)

        with contextlib.closing(CommandsOn(store_client, k.streams[5])) as seen:

            async def fetched(count: int) -> tuple[list[bytes], set[str], list[Entry]]:
                seen.since_last()
                entries = list(await store.messages.fetch(name, QUEUE_GROUP, count))
                return [e.rest for e in entries], _script_reads(seen.since_last()), entries

            await publish(b'0', b'1', b'2', b'3')
            assert (await fetched(2))[:2] == ([b'0', b'1'], {'SMEMBERS'})  # the whole script
            bodies, ran, [one] = await fetched(1)
            assert (bodies, ran) == ([b'2'], {'ZCARD'})  # in bulk; full, it says nothing
            await store.messages.release(name, QUEUE_GROUP, one, delivery_failed=False)
            # the four reads find it returned and go on: it goes out, and what the plain read
            # beside took goes back behind it
            assert (await fetched(5))[:2] == ([b'2'], {'ZCARD', 'SMEMBERS'})
            for _ in range(100):  # the give-back runs in the background
                bodies, ran, _ = await fetched(5)
                if bodies:
                    break
                await asyncio.sleep(0.05)
            assert (bodies, ran) == ([b'3'], {'SMEMBERS'})  # no longer in bulk
            await publish(b'4')
            assert (await fetched(5))[:2] == ([b'4'], {'SMEMBERS'})  # one: still not
            await publish(b'5', b'6')
            assert (await fetched(5))[:2] == ([b'5', b'6'], {'SMEMBERS'})
            await publish(b'7')
            assert (await fetched(5))[:2] == ([b'7'], {'ZCARD'})  # in bulk, and short
            await publish(b'8')
            assert (await fetched(5))[:2] == ([b'8'], {'SMEMBERS'})
