"""
A Redis Cluster client whose calls wait for a free connection, as the standalone store's
``BlockingConnectionPool`` lets them, instead of failing at once.

redis-py's asyncio ``RedisCluster`` keeps at most ``max_connections`` connections per node and
raises ``MaxConnectionsError`` (a ``ConnectionError``: to the store, "Redis unreachable") the
moment one more call finds them all busy. So a burst of cold-path calls, such as a thousand
consumers attaching to new queues at once, had most of those attaches refused with
``amqp:resource-limit-exceeded`` on a cluster, where on a standalone Redis they wait their turn.

Here every command and every pipeline first takes one of ``max_connections`` places in flight on
the whole client, waiting up to ``wait_seconds`` for one (past that it fails with
``MaxConnectionsError``, as before, but with a reason). A command or pipeline in flight holds at
most one connection of each node, so no node's pool is ever asked for more than it has. A
transaction's ``WATCH`` takes its connection before ``execute`` and is not bounded here.
"""

import asyncio
from typing import Any, cast

import redis.asyncio.cluster
from redis.exceptions import MaxConnectionsError, RedisClusterException

WAIT_SECONDS = 20.0
"""How long a call waits for a place in flight by default (the standalone pool's wait)."""


class WaitingCluster(redis.asyncio.cluster.RedisCluster):
    """``RedisCluster`` with a bounded wait for a connection instead of an immediate refusal."""

    def __init__(
        self, *, max_connections: int = 100, wait_seconds: float = WAIT_SECONDS, **kwargs: Any
    ) -> None:
        super().__init__(max_connections=max_connections, **kwargs)
        self.room = asyncio.Semaphore(max_connections)
        """Places in flight: one per command or pipeline being sent or answered."""
        self.wait_seconds = wait_seconds

    async def take_place(self) -> None:
        """Wait for a place in flight; MaxConnectionsError after ``wait_seconds``."""
        try:
            async with asyncio.timeout(self.wait_seconds):
                await self.room.acquire()
        except TimeoutError:
            raise MaxConnectionsError(
                f'no Redis connection free within {self.wait_seconds:g} s'
            ) from None

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_place()
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            self.room.release()

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> 'WaitingPipeline':
        if shard_hint:
            raise RedisClusterException('shard_hint is deprecated in cluster mode')
        return WaitingPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py makes it


class WaitingPipeline(redis.asyncio.cluster.ClusterPipeline):
    """A cluster pipeline whose ``execute`` takes one place in flight of its client."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client = cast(WaitingCluster, self.cluster_client)
        try:
            await client.take_place()
        except MaxConnectionsError:
            await self.reset()  # type: ignore[no-untyped-call]  # empty, as a failed execute
            raise
        try:
            return await super().execute(raise_on_error, allow_redirections)
        finally:
            client.room.release()
