"""
What each consumer group has not consumed yet, read from Redis for ``inspect.Inspector``: a
read-only ``backlog.lua`` call per address, in pages, plus a count where Redis cannot tell a
group's lag. Kept apart from the Inspector's listings to keep each module short.

An address the last read found empty is looked at first with two plain commands (``XLEN`` of its
default band; ``EXISTS`` of its levels SET, its groups' returned ZSETs and its big messages' body
index), and read with the script only if they find something: the script cost Redis several
times what the two commands cost, and the walk's wall time. An address found empty so, bodies
included, is among the ``settled`` keys by its tag (``keys.address_tag``), which lets the trim
pass leave the whole address alone (``Upkeep.trim``) rather than ask for its body index every
pass, without making its keys; the probe itself names only the keys it asks about
(``keys.probed_keys``), so a walk over thousands of idle addresses leaves the cached keys of
those in use alone (docs/performance.md#idle-queues).
"""

import asyncio
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.client import NEVER_DECODE

from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.storage import NORMAL_BAND
from shoal_broker.store import calls as calls_
from shoal_broker.store import keys, packed, scripts
from shoal_broker.store.calls import as_text

PAGE = 100
"""Entries counted per ``XRANGE`` where Redis cannot tell a group's lag."""
BACKLOG_PAGE = 25  # a page read and summed in one loop stretch: performance.md#backlog-pages
CLUSTER_CONCURRENCY = 32
"""``backlog.lua`` calls in flight at once on a cluster (a pipeline elsewhere)."""
EMPTY_REMEMBERED = 200_000
"""Bound on the addresses remembered as empty (a name each); past it, none is, until the next
read refills the set."""
_BACKLOG_SOURCE = scripts.source('backlog')
_BACKLOG_SHA = hashlib.sha1(_BACKLOG_SOURCE.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class GroupBacklog:
    """What one consumer group still has to consume, summed over the priority bands."""

    lag: int = 0
    """Entries no replica has been handed yet."""
    pending: int = 0
    """Entries handed to a replica and not acknowledged (in flight or returned)."""
    returned: int = 0
    """Pending entries released back for redelivery (the returned-entries ZSET)."""
    oldest_ms: int | None = None
    """Stream time (enqueue, ms since the epoch) of the oldest message not consumed yet; None
    when there is none."""
    waiting: int = 0
    """Returned entries waiting out a redelivery delay (``routing/redelivery.py``)."""

    @property
    def backlog(self) -> int:
        """Every message the group has not consumed yet."""
        return self.lag + self.pending

    @property
    def ready(self) -> int:
        """Messages a consumer could be handed now."""
        return self.lag + max(min(self.returned, self.pending) - self.waiting, 0)

    @property
    def in_flight(self) -> int:
        """Messages out at a consumer, awaiting its outcome."""
        return max(self.pending - self.returned, 0)

    def __add__(self, other: 'GroupBacklog') -> 'GroupBacklog':
        known = [ms for ms in (self.oldest_ms, other.oldest_ms) if ms is not None]
        return GroupBacklog(
            self.lag + other.lag, self.pending + other.pending, self.returned + other.returned,
            min(known) if known else None, self.waiting + other.waiting,
        )  # fmt: skip


_NOTHING = GroupBacklog()

Call = Callable[[Awaitable[Any]], Awaitable[Any]]


class BacklogReads:
    """Reads of groups' backlogs on one client; remembers which addresses were empty."""

    def __init__(self, client: 'redis.asyncio.Redis', call: Call) -> None:
        self._client = client
        self._call = call
        self._empty: set[str] = set()

    async def read(
        self, groups: list[tuple[str, str]], settled: set[str] | None = None
    ) -> list[GroupBacklog]:
        """Backlog of each (address, group), by ``BACKLOG_PAGE`` addresses (concurrent calls on
        a cluster). Adds to ``settled`` the streams with nothing to trim (empty, or unread by a
        group), and the tag of each address found empty whole (``Upkeep.trim``)."""
        by_address: dict[str, list[str]] = {}
        for address, group in groups:
            by_address.setdefault(address, []).append(group)
        addresses = list(by_address)
        found: dict[tuple[str, str], GroupBacklog] = {}
        for first in range(0, len(addresses), BACKLOG_PAGE):
            page = addresses[first : first + BACKLOG_PAGE]
            still_empty = await self._still_empty([a for a in page if a in self._empty], by_address)
            full = [a for a in page if a not in still_empty]
            replies = await self._backlog_calls([(a, by_address[a]) for a in full]) if full else []
            for address in still_empty:
                for group in by_address[address]:
                    found[(address, group)] = _NOTHING
                if settled is not None:  # the whole address: see Upkeep.trim
                    settled.add(keys.address_tag(address))
            for address, reply in zip(full, replies, strict=True):
                self._remember(address, reply)
                streams = keys.AddressKeys.of(address).streams
                for group, row in zip(by_address[address], reply, strict=True):
                    backlog, uncounted = _group(streams, row, settled)
                    for stream in uncounted:  # Redis cannot tell the lag: count the entries
                        backlog += GroupBacklog(lag=await self._lag_of(stream, group))
                    found[(address, group)] = backlog
        return [found[g] for g in groups]

    def _remember(self, address: str, reply: list[Any]) -> None:
        """Whether ``address`` held nothing by its ``backlog.lua`` reply: no band with entries
        and no returned entry in any group's row (``[returned, waiting]`` alone)."""
        if all(len(row) == 2 and not int(row[0]) for row in reply):
            if len(self._empty) >= EMPTY_REMEMBERED:
                self._empty.clear()
            self._empty.add(address)
        else:
            self._empty.discard(address)

    async def _still_empty(
        self, addresses: list[str], by_address: dict[str, list[str]]
    ) -> set[str]:
        """Of ``addresses`` (empty when last read), those still empty: no entry in the default
        band, no other band in use, no returned entry (what ``backlog.lua`` would answer with
        rows of zeros: it reads only the default band and those in the levels SET), and no big
        message's body left to delete."""
        if not addresses:
            return set()
        commands: list[tuple[Any, ...]] = []
        for address in addresses:
            stream, others = keys.probed_keys(address, NORMAL_BAND, by_address[address])
            commands += [('XLEN', stream), ('EXISTS', *others)]
        replies = await self._pipeline(commands)
        empty = {
            address
            for address, length, held in zip(addresses, replies[::2], replies[1::2], strict=True)
            if not int(length) and not int(held)
        }
        self._empty.difference_update(a for a in addresses if a not in empty)
        return empty

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if isinstance(self._client, redis.asyncio.cluster.RedisCluster):
            pipe = self._client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return list(await self._call(pipe.execute()))
        return list(await self._call(packed.pipeline(self._client, commands, raise_on_error=True)))

    async def _backlog_calls(self, page: list[tuple[str, list[str]]]) -> list[Any]:
        """``backlog.lua``'s reply for each (address, its groups), loading the script when
        Redis does not know it (a restart, a failover, a new cluster node)."""
        calls: list[tuple[int, list[str]]] = []  # (number of keys, keys and arguments)
        for address, names in page:
            k = keys.AddressKeys.of(address)
            returned = [k.returned(n) for n in names]
            calls.append(
                (len(k.streams) + 1 + len(names), [*k.streams, k.levels, *returned, *names])
            )
        room = asyncio.Semaphore(CLUSTER_CONCURRENCY)

        async def one(numkeys: int, args: list[str]) -> Any:
            async with room:
                return await self._client.evalsha(_BACKLOG_SHA, numkeys, *args)

        for attempt in (1, 2):
            try:
                if isinstance(self._client, redis.asyncio.cluster.RedisCluster):
                    return list(await self._call(asyncio.gather(*(one(n, a) for n, a in calls))))
                commands = [('EVALSHA', _BACKLOG_SHA, n, *args) for n, args in calls]
                return list(
                    await self._call(packed.pipeline(self._client, commands, raise_on_error=True))
                )
            except StoreUnavailable as exc:
                if attempt == 2 or not isinstance(exc.__cause__, redis.exceptions.NoScriptError):
                    raise
                await calls_.on_every_primary(
                    self._client,
                    lambda c, **to: c.execute_command('SCRIPT', 'LOAD', _BACKLOG_SOURCE, **to),
                )
        raise AssertionError('unreachable')

    async def _lag_of(self, stream: str, group: str) -> int:
        for info in await self._call(self._client.xinfo_groups(stream)):
            if as_text(info.get('name')) == group:
                return await self._count_after(stream, as_text(info.get('last-delivered-id')))
        return 0

    async def _count_after(self, stream: str, last_id: str) -> int:
        counted = 0
        start = f'({last_id}'
        # the entries hold binary messages: read as bytes, whatever the client decodes
        command: Callable[..., Awaitable[Any]] = self._client.execute_command
        while True:
            batch = await self._call(command(
                'XRANGE', stream, start, '+', 'COUNT', PAGE, **{NEVER_DECODE: True}
            ))  # fmt: skip
            counted += len(batch)
            if len(batch) < PAGE:
                return counted
            start = f'({as_text(batch[-1][0])}'


def _group(
    streams: tuple[str, ...], row: list[Any], settled: set[str] | None
) -> tuple[GroupBacklog, list[str]]:
    """One group's backlog from its ``backlog.lua`` reply, and the streams whose lag Redis
    could not tell (deleted entries in range), for the caller to count. The reply: returned,
    waiting, then per band holding entries: band, lag, pending, oldest, length; a band left out
    is empty. A walk reads every group of every address, so this sums plain ints and makes
    one ``GroupBacklog`` (docs/performance.md#backlog-pages)."""
    if len(row) == 2:  # no band holds entries
        if settled is not None:
            settled.update(streams)
        return GroupBacklog(returned=int(row[0]), waiting=int(row[1])), []
    lag_sum = pending_sum = 0
    oldest: int | None = None
    held: list[str] = []
    uncounted: list[str] = []
    for at in range(2, len(row), 5):
        band, lag, pending, first, length = row[at : at + 5]
        stream = streams[int(band)]
        held.append(stream)
        lag = int(lag)
        if settled is not None and lag == int(length):
            settled.add(stream)  # unread by this group: nothing to trim, whatever the others
        if lag < 0:
            uncounted.append(stream)
        else:
            lag_sum += lag
        pending_sum += int(pending)
        ms = _entry_ms(first or None)
        if ms is not None and (oldest is None or ms < oldest):
            oldest = ms
    if settled is not None:
        settled.update(set(streams).difference(held))
    return GroupBacklog(lag_sum, pending_sum, int(row[0]), oldest, int(row[1])), uncounted


def _entry_ms(entry_id: Any) -> int | None:
    """The milliseconds part of a stream entry id (``<ms>-<seq>``)."""
    return None if entry_id is None else int(as_text(entry_id).partition('-')[0])
