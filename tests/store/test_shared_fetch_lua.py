"""A fetch of a subscription other replicas serve too counts what is unread from where the group
stands (kept in its shares HASH by ``lua/fetch.lua``), not from ``XINFO GROUPS``, whose cost grows
with every group on the stream: the shares come out as before, and a stream with many other
groups costs no ``XINFO GROUPS`` per fetch once the group's place is known."""

import contextlib
import uuid
from typing import Any

from shoal_broker.store import keys, scripts
from shoal_broker.store.fetch_command import fetch_keys

OTHER_GROUPS = 50
GROUP = 'shared-sub'


class XinfoGroupsOf:
    """``XINFO GROUPS`` run on one stream, scripts' included, as its server's ``MONITOR`` shows
    them: the server's command statistics would count every stream on it, and on a shared
    Redis or a cluster's node other tests' brokers ask about their own streams meanwhile."""

    def __init__(self, client: Any, stream: str) -> None:
        node = client.get_node_from_key(stream) if hasattr(client, 'get_node_from_key') else None
        self._server = node.redis_connection if node is not None else client
        self._command = f'XINFO GROUPS {stream}'
        self._monitor = self._server.monitor()
        self._monitor.__enter__()
        self._calls = 0

    def calls(self) -> int:
        """Those seen so far: every command sent before this call has shown by the marker's."""
        marker = f'xinfo-count-{uuid.uuid4().hex}'
        self._server.echo(marker)
        while (command := self._monitor.next_command()['command']) != f'ECHO {marker}':
            self._calls += command == self._command
        return self._calls

    def close(self) -> None:
        self._monitor.__exit__()


def _fetch(client: Any, address: str, replica: str, count: int) -> tuple[int, list[str]]:
    """One fetch by ``replica`` (one consumer, credit ``count``): what it left for others, and
    the ids it took."""
    k = keys.AddressKeys.of(address)
    reply = client.eval(
        scripts.source('fetch'), 17, *fetch_keys(address, GROUP),
        GROUP, replica, count, '1', 1, count, k.notify,
    )  # fmt: skip
    ids = [reply[i + 1].decode() for i in range(3, len(reply), 8)]
    return int(reply[1]), ids


def _publish(client: Any, address: str, n: int) -> None:
    stream = keys.AddressKeys.of(address).streams[5]
    for i in range(n):
        client.xadd(stream, {'h': b'h', 'r': f'r{i}'.encode()})


def test_two_replicas_share_a_burst_without_xinfo_groups_per_fetch(store_client: Any) -> None:
    client = store_client
    address = f'topic-{uuid.uuid4().hex[:8]}'
    k = keys.AddressKeys.of(address)
    stream = k.streams[5]
    client.xgroup_create(stream, GROUP, '0', mkstream=True)
    with contextlib.closing(XinfoGroupsOf(client, stream)) as xinfo_groups:
        for i in range(OTHER_GROUPS):
            client.xgroup_create(stream, f'other-{i}', '0')
        # both replicas keep a record: the sharing rule decides
        assert _fetch(client, address, 'a', 1000) == (-1, [])
        assert (_fetch(client, address, 'b', 1000))[1] == []
        assert (_fetch(client, address, 'a', 1000))[1] == []

        before = xinfo_groups.calls()
        _publish(client, address, 20)
        left, taken_a = _fetch(client, address, 'a', 1000)
        assert (left, len(taken_a)) == (10, 10)
        left, taken_b = _fetch(client, address, 'b', 1000)
        assert (left, len(taken_b)) == (0, 10)
        assert not set(taken_a) & set(taken_b)
        _publish(client, address, 4)  # b's free credit (1 000) outweighs a's (990): 3 and 1
        assert len((_fetch(client, address, 'b', 1000))[1]) == 3
        assert len((_fetch(client, address, 'a', 1000))[1]) == 1
        for _ in range(10):
            _publish(client, address, 2)
            taken = [len((_fetch(client, address, r, 1000))[1]) for r in 'ab']
            assert sum(taken) == 2
        # once, to learn where the group stands; then never again
        assert xinfo_groups.calls() - before == 1

        # bursts past what is counted one by one: the first learns the group's entries-read (Redis
        # knew none before the group read anything), the stream's entries-added tells the rest
        for burst in range(3):
            before = xinfo_groups.calls()
            _publish(client, address, 300)
            left, taken_a = _fetch(client, address, 'a', 1000)
            assert left + len(taken_a) == 300  # all of it counted
            assert 100 <= left <= 200  # and shared out
            assert len((_fetch(client, address, 'b', 1000))[1]) == left
            assert xinfo_groups.calls() - before == (1 if burst == 0 else 0)

    # alone again: where the group stands goes with the other's record
    client.hdel(k.shares(GROUP), 'b')
    assert _fetch(client, address, 'a', 1000) == (-1, [])
    assert sorted((client.hgetall(k.shares(GROUP))).keys()) == [b'a']
