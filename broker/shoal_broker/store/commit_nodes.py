"""
The Redis nodes a cluster-wide commit and the commit-marker sweep talk to: a plain client of the
primary serving a key's slot (``NodeClients``: ``SingleNode`` on standalone and Sentinel,
``ClusterNodes`` on a cluster), and ``Batch``, which sends many one-slot commands as pipelines per
node. The commit log (``commits.py``) decides what to send; this module only knows where it goes
and which refusals mean that nothing ran.
"""

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions

from shoal_broker.store import connect, packed
from shoal_broker.store.calls import CLUSTER_CALLS_IN_FLIGHT
from shoal_broker.store.lane import CONNECTION_ERRORS

SWEEP_PIPELINE_COMMANDS = 1000
"""Commands per pipeline of the marker sweep: a page of 10 000 addresses is a few pipelines per
node (an ``HGETALL`` of an address without markers is tens of bytes of reply)."""

NOTHING_RAN = (
    redis.exceptions.MovedError,  # AskError and TryAgainError are ResponseErrors of their own
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
)
"""Replies refusing a command before it ran: retried once the slot map is asked again."""


class NodeClients(Protocol):
    """A plain client of the primary serving a key's slot, and a way to ask for the map again."""

    def for_key(self, key: str) -> 'redis.asyncio.Redis': ...

    async def refresh(self) -> None: ...


class SingleNode:
    """One server holds every slot (standalone, Sentinel)."""

    def __init__(self, client: 'redis.asyncio.Redis') -> None:
        self._client = client

    def for_key(self, key: str) -> 'redis.asyncio.Redis':
        return self._client

    async def refresh(self) -> None:
        return None


class ClusterNodes:
    """One plain client per primary of a cluster, built by ``pool_for(host, port)``
    (``connect.node_pool``), found through the cluster client's slot map."""

    def __init__(
        self,
        cluster: 'redis.asyncio.cluster.RedisCluster',
        pool_for: Callable[[str, int], 'redis.asyncio.ConnectionPool'],
    ) -> None:
        self._cluster = cluster
        self._pool_for = pool_for
        self._clients: dict[str, redis.asyncio.Redis] = {}

    def for_key(self, key: str) -> 'redis.asyncio.Redis':
        node = self._cluster.get_node_from_key(key)
        if node is None:
            raise redis.exceptions.ClusterDownError(f'no primary serves {key!r}')
        client = self._clients.get(node.name)
        if client is None:
            pool = self._pool_for(node.host, int(node.port))
            client = self._clients[node.name] = redis.asyncio.Redis.from_pool(pool)
        return client

    async def refresh(self) -> None:
        await connect.refresh_slot_map(self._cluster)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()


class Batch:
    """Commands each on one key's slot, sent as one pipeline per node and
    ``SWEEP_PIPELINE_COMMANDS``, at most ``CLUSTER_CALLS_IN_FLIGHT`` pipelines at once."""

    def __init__(self, nodes: NodeClients, commands: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        self._nodes = nodes
        self._commands = commands
        self._room = asyncio.Semaphore(CLUSTER_CALLS_IN_FLIGHT)
        self.replies: list[Any] = [None] * len(commands)
        self.refusals: list[BaseException] = []
        """What made a command go again: a refusal before it ran, a lost connection."""
        self.failures: list[Exception] = []
        """Error replies of any other kind."""

    async def send(self, todo: list[int]) -> list[int]:
        """Send the commands numbered ``todo``; returns those to send again, in order."""
        by_node: dict[int, tuple[redis.asyncio.Redis, list[int]]] = {}
        again: list[int] = []
        for i in todo:
            try:
                client = self._nodes.for_key(self._commands[i][0])
            except NOTHING_RAN as exc:  # no primary serves the slot now
                self.refusals.append(exc)
                again.append(i)
                continue
            by_node.setdefault(id(client), (client, []))[1].append(i)
        pipelines = [
            self._pipeline(client, mine[start : start + SWEEP_PIPELINE_COMMANDS])
            for client, mine in by_node.values()
            for start in range(0, len(mine), SWEEP_PIPELINE_COMMANDS)
        ]
        for unanswered in await asyncio.gather(*pipelines):
            again += unanswered
        return sorted(again)

    async def _pipeline(self, client: 'redis.asyncio.Redis', chunk: list[int]) -> list[int]:
        async with self._room:
            try:
                replies = await packed.pipeline(
                    client, [self._commands[i][1] for i in chunk], raise_on_error=False
                )
            except (*CONNECTION_ERRORS, *NOTHING_RAN) as exc:
                self.refusals.append(exc)
                return chunk
        again = []
        for i, reply in zip(chunk, replies, strict=True):
            if isinstance(reply, NOTHING_RAN):
                self.refusals.append(reply)
                again.append(i)
            elif isinstance(reply, Exception):
                self.failures.append(reply)
            else:
                self.replies[i] = reply
        return again
