"""
The Redis store: every message, subscription and in-flight delivery of the cluster.

A thin facade over the store's parts, each behind its port in ``routing/storage.py``:
``messages`` (publish, fetch, ack, release, browse, claim, schedule, commit), ``registry``
(addresses, subscriptions, ClientIDs, policies), ``upkeep`` (trimming, due messages, records,
memory, backlog limits) and ``watching`` (wake-ups between replicas). The per-message path runs
through ``cycles`` (``cycles.py``): ops queued and sent as one pipeline per cycle. This class owns
the connection and the parts' lifecycle; multi-key changes that must be atomic are Lua scripts in
``lua/`` (one file per operation, KEYS and ARGV documented in its header).

Only this package imports redis; Redis failures become ``StoreUnavailable``.
"""

from collections.abc import Awaitable, Sequence
from typing import Any

import redis.asyncio

from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.redelivery import Backoffs
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.store import connect, keys, layout
from shoal_broker.store.addresses import AddressRegistry
from shoal_broker.store.backlogs import BacklogLimits
from shoal_broker.store.body_trims import BodyTrims
from shoal_broker.store.calls import REDIS_DOWN, Scripts, as_text, call, on_every_primary
from shoal_broker.store.commit_nodes import ClusterNodes
from shoal_broker.store.commits import CommitLog
from shoal_broker.store.cycles import PIPELINES_IN_FLIGHT, Cycles
from shoal_broker.store.lanes import ClusterLanes
from shoal_broker.store.lines import Lines
from shoal_broker.store.messages import Messages
from shoal_broker.store.notifications import ShardedNotifications
from shoal_broker.store.upkeep import Upkeep
from shoal_broker.store.watching import NOTIFICATION_IDLE_SECONDS, Watching

MAX_REDIS_CONNECTIONS = 64
"""Redis connections per replica: the pipeline, the notification channel and cold-path calls."""

POOL_WAIT_SECONDS = 20.0
"""How long a Redis call waits for a free connection before it fails."""

SWEEP_PAGE_ADDRESSES = 10_000
"""Addresses whose commit markers one ``sweep_markers`` call reads: a few pipelines per node."""


class RedisStore:
    """Implements ``routing.storage.MessageStore`` on one Redis (or a Redis Cluster slot set)."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        replica_id: str,
        durability: Durability = Durability.MEMORY,
        replication_timeout_ms: int = 1000,
        *,
        lanes: ClusterLanes | None = None,
        sharded: ShardedNotifications | None = None,
        commits: CommitLog | None = None,
        nodes: ClusterNodes | None = None,
    ) -> None:
        """``lanes`` and ``sharded``: on Redis Cluster (``client`` a cluster client), the
        per-message pipelines and the wake-up channels of each primary, the replica's
        records of commits over several slots, and the primaries' plain clients (``nodes``)
        the background passes send their pipelines on."""
        self._client = client
        self.commits = commits
        self.replica_id = replica_id
        self._durability = durability
        self._scripts = Scripts(client)
        backlogs = BacklogLimits()
        kinds: dict[str, AddressKind] = {}
        self.watching = Watching(client, replica_id, sharded, nodes)
        self.cycles = Cycles(
            client, self._scripts, replica_id, backlogs, self.watching.notify_local,
            durability, replication_timeout_ms, lanes,
        )  # fmt: skip
        self.messages = Messages(
            client, self._scripts, self.cycles, replica_id, kinds=kinds, backlogs=backlogs,
            announce=self.watching.announce, durability=durability,
            replication_timeout_ms=replication_timeout_ms, commits=commits,
        )  # fmt: skip
        self.registry = AddressRegistry(client, self._scripts, replica_id, kinds)
        self.redelivery = Backoffs()
        """Each entity's redelivery delay, for the in-flight entries of a dead replica
        (``Liveness``); set with the declared policies."""
        self.lines = Lines(client, self._scripts, self.cycles, replica_id)
        self.upkeep = Upkeep(
            client, self._scripts, backlogs, address_kind=self.registry.address_kind,
            announce=self.watching.announce, nodes=nodes,
        )  # fmt: skip
        self.body_trims = BodyTrims(
            self.cycles.queue,
            self._scripts.command,
            self.messages.recent_bodies,
            self.cycles.background,
        )
        self.messages.acks.consumed = self.body_trims.consumed

    @classmethod
    def from_url(
        cls,
        url: str,
        replica_id: str,
        durability: Durability = Durability.MEMORY,
        replication_timeout_ms: int = 1000,
    ) -> 'RedisStore':
        if connect.is_cluster_url(url):
            return cls._on_cluster(url, replica_id, durability, replication_timeout_ms)
        # Blocking pool: a burst of attaches or closes waits for a connection instead of failing
        # with "Too many connections" (redis-py's default pool refuses past its size).
        pool = connect.connection_pool(
            url, blocking=True, max_connections=MAX_REDIS_CONNECTIONS, timeout=POOL_WAIT_SECONDS,
            health_check_interval=30,
        )  # fmt: skip
        client = redis.asyncio.Redis.from_pool(pool)  # owns the pool: aclose() closes it
        return cls(client, replica_id, durability, replication_timeout_ms)

    @classmethod
    def _on_cluster(
        cls, url: str, replica_id: str, durability: Durability, replication_timeout_ms: int
    ) -> 'RedisStore':
        """The cold path on redis-py's cluster client, the message path on a lane per primary,
        the wake-ups on each primary's shard channels (docs/redis-modes.md, "Redis Cluster")."""
        cluster = connect.cluster_client(
            url, max_connections=MAX_REDIS_CONNECTIONS, timeout=POOL_WAIT_SECONDS
        )

        def pool_for(host: str, port: int) -> 'redis.asyncio.ConnectionPool':
            return connect.node_pool(url, host, port)

        lanes = ClusterLanes(
            cluster, pool_for, PIPELINES_IN_FLIGHT, confirm_timeout_ms=replication_timeout_ms
        )
        sharded = ShardedNotifications(cluster, pool_for, NOTIFICATION_IDLE_SECONDS)
        nodes = ClusterNodes(cluster, pool_for)  # closed with the commit log
        commits = CommitLog(
            nodes, replica_id,
            replicated=durability is Durability.REPLICATED,
            replication_timeout_ms=replication_timeout_ms,
        )  # fmt: skip
        client: Any = cluster  # the commands the store sends are those of a Redis client
        return cls(
            client, replica_id, durability, replication_timeout_ms, lanes=lanes, sharded=sharded,
            commits=commits, nodes=nodes,
        )  # fmt: skip

    @property
    def reconnects(self) -> dict[str, int]:
        """Connections lost and opened again, by connection (a metric)."""
        if self.cycles.lanes is not None:
            return {'notifications': self.watching.resubscribes}
        return {
            'pipeline': self.cycles.lane.reconnects,
            'notifications': self.watching.resubscribes,
        }

    async def check_durability(self) -> None:
        """Refuse to start when Redis cannot give the promised durability."""
        if self._durability is not Durability.FSYNC:
            return
        configs = await on_every_primary(
            self._client, lambda c, **to: c.config_get('append*', **to)
        )
        for config in configs:
            self._check_fsync({as_text(k): as_text(v) for k, v in config.items()})

    @staticmethod
    def _check_fsync(values: dict[str, str]) -> None:
        if values.get('appendonly') != 'yes' or values.get('appendfsync') != 'always':
            raise StoreUnavailable(
                'SHOAL_DURABILITY=fsync needs Redis with appendonly yes and appendfsync always '
                f'(found appendonly={values.get("appendonly")}, '
                f'appendfsync={values.get("appendfsync")})'
            )

    async def start(self) -> None:
        """Load the scripts and start the pipeline and notification tasks."""
        try:
            await self._scripts.load()
            await self.lay_out(wait=True)
            await self.watching.subscribe()
        except REDIS_DOWN as exc:
            raise StoreUnavailable(f'cannot reach Redis: {exc}') from exc
        self.cycles.start()
        self.watching.start()

    async def lay_out(self, *, wait: bool = False) -> bool:
        """Lay out keys an older version wrote (``layout.lay_out``); False when another replica
        is doing it."""
        return bool(await call(
            layout.lay_out(self._client, self._scripts.evalsha, QUEUE_GROUP, wait=wait)
        ))  # fmt: skip

    async def tidy_commits(self) -> None:
        """On Redis Cluster, with each trimming pass: finish this replica's own commit records
        it gave up on, and drop the addresses' commit markers past their grace period."""
        if self.commits is None:
            return
        await call(self.commits.complete(self.replica_id))
        page: list[str] = []
        async for address, _ in self._client.hscan_iter(keys.ADDRESSES, count=1000):
            page.append(as_text(address))
            if len(page) >= SWEEP_PAGE_ADDRESSES:
                await call(self.commits.sweep_markers(page))
                page = []
        await call(self.commits.sweep_markers(page))

    async def close(self) -> None:
        await self.watching.close()
        await self.cycles.close()
        await self.messages.transactions.close()
        if self.commits is not None:
            await self.commits.close()
        await connect.close(self._client)

    async def flush(self) -> None:
        """Wait until everything queued or in flight has been sent and answered."""
        await self.cycles.flush()

    async def ping(self) -> bool:
        """Whether Redis answers (on a cluster: every primary)."""
        try:
            return all(await on_every_primary(self._client, lambda c, **to: c.ping(**to)))
        except (*REDIS_DOWN, StoreUnavailable):
            return False

    # -- for the store's own companion modules (liveness, inspection) --------------------------

    @property
    def client(self) -> 'redis.asyncio.Redis':
        """The Redis client."""
        return self._client

    async def call(self, awaitable: Awaitable[Any]) -> Any:
        """Await a Redis call, turning a connection failure into StoreUnavailable."""
        return await call(awaitable)

    async def evalsha(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one of the store's Lua scripts by name."""
        return await self._scripts.evalsha(name, keys_, args)
