"""The sharing rule's fast path in ``lua/fetch.lua``: when every other replica serving a
subscription has nothing reserved and no free credit, the rule would grant the fetching replica
all it can take, so the fetch neither counts what is available nor rewrites the others' records.
Its shares are the rule's (``tests/unit/test_sharing.py``); here, on a real Redis, that the work
is skipped, that nothing is handed out twice or lost, and that the rule takes over again as soon
as another replica has free credit."""

import contextlib
import uuid
from typing import Any

from fetchscript import GROUP, CommandsOn, fetch, publish

from shoal_broker.store import keys


def _counted(commands: list[str], k: keys.AddressKeys) -> int:
    """How many of ``commands`` counted what is available: the returned entries due, or the
    stream's entries added."""
    return sum(
        c.startswith(f'ZCOUNT {k.returned(GROUP)} ') or c == f'XINFO STREAM {k.streams[5]}'
        for c in commands
    )


def _records_written(commands: list[str], k: keys.AddressKeys) -> set[str]:
    """The replicas whose records ``commands`` wrote in the shares HASH."""
    prefix = f'HSET {k.shares(GROUP)} '
    written: set[str] = set()
    for command in commands:
        if command.startswith(prefix):
            fields = command[len(prefix) :].split(' ')
            written.update(f for f in fields if f in ('a', 'b'))
    return written


def test_a_fetch_skips_the_count_and_the_others_records_while_they_are_idle(
    store_client: Any,
) -> None:
    client = store_client
    address = f'topic-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    client.xgroup_create(k.streams[5], GROUP, '0', mkstream=True)
    taken: list[str] = []
    with contextlib.closing(CommandsOn(client, k.streams[5])) as seen:
        for replica in 'aba':  # both keep a record, with free credit
            assert fetch(client, address, replica, 1000)[1] == []
        publish(client, address, 30)
        left, ids = fetch(client, address, 'a', 1000)  # the rule: 15 each, b's reserved
        assert (left, len(ids)) == (15, 15)
        taken += ids
        seen.since_last()
        left, ids = fetch(client, address, 'b', 15)  # b takes its 15 with all its credit
        assert (left, len(ids)) == (0, 15)
        taken += ids
        assert _counted(seen.since_last(), k) > 0  # a has free credit: the rule counted

        # b has nothing reserved and no free credit: a takes all there is, uncounted, and
        # writes its own record only
        publish(client, address, 10)
        b_record = client.hget(k.shares(GROUP), 'b')
        left, ids = fetch(client, address, 'a', 1000)
        assert (left, len(ids)) == (0, 10)
        taken += ids
        commands = seen.since_last()
        assert _counted(commands, k) == 0
        assert _records_written(commands, k) == {'a'}
        assert client.hget(k.shares(GROUP), 'b') == b_record
        consumers, credit, reserved = client.hget(k.shares(GROUP), 'a').split()[:3]
        assert (consumers, credit, reserved) == (b'1', b'990', b'0')  # as the rule leaves it

        # a fetch that takes less than there is: b's share of the rest is the rule's
        publish(client, address, 40)
        left, ids = fetch(client, address, 'a', 25)
        taken += ids
        assert (left, len(ids)) == (0, 25)  # b idle: a takes its whole credit (the caller
        # fetches again after a full fetch, so what is left past it goes uncounted)
        assert _counted(seen.since_last(), k) == 0

        # a took its whole credit, so b's fetch takes the fast path too; once b has free
        # credit left, a's next fetch runs the rule again and shares with it
        left, ids = fetch(client, address, 'b', 1000)
        taken += ids
        assert (left, len(ids)) == (0, 15)
        assert _counted(seen.since_last(), k) == 0
        publish(client, address, 20)
        left, ids = fetch(client, address, 'a', 1000)
        taken += ids
        assert left + len(ids) == 20
        assert 9 <= len(ids) <= 11  # free credit 1 000 against 985
        assert _counted(seen.since_last(), k) > 0

    assert len(taken) == len(set(taken)) == 30 + 10 + 40 + 20 - left
    assert client.xpending(k.streams[5], GROUP)['pending'] == len(taken)


def test_a_fetch_capped_below_its_credit_counts_what_is_left(store_client: Any) -> None:
    """The count (at most 500 a fetch) may be below the replica's free credit: then the rule's
    record needs what is available, counted after the read, and the fetch says what it left."""
    client = store_client
    address = f'topic-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    client.xgroup_create(k.streams[5], GROUP, '0', mkstream=True)
    for replica, credit in (('a', 1000), ('b', 0), ('a', 1000)):  # b: no free credit
        assert fetch(client, address, replica, 1000, credit)[1] == []
    publish(client, address, 30)
    left, ids = fetch(client, address, 'a', 20, 1000)
    assert (left, len(ids)) == (10, 20)
    consumers, credit, reserved = client.hget(k.shares(GROUP), 'a').split()[:3]
    assert (consumers, credit, reserved) == (b'1', b'970', b'0')
    left, ids = fetch(client, address, 'a', 20, 1000)
    assert (left, len(ids)) == (0, 10)
