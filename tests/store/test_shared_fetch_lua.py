"""A fetch of a subscription other replicas serve too counts what is unread from where the group
stands (kept in its shares HASH by ``lua/fetch.lua``), not from ``XINFO GROUPS``, whose cost grows
with every group on the stream: the shares come out as before, and a stream with many other
groups costs no ``XINFO GROUPS`` per fetch once the group's place is known."""

import contextlib
import uuid
from typing import Any

from fetchscript import GROUP, CommandsOn, fetch, publish

from shoal_broker.store import keys

OTHER_GROUPS = 50


def _xinfo_groups(seen: CommandsOn, stream: str) -> int:
    """``XINFO GROUPS`` run on ``stream`` since the last look."""
    return sum(command == f'XINFO GROUPS {stream}' for command in seen.since_last())


def test_two_replicas_share_a_burst_without_xinfo_groups_per_fetch(store_client: Any) -> None:
    client = store_client
    address = f'topic-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    stream = k.streams[5]
    client.xgroup_create(stream, GROUP, '0', mkstream=True)
    with contextlib.closing(CommandsOn(client, stream)) as seen:
        for i in range(OTHER_GROUPS):
            client.xgroup_create(stream, f'other-{i}', '0')
        # both replicas keep a record: the sharing rule decides
        assert fetch(client, address, 'a', 1000) == (-1, [])
        assert (fetch(client, address, 'b', 1000))[1] == []
        assert (fetch(client, address, 'a', 1000))[1] == []

        seen.since_last()
        publish(client, address, 20)
        left, taken_a = fetch(client, address, 'a', 1000)
        assert (left, len(taken_a)) == (10, 10)
        left, taken_b = fetch(client, address, 'b', 1000)
        assert (left, len(taken_b)) == (0, 10)
        assert not set(taken_a) & set(taken_b)
        publish(client, address, 4)  # b's free credit (1 000) outweighs a's (990): 3 and 1
        assert len((fetch(client, address, 'b', 1000))[1]) == 3
        assert len((fetch(client, address, 'a', 1000))[1]) == 1
        for _ in range(10):
            publish(client, address, 2)
            taken = [len((fetch(client, address, r, 1000))[1]) for r in 'ab']
            assert sum(taken) == 2
        # once, to learn where the group stands; then never again
        assert _xinfo_groups(seen, stream) == 1

        # bursts past what is counted one by one: the first learns the group's entries-read (Redis
        # knew none before the group read anything), the stream's entries-added tells the rest
        for burst in range(3):
            seen.since_last()
            publish(client, address, 300)
            left, taken_a = fetch(client, address, 'a', 1000)
            assert left + len(taken_a) == 300  # all of it counted
            assert 100 <= left <= 200  # and shared out
            assert len((fetch(client, address, 'b', 1000))[1]) == left
            assert _xinfo_groups(seen, stream) == (1 if burst == 0 else 0)

    # alone again: where the group stands goes with the other's record
    client.hdel(k.shares(GROUP), 'b')
    assert fetch(client, address, 'a', 1000) == (-1, [])
    assert sorted((client.hgetall(k.shares(GROUP))).keys()) == [b'a']
