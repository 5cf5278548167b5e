"""
Wake-ups between replicas: who is told that an address has entries to fetch.

A cycle that added or returned entries publishes one notification per address (``cycles.py``,
publish.lua); replicas with hungry consumers fetch on it instead of polling. A replica with
consumers of an address lists itself in the address's watchers, after subscribing to its channel
and before looking once more, so the notification is sent only when another replica is listening.

The channels are shard channels (``SSUBSCRIBE``/``SPUBLISH``) in every mode: on Redis Cluster a
shard channel lives on its address's slot, and ``ShardedNotifications`` listens on each primary
serving a watched one (docs/redis-modes.md, "Wake-ups: sharded pub/sub").
"""

import asyncio
import contextlib
import itertools
import logging
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.storage import Notify
from shoal_broker.stopping import cancel_and_wait
from shoal_broker.store import keys
from shoal_broker.store.calls import REDIS_DOWN, call, reason
from shoal_broker.store.commit_nodes import NodeClients, SingleNode
from shoal_broker.store.notifications import NotificationReader, ShardedNotifications
from shoal_broker.store.slices import in_slices

logger = logging.getLogger(__name__)

CLUSTER_SETTLING = (
    redis.exceptions.RedisClusterException,  # the client found no node for the slot
    redis.exceptions.ClusterError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
)
"""What a cluster answers while a shard fails over or a slot moves: the watch is tried again."""

WATCH_RETRY_SECONDS = 0.5
WATCH_ATTEMPTS = 20
"""A watch is retried for about ten seconds of a cluster settling (a failover takes 2-3 s with
``cluster-node-timeout 1000``, longer with the default 15 s), then given up with a warning; the
next watch of the address, or a re-subscribe after a lost channel, tries again. On a cluster a
lost connection is one of the ways a cluster settles (the slot's primary died and its replica
is not promoted yet): nothing else would subscribe the channel again, so it is retried too."""

WATCH_BATCH = 500
"""Addresses brought in line together: their channels subscribed in one command, their
listings written in one pipeline. An attach burst of 1 000 consumers on fresh addresses made
two round trips per address, one address at a time under the lock, and those still ran
seconds into the traffic that followed (docs/performance.md, "Watches in batches")."""

NOTIFICATION_IDLE_SECONDS = 30.0
"""A notification channel quiet this long is pinged; quiet for twice as long, it is dead."""


class Watching:
    """Implements ``routing.storage.WatchPort``."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        replica_id: str,
        sharded: ShardedNotifications | None = None,
        nodes: NodeClients | None = None,
    ) -> None:
        self._client = client
        self._nodes = nodes or SingleNode(client)
        """The primaries' plain clients the periodic re-listing goes out on, packed."""
        self._sharded = sharded
        """On Redis Cluster: the channels, each on its primary (``_pubsub`` is not used)."""
        self._replica_id = replica_id
        self._watchers: dict[str, list[Notify]] = {}
        self._watch_lock = asyncio.Lock()
        self._watch_cursor = 0
        """Where the next partial ``assert_watches`` starts in the watched addresses."""
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._changed: dict[str, None] = {}
        """Addresses whose watch changed since Redis was last told, oldest first."""
        self._sync_task: asyncio.Task[None] | None = None
        self.resubscribes = 0
        """Times the notification channel was lost and subscribed again (a metric)."""

    async def subscribe(self) -> None:
        """Open the notification channel (raises what redis raises; the store says why). On a
        cluster the per-node connections open with their first channel."""
        if self._sharded is not None:
            self._pubsub = self._sharded
            return
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(keys.replica_channel(self._replica_id))

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name='store-notifications')

    async def close(self) -> None:
        await cancel_and_wait([t for t in (self._task, self._sync_task) if t is not None])
        if self._sharded is not None:
            with contextlib.suppress(*REDIS_DOWN):
                await self._sharded.aclose()
        elif self._pubsub is not None:
            with contextlib.suppress(*REDIS_DOWN):
                await self._pubsub.aclose()

    def watch(self, address: str, notify: Notify) -> None:
        watchers = self._watchers.setdefault(address, [])
        watchers.append(notify)
        if len(watchers) == 1:
            self._watch_changed(address)

    def unwatch(self, address: str, notify: Notify) -> None:
        watchers = self._watchers.get(address, [])
        if notify in watchers:
            watchers.remove(notify)
        if not watchers and address in self._watchers:
            del self._watchers[address]
            self._watch_changed(address)

    async def announce(self, address: str) -> None:
        """Tell every replica (this one included) that ``address`` has entries to fetch."""
        await call(self._client.spublish(keys.AddressKeys.of(address).notify, 'reaper'))
        self.notify_local(address)

    def notify_local(self, address: str) -> None:
        """Wake this replica's own watchers of ``address``."""
        for notify in list(self._watchers.get(address, ())):
            notify(address)

    async def assert_watches(self, limit: int | None = None) -> None:
        """List this replica again among the watchers of the addresses it watches: a listing
        lost to a Redis error, restart or flush would otherwise leave its consumers unwoken by
        other replicas' publishes. With ``limit``, only that many, taking up where the last
        call stopped: each lease renewal re-lists a slice (one HSET per address every ~1.7 s
        was a Redis write load growing with the addresses a replica watches), and a re-subscribe
        after a lost connection re-lists them all. The HSETs go packed by hiredis, a pipeline per
        primary (``slices.in_slices``): redis-py packing and reading 256 of them cost the loop
        4-5 ms of CPU at every renewal (docs/performance.md, "Watches in batches")."""
        async with self._watch_lock:
            addresses = list(self._watchers)
            if not addresses:
                return
            if limit is not None and limit < len(addresses):
                start = self._watch_cursor % len(addresses)
                addresses = (addresses[start:] + addresses[:start])[:limit]
                self._watch_cursor = start + limit
            watchers = [keys.AddressKeys.of(address).watchers for address in addresses]
            calls = [(key, ('HSET', key, self._replica_id, 1)) for key in watchers]
            replies = await in_slices(self._nodes, calls)
            failed = next((r for r in replies if isinstance(r, Exception)), None)
            if failed is not None:  # a slot on the move or a primary lost: the next renewal
                with contextlib.suppress(*REDIS_DOWN, *CLUSTER_SETTLING):  # asks the map again
                    await self._nodes.refresh()
                raise StoreUnavailable(f'watchers not listed: {reason(failed)}') from failed

    def _watch_changed(self, address: str) -> None:
        if self._pubsub is None:
            return
        self._changed[address] = None
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.create_task(self._sync_watches(), name='store-watches')

    async def _sync_watches(self) -> None:
        """Make Redis match whether this replica watches each changed address, a batch at a
        time, each to the wish at the time its batch is sent (an address changed again
        meanwhile goes into a later batch, so a quick unwatch and watch end up watched)."""
        settling = (*CLUSTER_SETTLING, *REDIS_DOWN) if self._sharded else CLUSTER_SETTLING
        attempt = 0
        while self._changed:
            batch = list(itertools.islice(self._changed, WATCH_BATCH))
            for address in batch:
                del self._changed[address]
            try:
                async with self._watch_lock:
                    try:
                        await self._apply_watches(batch)
                    except REDIS_DOWN:
                        if self._sharded is not None:
                            raise
                        # one server: the listener's re-subscribe covers it (every watched
                        # address's channel subscribed and listed again)
                attempt = 0
            except settling as exc:
                attempt += 1
                if attempt == WATCH_ATTEMPTS:
                    logger.warning('watches of %d addresses (%s first) not applied while the '
                                   'cluster settles: %s', len(batch), batch[0], exc)  # fmt: skip
                    attempt = 0
                    continue
                for address in batch:
                    self._changed.setdefault(address)
                await asyncio.sleep(WATCH_RETRY_SECONDS)

    async def _apply_watches(self, addresses: list[str]) -> None:
        listen = [a for a in addresses if a in self._watchers]
        leave = [a for a in addresses if a not in self._watchers]
        if listen:
            await self._channels([keys.AddressKeys.of(a).notify for a in listen], listen=True)
        pipe = self._client.pipeline(transaction=False)
        for address in listen:
            pipe.hset(keys.AddressKeys.of(address).watchers, self._replica_id, 1)
        for address in leave:
            pipe.hdel(keys.AddressKeys.of(address).watchers, self._replica_id)
        await pipe.execute()
        if leave:
            await self._channels([keys.AddressKeys.of(a).notify for a in leave], listen=False)
        # anything published before other replicas could see us: look again
        for address in listen:
            self.notify_local(address)

    async def _channels(self, channels: list[str], *, listen: bool) -> None:
        if self._sharded is not None:
            await (self._sharded.subscribe if listen else self._sharded.unsubscribe)(*channels)
        elif listen:
            await self._pubsub.ssubscribe(*channels)
        else:
            await self._pubsub.sunsubscribe(*channels)

    async def _listen(self) -> None:
        if self._sharded is not None:
            await self._listen_sharded(self._sharded)
            return
        own = self._replica_id.encode()
        reader = NotificationReader(self._pubsub, NOTIFICATION_IDLE_SECONDS)
        while True:
            try:
                messages = await reader.messages()
            except REDIS_DOWN as exc:
                logger.warning('notification channel lost: %s; resubscribing', exc)
                await asyncio.sleep(0.5)
                await self._resubscribe()
                continue
            for channel, data in messages:
                if data == own:
                    continue  # our own cycle already woke our consumers
                address = keys.notified_address(channel)
                if address is not None:
                    self.notify_local(address)

    async def _listen_sharded(self, sharded: ShardedNotifications) -> None:
        own = self._replica_id.encode()
        while True:
            try:
                messages, moved = await sharded.messages()
            except REDIS_DOWN as exc:
                logger.warning('notification channels lost: %s; resubscribing', exc)
                await asyncio.sleep(0.5)
                moved = [keys.AddressKeys.of(a).notify.encode() for a in self._watchers]
                with contextlib.suppress(*REDIS_DOWN, StoreUnavailable):
                    await sharded.subscribe(*moved)
                messages = []
            for channel, data in messages:
                address = keys.notified_address(channel)
                if data != own and address is not None:
                    self.notify_local(address)
            # a channel on another primary now (a moved slot, a failover): that primary may
            # have missed our listing and what was announced meanwhile
            addresses = [a for c in moved if (a := keys.notified_address(c)) in self._watchers]
            if addresses:
                with contextlib.suppress(*REDIS_DOWN, StoreUnavailable):
                    pipe = self._client.pipeline(transaction=False)
                    for address in addresses:
                        pipe.hset(keys.AddressKeys.of(address).watchers, self._replica_id, 1)
                    await call(pipe.execute())
                for address in addresses:
                    self.notify_local(address)

    async def _resubscribe(self) -> None:
        with contextlib.suppress(*REDIS_DOWN, StoreUnavailable):
            await self._pubsub.connect()  # reconnecting re-subscribes every channel it had
            self.resubscribes += 1
            channels = [keys.AddressKeys.of(a).notify for a in self._watchers]
            if channels:
                await self._pubsub.ssubscribe(*channels)
            await self.assert_watches()  # a Redis that restarted forgot the watchers
            # anything published while we were away: let every watcher look once
            for address in list(self._watchers):
                self.notify_local(address)
