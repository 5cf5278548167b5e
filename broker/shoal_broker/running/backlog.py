"""
The backlog and in-flight count of every queue and subscription, read from Redis in the
background (an ``Inspector`` of its own) for the scrape-time gauges and the metric records.

Reading every stream is the costly part of an idle cluster (10 000 queues: about a second of
CPU per walk), and every replica shows the same cluster-wide figures. So one replica walks (the
live one with the smallest id, as for the idle entities' metric records) and leaves what it read
in one Redis key (``keys.BACKLOGS``, JSON, expiring after three refresh intervals); the others
read that key. A replica that finds no snapshot there (the walker just died, or an older
version runs it) walks itself, so the gauges never stop.

A walk runs on the event loop that serves the clients, so it gives the loop a turn between its
steps: ``backlog.lua`` pipelines of 25 addresses, each read before the next is sent, and the
sums, rows and gauges after them (docs/performance.md#backlog-pages).
"""

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable

from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.registry import entities_seen, subscription_label
from shoal_broker.store import registry
from shoal_broker.store.inspect import Inspector
from shoal_broker.store.upkeep import Upkeep

logger = logging.getLogger(__name__)

Row = tuple[str, str, float, float, int | None, tuple[str, str] | None, int]
"""(address, subscription label, backlog, in flight, oldest enqueue ms, declaring resource,
messages waiting out a redelivery delay)."""

TURN_EVERY = 500
"""Rows summed between two turns of the event loop in a walk."""

SHARED_FOR_INTERVALS = 3
"""How many refresh intervals a shared snapshot stays in Redis before it expires."""


class BacklogSnapshot:
    """Backlog and in-flight count per queue and subscription, read from Redis in the background
    for the gauges, with the custom resources declaring them (for the ``shoal_declared_info``
    join metric). Labelled as the counters are (``subscription_label``). In flight is what Redis
    counts as handed to a replica and not settled: at a consumer, or in the replica's send-ahead
    buffer for one.

    With ``shared`` (the store's upkeep) and ``walks`` (whether this replica reads for all), the
    replicas share one walk (module docstring); without, this snapshot always walks itself."""

    def __init__(
        self,
        url: str,
        interval: float,
        *,
        shared: Upkeep | None = None,
        walks: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._inspector = Inspector.from_url(url)
        self.interval = interval
        self._shared = shared
        self._walks = walks
        self._rows: list[Row] = []
        """The last refresh's rows. The gauges are made of them when read (a scrape, the
        records), not kept: a refresh leaves the young collections a tuple per entity to scan,
        not a dozen objects (docs/performance.md#ack-cycles)."""
        self.walked = 0
        """Walks of every stream this snapshot made (the rest of its refreshes read the shared
        snapshot)."""
        self._settled: set[str] = set()
        self._walked_at = -math.inf
        self._refreshed_at = -math.inf

    async def refresh(self) -> bool:
        """Read every queue's and subscription's backlog now; False when Redis did not answer."""
        try:
            rows = await self._read_shared()
            if rows is None:
                rows = await self._walk()
        except StoreUnavailable as exc:
            logger.debug('backlog not refreshed: %s', exc)
            return False
        await asyncio.sleep(0)
        self._take(rows)
        self._refreshed_at = time.monotonic()
        return True

    async def _read_shared(self) -> list[Row] | None:
        """The snapshot the walking replica left, unless this replica is that one (or there is
        none): None means walk."""
        if self._shared is None or self._walks is None or await self._walks():
            return None
        raw = await self._shared.shared_backlogs()
        if raw is None:
            return None
        try:
            return [
                (
                    a,
                    s,
                    float(b),
                    float(f),
                    o,
                    None if owner is None else (owner[0], owner[1]),
                    int(w),
                )
                for a, s, b, f, o, owner, w in json.loads(raw)
            ]
        except (ValueError, TypeError) as exc:  # another version's shape: read for ourselves
            logger.debug('shared backlog snapshot not understood: %s', exc)
            return None

    def settled(self) -> set[str]:
        """The streams the last walk found nothing to trim in (empty, or unread by a group), if
        this snapshot walked within two intervals: the trimmer skips them. Whatever is consumed
        since is trimmed after the next walk, an interval later."""
        if time.monotonic() - self._walked_at > 2 * self.interval:
            return set()
        return self._settled

    async def _walk(self) -> list[Row]:
        settled: set[str] = set()
        found = await self._inspector.backlogs(settled)
        owners = await self._inspector.declared_owners()
        totals: dict[tuple[str, str], list[float]] = {}
        oldest: dict[tuple[str, str], int | None] = {}
        for at, (address, group, backlog) in enumerate(found):
            if at % TURN_EVERY == TURN_EVERY - 1:
                await asyncio.sleep(0)  # the loop's turn (module docstring)
            key = (address, subscription_label(group))  # private subscriptions add up
            total = totals.setdefault(key, [0.0, 0.0, 0])
            total[0] += backlog.backlog
            total[1] += backlog.in_flight
            total[2] += backlog.waiting
            known = [ms for ms in (oldest.get(key), backlog.oldest_ms) if ms is not None]
            oldest[key] = min(known) if known else None
        await asyncio.sleep(0)
        rows: list[Row] = [
            (a, s, b, f, oldest[(a, s)], registry.owner_of(a, s, owners), int(w))
            for (a, s), (b, f, w) in totals.items()
        ]
        await asyncio.sleep(0)
        self.walked += 1
        self._settled, self._walked_at = settled, time.monotonic()
        if self._shared is not None:
            ttl_ms = int(self.interval * SHARED_FOR_INTERVALS * 1000)
            await self._shared.share_backlogs(json.dumps(rows, separators=(',', ':')), ttl_ms)
        return rows

    def _take(self, rows: list[Row]) -> None:
        self._rows = rows
        entities_seen((a, s) for a, s, *_ in rows)

    @property
    def samples(self) -> list[tuple[list[str], float]]:
        """(address, subscription label) and backlog of each entity."""
        return [([a, s], backlog) for a, s, backlog, _, _, _, _ in self._rows]

    @property
    def in_flight(self) -> list[tuple[list[str], float]]:
        return [([a, s], out) for a, s, _, out, _, _, _ in self._rows]

    @property
    def waiting(self) -> list[tuple[list[str], float]]:
        return [([a, s], float(w)) for a, s, _, _, _, _, w in self._rows]

    @property
    def declared(self) -> list[tuple[list[str], float]]:
        return [([a, s, *owner], 1.0) for a, s, _, _, _, owner, _ in self._rows if owner]

    @property
    def oldest_ms(self) -> dict[tuple[str, str], int | None]:
        return {(a, s): oldest for a, s, _, _, oldest, _, _ in self._rows}

    async def refresh_forever(self) -> None:
        """Refresh whenever the last refresh (here or by the metric records) is an interval old."""
        while True:
            due = self._refreshed_at + self.interval - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)
            elif not await self.refresh():
                await asyncio.sleep(self.interval)

    def ages(self) -> list[tuple[list[str], float]]:
        """Seconds since the oldest unconsumed message of each entity was enqueued (0: none),
        as of now: the age keeps growing between refreshes, as the message keeps waiting."""
        now_ms = time.time() * 1000
        return [
            ([address, label], 0.0 if ms is None else max(0.0, (now_ms - ms) / 1000))
            for (address, label), ms in self.oldest_ms.items()
        ]

    def by_label(self) -> dict[tuple[str, str], int]:
        """(address, subscription label) -> backlog."""
        return {(a, s): int(backlog) for a, s, backlog, _, _, _, _ in self._rows}

    async def close(self) -> None:
        await self._inspector.close()
