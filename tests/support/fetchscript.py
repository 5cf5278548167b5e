"""Driving ``lua/fetch.lua`` by hand, as replicas sharing one subscription would, and watching
what it runs on the Redis node of the address's slot: for the store tests of the sharing rule."""

import uuid
from typing import Any

from shoal_broker.store import keys, scripts
from shoal_broker.store.fetch_command import fetch_call

GROUP = 'shared-sub'


class CommandsOn:
    """Commands run on the Redis node serving ``key``, scripts' included, as its ``MONITOR``
    shows them (the node's command statistics would count other tests' streams too)."""

    def __init__(self, client: Any, key: str) -> None:
        node = client.get_node_from_key(key) if hasattr(client, 'get_node_from_key') else None
        self._server = node.redis_connection if node is not None else client
        self._monitor = self._server.monitor()
        self._monitor.__enter__()

    def since_last(self) -> list[str]:
        """Every command seen since the last call: all sent before it have shown by the
        marker's."""
        marker = f'commands-on-{uuid.uuid4().hex}'
        self._server.echo(marker)
        seen: list[str] = []
        while (command := self._monitor.next_command()['command']) != f'ECHO {marker}':
            seen.append(command)
        return seen

    def close(self) -> None:
        self._monitor.__exit__()


def fetch(
    client: Any, address: str, replica: str, count: int, credit: int | None = None
) -> tuple[int, list[str]]:
    """One fetch by ``replica`` for one consumer, of up to ``count`` entries with ``credit``
    free (``count`` when not given): what it left for others, and the ids it took."""
    script_keys, args = fetch_call(address, GROUP, replica, count, consumers=1, credit=credit)
    reply = client.eval(scripts.source('fetch'), len(script_keys), *script_keys, *args)
    return int(reply[1]), [reply[i + 1].decode() for i in range(3, len(reply), 8)]


def publish(client: Any, address: str, n: int) -> None:
    """``n`` entries on the address's priority-4 stream, as a publish leaves them."""
    stream = keys.AddressKeys.of(address).streams[5]
    for i in range(n):
        client.xadd(stream, {'h': b'h', 'r': f'r{i}'.encode()})
