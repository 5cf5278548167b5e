"""
What the store's parts share to reach Redis: failures as ``StoreUnavailable``, the Lua scripts
by name, and replies as text.

A script goes by hash (EVALSHA) where sending it again is harmless; where a forgotten script
must not reorder or half-apply anything (publish, a commit, a fetch in bulk) the part sends the
source it keeps here (``Scripts.source``), which Redis caches by its SHA1 all the same; a
pipeline carries each such source once (``script_heads.py``).
"""

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store import scripts

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

CLUSTER_REFUSALS = (redis.exceptions.ClusterError, redis.exceptions.TryAgainError)
"""What redis-py's cluster client raises once its own redirects and retries are spent
(``ClusterError: TTL exhausted``, ``CLUSTERDOWN``, ``TRYAGAIN``): transient, as an outage is."""

CLUSTER_CALLS_IN_FLIGHT = 16
"""Calls or pipelines a background pass (trimming, the commit-marker sweep) has in flight at once
on a cluster: each holds a connection of its node's pool (``MAX_REDIS_CONNECTIONS``), and a scan
page of 200 addresses on one node asked for 400 at once, which redis-py refuses
(``MaxConnectionsError``)."""

SCRIPTS = (
    'publish', 'create_address', 'create_group', 'delete_group', 'fetch', 'browse', 'trim',
    'join', 'leave', 'unsubscribe', 'release_client', 'release_clients', 'reclaim',
    'reap_consumers', 'renew_lease', 'schedule', 'release_due', 'publish_limited', 'notify',
    'publish_claim', 'delete_address', 'index_forget', 'publish_unique', 'release_later',
    'publish_last', 'exclusive_join', 'exclusive_leave', 'exclusive_reap', 'relayout_bands',
    'groups_drop', 'groups_forget', 'release_behind',
)  # fmt: skip


def reason(exc: BaseException) -> str:
    """An error's text, or its type's name when it has none: some of redis-py's errors
    (``MaxConnectionsError``) and a bare ``TimeoutError`` carry no text, and "Redis unreachable: "
    with nothing after it says nothing of what failed."""
    return str(exc) or type(exc).__name__


async def call(awaitable: Awaitable[Any]) -> Any:
    """Await a Redis call, turning a connection failure into StoreUnavailable."""
    try:
        return await awaitable
    except REDIS_DOWN as exc:
        raise StoreUnavailable(f'Redis unreachable: {reason(exc)}') from exc
    except CLUSTER_REFUSALS as exc:  # a failover or a slot on the move, past redis-py's retries
        raise StoreUnavailable(f'Redis Cluster refused: {reason(exc)}') from exc


async def on_every_primary(client: Any, command: Callable[..., Awaitable[Any]]) -> list[Any]:
    """``command(client)``'s reply from a standalone or Sentinel server, or from each primary of
    a cluster in turn (``target_nodes`` one node at a time: redis-py answers a command sent to
    all primaries with the bare reply when there is only one)."""
    if not isinstance(client, redis.asyncio.cluster.RedisCluster):
        return [await call(command(client))]
    return [await call(command(client, target_nodes=node)) for node in client.get_primaries()]


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Scripts:
    """The store's Lua scripts: their source, and their hashes once loaded into Redis."""

    def __init__(self, client: 'redis.asyncio.Redis') -> None:
        self._client = client
        self.sha: dict[str, str] = {}
        self.source: dict[str, str] = {}

    async def load(self) -> None:
        for name in SCRIPTS:
            self.source[name] = scripts.source(name)
            self.sha[name] = as_text(await self._client.script_load(self.source[name]))

    def command(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVALSHA command of a script, for a pipeline."""
        return ('EVALSHA', self.sha[name], len(keys_), *keys_, *args)

    async def evalsha(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script by name, loading the scripts again if Redis forgot them."""
        return await call(self._evalsha(name, keys_, args))

    async def _evalsha(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._client.evalsha(self.sha[name], len(keys_), *keys_, *args)
        except redis.exceptions.NoScriptError:
            await self.load()
            return await self._client.evalsha(self.sha[name], len(keys_), *keys_, *args)
