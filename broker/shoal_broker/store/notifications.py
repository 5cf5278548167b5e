"""
Reading the notification channel straight off its connection.

Every publish cycle announces its address on a Redis channel, and the replica that published is
subscribed to that channel too (its own consumers of the address): at a trickle each message
came back as a notification of its own, and redis-py's ``PubSub.get_message`` (a timeout, a
retry wrapper and a dict per message) cost 60-90 µs of broker CPU per message at 1 000 msg/s
(docs/performance.md#notifications). Here the subscribed connection's replies are fed to its own
hiredis reader and only ``message`` replies are kept.

redis-py still writes the SUBSCRIBE/UNSUBSCRIBE commands and reconnects (re-subscribing every
channel) when one of them finds the connection broken; once subscribed it never reads from the
connection itself, so this is the only reader. A channel silent for ``idle_seconds`` gets a
PING; no reply to it by the next interval means the connection is dead.

On Redis Cluster the channels are sharded (``SSUBSCRIBE``/``SPUBLISH``, Redis 7): a channel lives
on the slot of its name's hash tag, ``{a:<address>}``, like the address's keys, so the scripts
that write an address announce on its own node (Redis refuses a script a shard channel of another
slot) and nothing is broadcast over the cluster bus. ``ShardedNotifications`` keeps one
subscribed connection per primary serving a watched channel, each read by a
``NotificationReader``. A channel whose slot moved (the node unsubscribes it itself, with a
``sunsubscribe`` push, once the slot is gone) or whose node was lost (killed, failed over) is
subscribed again on the primary serving it now and reported, so its watchers look once for what
was announced meanwhile.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions

from shoal_broker.store import connect
from shoal_broker.store.lane import CONNECTION_ERRORS, NOT_ENOUGH_DATA, read_into_parser

logger = logging.getLogger(__name__)

MESSAGE_KINDS = (b'message', b'smessage')
"""Replies that carry a notification: a channel's and a shard channel's."""


class NotificationReader:
    def __init__(self, pubsub: Any, idle_seconds: float) -> None:
        self._pubsub = pubsub
        self._idle_seconds = idle_seconds
        self._pinged = False
        self.unsubscribed: list[bytes] = []
        """Shard channels the server unsubscribed (asked for, or their slot left the node),
        collected until the reader's owner takes them."""
        self.moved: list[int] = []
        """Slots whose SSUBSCRIBE this node refused with MOVED (the subscriber's slot map was
        behind), collected likewise."""

    async def messages(self) -> list[tuple[bytes, bytes]]:
        """(channel, data) of the messages that arrived next; [] after a quiet interval."""
        conn = self._pubsub.connection
        if conn is None or not conn.is_connected:
            raise redis.exceptions.ConnectionError('the notification channel is not connected')
        try:
            await read_into_parser(conn, self._idle_seconds)
        except TimeoutError:
            if self._pinged:
                raise redis.exceptions.TimeoutError(
                    'the notification channel went silent'
                ) from None
            self._pinged = True
            await self._pubsub.ping()
            return []
        self._pinged = False
        parser = conn._parser._reader
        found: list[tuple[bytes, bytes]] = []
        while (reply := parser.gets()) is not NOT_ENOUGH_DATA:
            if isinstance(reply, redis.exceptions.ConnectionError):
                raise reply
            if isinstance(reply, redis.exceptions.MovedError):
                self.moved.append(reply.slot_id)
                continue
            # [b'message', channel, data]; subscribe confirmations and pongs are skipped
            if isinstance(reply, list) and len(reply) == 3:
                if reply[0] in MESSAGE_KINDS:
                    found.append((reply[1], reply[2]))
                elif reply[0] == b'sunsubscribe':
                    self.unsubscribed.append(reply[1])
        return found


PoolFor = Callable[[str, int], 'redis.asyncio.ConnectionPool']
"""A connection pool to the node at (host, port), with the cluster URL's credentials and TLS."""

_Event = tuple[str, str, Any]
"""What a node's reader hands over: (kind, node name, detail): ('messages', name, [(channel,
data)]), ('unsubscribed', name, [channel]), ('moved', name, [slot]) or ('lost', name, None)."""

RESUBSCRIBE_PAUSE_SECONDS = 0.1
"""Pause before asking for the slot map again while a moved or lost channel's slot settles."""


class ShardedNotifications:
    """Shard channels of a Redis Cluster, each subscribed on the primary serving its slot."""

    def __init__(
        self,
        cluster: 'redis.asyncio.cluster.RedisCluster',
        pool_for: PoolFor,
        idle_seconds: float,
        *,
        settle_seconds: float = 30.0,
    ) -> None:
        """``settle_seconds``: how long a lost node's channels wait for the cluster to name a
        primary for their slots again (a failover) before the loss is raised."""
        self._cluster = cluster
        self._pool_for = pool_for
        self._idle_seconds = idle_seconds
        self._settle_seconds = settle_seconds
        self._wanted: set[bytes] = set()
        self._where: dict[bytes, str] = {}
        """Channel -> name of the node it is subscribed on."""
        self._nodes: dict[str, _NodeChannel] = {}
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self.resubscribes = 0
        """Channels subscribed again after their slot moved or their node was lost (a metric)."""

    async def subscribe(self, *channels: str | bytes) -> None:
        for channel in map(_as_bytes, channels):
            self._wanted.add(channel)
            if channel not in self._where:
                try:
                    await self._subscribe_on_owner(channel)
                except CONNECTION_ERRORS:
                    # its primary is gone: a caller trying again asks where the slot is now
                    with contextlib.suppress(
                        *CONNECTION_ERRORS, redis.exceptions.RedisClusterException
                    ):
                        await connect.refresh_slot_map(self._cluster)
                    raise

    async def unsubscribe(self, *channels: str | bytes) -> None:
        for channel in map(_as_bytes, channels):
            self._wanted.discard(channel)
            name = self._where.pop(channel, None)
            node = self._nodes.get(name) if name else None
            if node is not None:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await node.pubsub.sunsubscribe(channel)

    async def messages(self) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
        """(channel, data) of the messages that arrived next, and the channels subscribed again
        on another primary meanwhile: what was announced on them in between may be lost, so
        their watchers look once. Raises ``redis.exceptions.ConnectionError`` when the cluster
        names no live primary for a lost node's channels within ``settle_seconds``."""
        kind, name, detail = await self._events.get()
        if kind == 'messages':
            found: list[tuple[bytes, bytes]] = detail
            return found, []
        on_node = [c for c, where in self._where.items() if where == name]
        if kind == 'unsubscribed':  # asked for (no longer wanted), or the slot left the node
            moved = [c for c in detail if c in self._wanted and self._where.get(c) == name]
        elif kind == 'moved':  # subscribed on a node that no longer served the slot
            slots = set(detail)
            moved = [c for c in on_node if self._cluster.keyslot(c) in slots]
        else:  # lost: every channel of the node
            moved = on_node
            await self._drop(name)
        return [], await self._move(moved)

    async def _move(self, channels: list[bytes]) -> list[bytes]:
        """Subscribe ``channels`` again on the primaries serving them now, asking the cluster
        for its slot map until it names one for each (a failover takes seconds)."""
        if not channels:
            return []
        for channel in channels:
            self._where.pop(channel, None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_seconds
        pending = list(channels)
        while pending:
            try:
                await connect.refresh_slot_map(self._cluster)
                while pending:
                    if pending[0] in self._wanted:
                        await self._subscribe_on_owner(pending[0])
                    pending.pop(0)
            except (*CONNECTION_ERRORS, redis.exceptions.RedisClusterException) as exc:
                if loop.time() >= deadline:
                    raise redis.exceptions.ConnectionError(
                        f'no primary serves the notification channels again: {exc}'
                    ) from exc
                logger.debug('notification channels not settled yet: %s', exc)
                await asyncio.sleep(RESUBSCRIBE_PAUSE_SECONDS)
        self.resubscribes += len(channels)
        return channels

    async def _subscribe_on_owner(self, channel: bytes) -> None:
        owner = self._cluster.get_node_from_key(channel)  # type: ignore[arg-type]
        if owner is None:
            raise redis.exceptions.RedisClusterException(f'no node serves {channel!r}')
        node = self._nodes.get(owner.name)
        if node is None:
            node = self._nodes[owner.name] = _NodeChannel(
                owner.name,
                self._pool_for(owner.host, int(owner.port)),
                self._idle_seconds,
                self._events,
            )
        try:
            await node.pubsub.ssubscribe(channel)
        except CONNECTION_ERRORS:
            await self._drop(owner.name)
            raise
        self._where[channel] = owner.name
        node.start()

    async def _drop(self, name: str) -> None:
        node = self._nodes.pop(name, None)
        for channel in [c for c, where in self._where.items() if where == name]:
            del self._where[channel]
        if node is not None:
            await node.close()

    async def aclose(self) -> None:
        for name in list(self._nodes):
            await self._drop(name)


class _NodeChannel:
    """The subscribed connection to one primary and the task reading it."""

    def __init__(
        self,
        name: str,
        pool: 'redis.asyncio.ConnectionPool',
        idle_seconds: float,
        events: 'asyncio.Queue[_Event]',
    ) -> None:
        self.name = name
        self.client = redis.asyncio.Redis.from_pool(pool)
        self.pubsub = self.client.pubsub()
        self._reader = NotificationReader(self.pubsub, idle_seconds)
        self._events = events
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._read(), name=f'notifications-{self.name}'
            )

    async def _read(self) -> None:
        try:
            while True:
                reader = self._reader
                found = await reader.messages()
                if found:
                    self._events.put_nowait(('messages', self.name, found))
                if reader.unsubscribed:
                    gone, reader.unsubscribed = reader.unsubscribed, []
                    self._events.put_nowait(('unsubscribed', self.name, gone))
                if reader.moved:
                    slots, reader.moved = reader.moved, []
                    self._events.put_nowait(('moved', self.name, slots))
        except CONNECTION_ERRORS as exc:
            logger.warning('notification channel to %s lost: %s', self.name, exc)
            self._events.put_nowait(('lost', self.name, None))

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self.pubsub.aclose()  # type: ignore[no-untyped-call]
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self.client.aclose()


def _as_bytes(channel: str | bytes) -> bytes:
    return channel.encode() if isinstance(channel, str) else channel
