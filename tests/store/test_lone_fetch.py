"""The short way through ``lua/fetch.lua`` (docs/performance.md#bulk-fetch): a replica fetching
alone for a subscription read in bulk, with nothing returned, no other band in use and no message
group, gets its answer from four plain reads, and anything that would give the script something
to do takes it the whole way. Each case below hands out what the short way would not."""

import contextlib
import uuid
from typing import Any

from fetchscript import CommandsOn

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
