"""
The backlog and in-flight count of every queue and subscription, read from Redis in the
background (an ``Inspector`` of its own) for the scrape-time gauges and the metric records.
"""

import asyncio
import logging
import math
import time

from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.registry import subscription_label
from shoal_broker.store import registry
from shoal_broker.store.inspect import Inspector

logger = logging.getLogger(__name__)


class BacklogSnapshot:
    """Backlog and in-flight count per queue and subscription, read from Redis in the background
    for the gauges, with the custom resources declaring them (for the ``shoal_declared_info``
    join metric). Labelled as the counters are (``subscription_label``). In flight is what Redis
    counts as handed to a replica and not settled: at a consumer, or in the replica's send-ahead
    buffer for one."""

    def __init__(self, url: str, interval: float) -> None:
        self._inspector = Inspector.from_url(url)
        self.interval = interval
        self.samples: list[tuple[list[str], float]] = []
        self.in_flight: list[tuple[list[str], float]] = []
        self.oldest_ms: dict[tuple[str, str], int | None] = {}
        self.declared: list[tuple[list[str], float]] = []
        self._refreshed_at = -math.inf

    async def refresh(self) -> bool:
        """Read every queue's and subscription's backlog now; False when Redis did not answer."""
        try:
            queues = await self._inspector.queues()
            subscriptions = await self._inspector.subscriptions()
            owners = await self._inspector.declared_owners()
        except StoreUnavailable as exc:
            logger.debug('backlog not refreshed: %s', exc)
            return False
        rows = [(q.name, 'queue', q.backlog, q.in_flight, q.oldest_ms) for q in queues] + [
            (s.topic, subscription_label(s.id), s.backlog, s.in_flight, s.oldest_ms)
            for s in subscriptions
        ]
        backlogs: dict[tuple[str, str], float] = {}
        in_flight: dict[tuple[str, str], float] = {}
        oldest: dict[tuple[str, str], int | None] = {}
        for address, label, waiting, out, since in rows:
            key = (address, label)
            backlogs[key] = backlogs.get(key, 0.0) + waiting
            in_flight[key] = in_flight.get(key, 0.0) + out
            known = [ms for ms in (oldest.get(key), since) if ms is not None]
            oldest[key] = min(known) if known else None
        self.oldest_ms = oldest
        self.samples = [([a, s], value) for (a, s), value in backlogs.items()]
        self.in_flight = [([a, s], value) for (a, s), value in in_flight.items()]
        self.declared = [
            ([address, subscription, *owner], 1.0)
            for address, subscription in backlogs
            if (owner := registry.owner_of(address, subscription, owners)) is not None
        ]
        self._refreshed_at = time.monotonic()
        return True

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
        return {(labels[0], labels[1]): int(value) for labels, value in self.samples}

    async def close(self) -> None:
        await self._inspector.close()
