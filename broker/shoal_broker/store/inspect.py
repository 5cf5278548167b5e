"""
Read-only introspection of what the cluster keeps in Redis, for the ``shoal`` CLI and tooling.

The broker replicas hold no state of their own, so the only complete answer to "which addresses,
queues, subscriptions and ClientIDs exist, and how much is waiting" is in Redis. This module
reads it without touching anything: no writes (its one script, ``backlog.lua``, only reads), no
consumer-group reads, so it is safe against a live cluster. It lives in ``store/`` because only
this package knows Redis and the key layout (every key comes from :mod:`shoal_broker.store.keys`).

Backlog of a consumer group (a queue's, or a named subscription's on its topic) is counted per
priority band stream from ``XINFO GROUPS``: ``lag`` (entries not yet handed to any replica) plus
``pending`` (handed out and not acknowledged). Returned (released) entries stay pending until a
replica claims them again, so the returned-entries ZSET is a subset of ``pending``: it is
reported as part of what is ``ready``, never added to the backlog a second time. A missing
stream or group counts as zero.
"""

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.exclusive import consumer_of
from shoal_broker.routing.jms_subscriptions import Scope
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.settings import AddressKind
from shoal_broker.store import calls as calls_
from shoal_broker.store import connect, keys, layout
from shoal_broker.store.backlog_reads import BacklogReads, GroupBacklog

_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
_PAGE = 100  # a pipeline holds the loop ~10 ms (performance.md#background-work-in-slices)


@dataclasses.dataclass(frozen=True, slots=True)
class AddressInfo:
    name: str
    kind: str
    """``queue`` or ``topic`` (anything else is reported as stored)."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    backlog: int
    ready: int
    in_flight: int
    oldest_ms: int | None = None
    """Enqueue time (ms since the epoch) of the oldest message not consumed yet."""
    consumers: dict[str, int] = dataclasses.field(default_factory=dict)
    """Consumers per replica id, as each replica last recorded them in the queue's sharing
    (``AddressKeys.shares``)."""
    delivered: dict[str, int] = dataclasses.field(default_factory=dict)
    """Messages each replica delivered (``AddressKeys.delivered``; counted at each replica's
    metric interval)."""
    line: list[str] = dataclasses.field(default_factory=list)
    """An exclusive entity's consumers in line (``routing/exclusive.py``), the active one
    first, each ``<replica>/<connection>|<link>``; empty for any other."""
    last_values: int = 0
    """Keys a last-value queue holds a newest message for (``AddressKeys.last_values``); 0 for
    any other queue, and for a last-value queue holding none."""
    active_groups: int = 0
    """Message groups owned by a replica (``AddressKeys.group_owners``); 0 without groups."""


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    id: str
    """The subscription id: registry key and consumer-group name on the topic."""
    name: str
    kind: str
    """``shared durable``, ``exclusive durable``, ``shared volatile``."""
    namespace: str
    """``global``, or the ClientID that owns the name."""
    scope: str
    client_id: str
    durable: bool
    shared: bool
    topic: str
    selector: str | None
    no_local: bool
    max_consumers: int | None
    """A provisioned consumer limit; None when the broker default applies."""
    consumers: dict[str, int]
    """Attached consumers per replica id, cluster-wide."""
    backlog: int
    ready: int
    in_flight: int
    oldest_ms: int | None = None
    """Enqueue time (ms since the epoch) of the oldest message not consumed yet."""
    delivered: dict[str, int] = dataclasses.field(default_factory=dict)
    """Messages each replica delivered (``AddressKeys.delivered``; counted at each replica's
    metric interval)."""
    line: list[str] = dataclasses.field(default_factory=list)
    """An exclusive entity's consumers in line (``routing/exclusive.py``), the active one
    first, each ``<replica>/<connection>|<link>``; empty for any other."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str
    replica: str
    connection: str


class Inspector:
    """A read-only view of one Redis. Redis failures become ``StoreUnavailable``."""

    def __init__(self, client: 'redis.asyncio.Redis') -> None:
        self._client = client
        # what it found empty it remembers for as long as this view lives (a backlog snapshot's)
        self._backlogs = BacklogReads(client, self._call).read

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 5.0) -> Self:
        """Raises ValueError for a URL redis-py cannot use."""
        client = connect.client_of_any_mode(
            url, decode_responses=True, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        return cls(client)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            await connect.close(self._client)
        except _REDIS_DOWN:
            pass

    async def addresses(self) -> list[AddressInfo]:
        kinds = await self._kinds()
        return [AddressInfo(name, kinds[name]) for name in sorted(kinds)]

    async def queue_names(self) -> list[str]:
        """Every queue's name, in order."""
        kinds = await self._kinds()
        return sorted(name for name, kind in kinds.items() if kind == AddressKind.QUEUE)

    async def _kinds(self) -> dict[str, str]:
        """Every address's name -> kind, each page decoded as it comes: a background walk over
        thousands of addresses would otherwise decode them all in one stretch of the loop."""
        kinds: dict[str, str] = {}
        cursor = 0
        while True:
            cursor, batch = await self._call(
                self._client.hscan(keys.ADDRESSES, cursor, count=_PAGE)
            )
            # the index's value is ``<kind>:<epoch>`` (store/layout.py); it may list an address
            # a crash left half-created: the CLI shows it until the name is created and deleted
            kinds.update((_text(n), layout.kind_of(v)) for n, v in batch.items())
            if not cursor:
                return kinds

    async def declared_owners(self) -> dict[str, str]:
        """``PROVISIONED``: a declared queue's or subscription's field -> ``namespace/name`` of
        the resource declaring it (any client: bytes or text replies)."""
        raw = await self._call(self._client.hgetall(keys.PROVISIONED))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def queues(self, names: list[str] | None = None) -> list[QueueInfo]:
        """Every queue, or the ``names`` given (queues known to exist: a page of a listing)."""
        if names is None:
            names = await self.queue_names()
        groups = [(name, QUEUE_GROUP) for name in names]
        found = await self._backlogs(groups)
        per_replica = await self._per_replica(groups)
        lines = await self.lines(groups)
        last_values = await self._sizes(names, lambda k: k.last_values)
        active_groups = await self._sizes(names, lambda k: k.group_owners(QUEUE_GROUP))
        return [
            QueueInfo(
                name,
                b.backlog,
                b.ready,
                b.in_flight,
                oldest_ms=b.oldest_ms,
                consumers=_in_line(line) if line else consumers,
                delivered=delivered,
                line=line,
                last_values=held,
                active_groups=owned,
            )
            for name, b, (consumers, delivered), line, held, owned in zip(
                names, found, per_replica, lines, last_values, active_groups, strict=True
            )
        ]

    async def _sizes(self, names: list[str], key: Callable[[keys.AddressKeys], str]) -> list[int]:
        """One HASH's size per queue (one HLEN each): last-value keys, message groups owned."""
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hlen(key(keys.AddressKeys.of(name)))
        return [int(n) for n in await self._call(pipe.execute())] if names else []

    async def lines(self, groups: list[tuple[str, str]]) -> list[list[str]]:
        """For each (address, group): its line of consumers, the active one first, each
        ``<replica>/<connection>|<link>`` (empty: not exclusive, or nobody attached)."""
        pipe = self._client.pipeline(transaction=False)
        for address, group in groups:
            pipe.zrange(keys.AddressKeys.of(address).line(group), 0, -1)
        replies = await self._call(pipe.execute()) if groups else []
        return [['/'.join(consumer_of(_text(m))) for m in members] for members in replies]

    async def backlogs(
        self, settled: set[str] | None = None
    ) -> list[tuple[str, str, GroupBacklog]]:
        """(address, group, backlog) of every queue (group ``QUEUE_GROUP``) and every named or
        private subscription (its id): what the broker's gauges need, without the per-replica
        detail ``queues`` and ``subscriptions`` add for the CLI. Adds to ``settled`` the streams
        that had nothing to trim when read (none of their entries is consumed by every group)."""
        queues = await self.queue_names()
        ids = await self._call(layout.subscription_ids(self._client))
        pipe = self._client.pipeline(transaction=False)
        for subscription_id in ids:
            pipe.hget(keys.SubscriptionKeys.of(subscription_id).definition, 'topic')
        topics = await self._call(pipe.execute()) if ids else []
        groups = [(name, QUEUE_GROUP) for name in queues] + [
            (_text(topic), sid) for sid, topic in zip(ids, topics, strict=True) if topic
        ]  # a subscription without a definition: listed in the index only, or removed since
        found = await self._backlogs(groups, settled)
        return [(a, g, b) for (a, g), b in zip(groups, found, strict=True)]

    async def _per_replica(
        self, groups: list[tuple[str, str]]
    ) -> list[tuple[dict[str, int], dict[str, int]]]:
        """For each (address, group): consumers per replica as recorded in its sharing, and
        messages delivered per replica."""
        pipe = self._client.pipeline(transaction=False)
        for address, group in groups:
            k = keys.AddressKeys.of(address)
            pipe.hgetall(k.shares(group))
            pipe.hgetall(k.delivered(group))
        replies = await self._call(pipe.execute())
        found = []
        for shares, delivered in zip(replies[::2], replies[1::2], strict=True):
            consumers = {
                _text(replica): int(_text(record).split(' ', 1)[0])
                for replica, record in shares.items()
                if not _text(replica).startswith('>')  # fields of where the group stands
            }
            found.append((
                {r: n for r, n in sorted(consumers.items()) if n > 0},
                {_text(r): int(n) for r, n in sorted(delivered.items())},
            ))  # fmt: skip
        return found

    async def delivered(self, address: str, group: str) -> dict[str, int]:
        """Messages each replica delivered for one consumer group."""
        return (await self._per_replica([(address, group)]))[0][1]

    async def subscriptions(self) -> list[SubscriptionInfo]:
        ids = await self._call(layout.subscription_ids(self._client))
        pipe = self._client.pipeline(transaction=False)
        for subscription_id in ids:
            k = keys.SubscriptionKeys.of(subscription_id)
            pipe.hgetall(k.definition)
            pipe.hgetall(k.consumers)
        replies = await self._call(pipe.execute())
        rows: list[tuple[str, Mapping[str, str], Mapping[str, str]]] = []
        for i, subscription_id in enumerate(ids):
            definition, consumers = replies[2 * i], replies[2 * i + 1]
            if definition:  # an index entry for nothing, or removed since it was listed
                rows.append((subscription_id, definition, consumers))
        groups = [(d.get('topic', ''), sid) for sid, d, _ in rows]
        backlogs = await self._backlogs(groups)
        per_replica = await self._per_replica(groups)
        lines = await self.lines(groups)
        return [
            dataclasses.replace(_subscription(sid, d, c, b, delivered), line=line)
            for (sid, d, c), b, (_, delivered), line in zip(
                rows, backlogs, per_replica, lines, strict=True
            )
        ]

    async def group_backlogs(self, groups: list[tuple[str, str]]) -> list[GroupBacklog]:
        """What each (address, group) has not consumed yet, without the per-replica detail: a
        listing sorted by backlog reads this of every queue, then the detail of one page."""
        return await self._backlogs(groups)

    async def backlog(self, address: str, group: str) -> GroupBacklog:
        """What one consumer group of an address has not consumed yet."""
        return (await self._backlogs([(address, group)]))[0]

    async def clients(self) -> list[ClientInfo]:
        holders: dict[str, str] = await self._call(self._client.hgetall(keys.CLIENTS))
        found = []
        for client_id in sorted(holders):
            replica, _, connection = str(holders[client_id]).rpartition('|')
            found.append(ClientInfo(client_id, replica, connection))
        return found

    async def _call(self, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except _REDIS_DOWN as exc:
            raise StoreUnavailable(f'Redis unreachable: {calls_.reason(exc)}') from exc
        except redis.exceptions.RedisError as exc:
            raise StoreUnavailable(f'Redis refused: {exc}') from exc


def _subscription(
    subscription_id: str,
    definition: Mapping[str, str],
    consumers: Mapping[str, str],
    backlog: GroupBacklog,
    delivered: dict[str, int],
) -> SubscriptionInfo:
    shared = definition.get('shared') == '1'
    durable = definition.get('durable') == '1'
    scope = definition.get('scope', '')
    client_id = definition.get('client', '')
    per_replica: dict[str, int] = {}
    for replica in consumers.values():
        per_replica[replica] = per_replica.get(replica, 0) + 1
    max_consumers = definition.get('max_consumers')
    return SubscriptionInfo(
        id=subscription_id,
        name=definition.get('name', ''),
        kind=f'{"shared" if shared else "exclusive"} {"durable" if durable else "volatile"}',
        namespace=Scope.GLOBAL.value if scope == Scope.GLOBAL else client_id,
        scope=scope,
        client_id=client_id,
        durable=durable,
        shared=shared,
        topic=definition.get('topic', ''),
        selector=definition.get('selector') or None,
        no_local=definition.get('no_local') == '1',
        max_consumers=int(max_consumers) if max_consumers else None,
        consumers=dict(sorted(per_replica.items())),
        backlog=backlog.backlog,
        ready=backlog.ready,
        in_flight=backlog.in_flight,
        oldest_ms=backlog.oldest_ms,
        delivered=delivered,
    )


def _in_line(line: list[str]) -> dict[str, int]:
    """Consumers per replica of an exclusive entity, from its line (it keeps no sharing)."""
    per_replica: dict[str, int] = {}
    for entry in line:
        replica = entry.split('/', 1)[0]
        per_replica[replica] = per_replica.get(replica, 0) + 1
    return dict(sorted(per_replica.items()))


def _count(reply: Any) -> int:
    return 0 if isinstance(reply, Exception) or reply is None else int(reply)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
