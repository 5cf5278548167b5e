"""
What a replica reports about itself: the gauges and counters read when Prometheus scrapes, and
one metric record per queue and subscription every interval for the analytics job.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable

from shoal_broker import selector
from shoal_broker.amqp.broker import Broker
from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.records import MetricRecord
from shoal_broker.metrics.registry import (
    PRODUCERS_BLOCKED,
    PRODUCERS_BLOCKED_HELP,
    REDIS_RECONNECTS,
    REDIS_RECONNECTS_HELP,
    SENTINEL_SWITCHES,
    SENTINEL_SWITCHES_HELP,
    subscription_label,
)
from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.settings import BrokerSettings
from shoal_broker.store import connect, registry
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.replicas import Liveness

logger = logging.getLogger(__name__)

RECORDS_PER_SLICE = 25
"""Metric records built, labelled, encoded and appended per slice, one pipeline each: a record
costs the event loop ~60-90 µs (redis-py packing its XADD of 20 fields is half of it), so a
slice of 100 held every connection's traffic for ~9 ms, row a's p99 at 1 000 msg/s
(docs/performance.md#background-work-in-slices)."""

LINK_ROLES = ('producer', 'consumer', 'browser', 'lookup', 'coordinator')
"""The ``role`` label of ``shoal_links``: the link state classes' names without ``Link``."""


def broker_gauges(
    broker: Broker, backlog: BacklogSnapshot
) -> list[tuple[str, str, list[str], list[tuple[list[str], float]]]]:
    """The scrape-time gauges: this replica's connections, links and consumers; backlogs."""
    links = dict.fromkeys(LINK_ROLES, 0.0)  # 0, not absent, when no link of a role is attached
    for conn in broker.connections:
        for state in conn.links.values():
            role = type(state).__name__.removesuffix('Link').lower()
            links[role] = links.get(role, 0) + 1
    producers = links.get('producer', 0.0)
    owed = broker.owed()
    blocked = [(['memory_ceiling'], producers if broker.guard.memory_high else 0.0),
               (['redis_watermark'], producers if broker.guard.store_full else 0.0),
               (['store_hold'], producers if broker.holding.active else 0.0)]  # fmt: skip
    # every queue and subscription in Redis reports its consumers here, 0 when none is
    # attached to this replica: a series that vanished with the last consumer would read as
    # "no data" and hide a starved queue
    consumers = [(labels, 0.0) for labels, _ in backlog.samples]
    consumers += [
        ([sub.address, subscription_label(sub.group)], float(len(sub.consumers)))
        for sub in broker.subscriptions.values()
    ]
    return [
        ('shoal_selector_compilations', 'Selector texts compiled since start (cached outcomes '
         'and attaches refused before compiling are not counted).', [],
         [([], float(selector.compilations()))]),
        ('shoal_connections', 'Open AMQP connections on this replica.', [],
         [([], float(len(broker.connections)))]),
        ('shoal_draining', 'Whether this replica is stopping (SIGTERM): it takes and hands '
         'out nothing new and waits for what is under way.', [],
         [([], 0.0 if broker.accepting else 1.0)]),
        ('shoal_drain_owed', 'Work under way on this replica: sends owed an answer (send) and '
         'deliveries not settled by their consumers (delivery); while draining, what is left.',
         ['kind'], [(['send'], float(owed[0])), (['delivery'], float(owed[1]))]),
        ('shoal_links', 'Attached links on this replica, by role.', ['role'],
         [([role], n) for role, n in sorted(links.items())]),
        (PRODUCERS_BLOCKED, PRODUCERS_BLOCKED_HELP, ['reason'], blocked),
        ('shoal_held_sends', 'Messages held unanswered on this replica while the store does '
         'not answer (amqp/holding.py): written and accepted once it does.', [],
         [([], float(broker.holding.count))]),
        ('shoal_held_sends_oldest_seconds', 'How long the oldest held message has waited (0 '
         'when none is); past SHOAL_STORE_HOLD_SECONDS it is rejected.', [],
         [([], broker.holding.oldest_seconds())]),
        ('shoal_consumers', 'Consumers attached to this replica.', ['address', 'subscription'],
         consumers),
        ('shoal_backlog_messages', 'Messages not yet consumed, cluster-wide (read every '
         f'{backlog.interval:g} s by one replica for all).', ['address', 'subscription'],
         backlog.samples),
        ('shoal_in_flight_messages', 'Messages handed to consumers and not yet settled, '
         f'cluster-wide (read every {backlog.interval:g} s by one replica for all).',
         ['address', 'subscription'], backlog.in_flight),
        ('shoal_redelivery_waiting_messages', 'Messages given back and waiting out a '
         'redelivery delay before any consumer may have them again, cluster-wide (read every '
         f'{backlog.interval:g} s by one replica for all).', ['address', 'subscription'],
         backlog.waiting),
        ('shoal_oldest_message_age_seconds', 'Age of the oldest message not yet consumed '
         '(0 when none waits).', ['address', 'subscription'], backlog.ages()),
        # An info metric, as kube-state-metrics does: join any series on (address, subscription)
        # to add the resource's labels, without widening every hot counter's label set.
        ('shoal_declared_info', 'The Queue or SharedSubscription resource declaring a queue or '
         'subscription (value 1).', ['address', 'subscription', 'cr_namespace', 'cr_name'],
         backlog.declared),
    ]  # fmt: skip


def store_counters(
    store: RedisStore,
) -> list[tuple[str, str, list[str], list[tuple[list[str], float]]]]:
    """The scrape-time counters the store keeps as plain ints: reconnects, Sentinel switches."""
    return [
        (REDIS_RECONNECTS, REDIS_RECONNECTS_HELP, ['connection'],
         [([name], float(n)) for name, n in sorted(store.reconnects.items())]),
        (SENTINEL_SWITCHES, SENTINEL_SWITCHES_HELP, [],
         [([], float(sum(connect.switches_followed.values())))]),
    ]  # fmt: skip


class RecordedFigures:
    """What this replica last wrote for each entity: (consumers here, backlog, when), so an
    unchanged, quiet entity is written only every heartbeat (``metrics_heartbeat_seconds``)."""

    def __init__(self, heartbeat_ms: int, interval_ms: int) -> None:
        # due half an interval early: the interval's ticks jitter, and a heartbeat missed by a
        # millisecond would wait a whole interval more
        self.heartbeat_ms = heartbeat_ms - interval_ms // 2
        self.last: dict[tuple[str, str], tuple[int, int, int]] = {}

    def due(self, entity: tuple[str, str], consumers: int, backlog: int, now_ms: int) -> bool:
        last = self.last.get(entity)
        return (
            last is None
            or (last[0], last[1]) != (consumers, backlog)
            or now_ms - last[2] >= self.heartbeat_ms
        )

    def wrote(self, records: list[MetricRecord]) -> None:
        for r in records:
            self.last[(r.address, r.subscription)] = (r.consumers, r.backlog, r.ts_ms)

    def forget_except(self, entities: set[tuple[str, str]]) -> None:
        """Drop what is no longer recorded here (a queue gone; consumers gone and said so)."""
        for entity in set(self.last) - entities:
            del self.last[entity]


async def record_metrics(
    settings: BrokerSettings,
    store: RedisStore,
    broker: Broker,
    backlog: BacklogSnapshot,
    liveness: Liveness,
) -> None:
    """Append the interval's metric records (deltas + gauges) every interval, on a fixed cadence.

    Each replica writes the records of the entities it saw activity on or has consumers of; the
    live replica with the smallest id also writes one for every other queue and subscription
    in Redis, idle or not (a dead-letter queue nobody reads, a backlog nobody consumes), so each
    appears and only once for its idle part. An entity with no activity whose backlog and
    consumers are what this replica last wrote is written again only every heartbeat."""
    interval = settings.store.metrics_interval_seconds
    figures = RecordedFigures(
        int(max(settings.store.metrics_heartbeat_seconds, 0) * 1000), int(interval * 1000)
    )
    loop = asyncio.get_running_loop()
    tick = loop.time()
    while True:
        tick += interval
        if tick < loop.time():  # fell behind by more than an interval: skip, do not burst
            tick = loop.time() + interval
        await asyncio.sleep(tick - loop.time())
        await backlog.refresh()  # the backlog at the end of the interval
        try:
            idle_too = await liveness.is_first_live()
        except StoreUnavailable:
            idle_too = False
        records = metric_records(
            broker, backlog, settings.replica_id, int(interval * 1000), idle_too=idle_too,
            figures=figures,
        )  # fmt: skip
        await write_records(store, records, settings.store.metrics_stream_length, figures)


async def write_records(
    store: RedisStore,
    records: AsyncGenerator[list[MetricRecord], None],
    max_length: int,
    figures: RecordedFigures,
) -> int:
    """Label, encode and append each slice of ``records`` as it is built, one pipeline a slice
    (the loop serves clients in between), and note each slice written in ``figures``; returns
    how many were written. A store that fails loses the rest of the interval's records (the
    log says how many went before)."""
    written = 0
    async with contextlib.aclosing(records):
        try:
            owners = await registry.declared_owners(store.client)  # resources declaring them
            async for batch in records:
                fields = [registry.labelled(record, owners).to_fields() for record in batch]
                await store.upkeep.append_records(fields, max_length)
                figures.wrote(batch)
                written += len(batch)
        except StoreUnavailable as exc:
            logger.warning('metric records lost past the first %d: %s', written, exc)
    return written


def metric_records(
    broker: Broker,
    backlog: BacklogSnapshot,
    replica: str,
    interval_ms: int,
    *,
    idle_too: bool = False,
    figures: RecordedFigures | None = None,
) -> AsyncGenerator[list[MetricRecord], None]:
    """This replica's records for the interval, in slices of ``RECORDS_PER_SLICE`` built one
    at a time as they are asked for, the loop serving clients between them (2 000 records took
    ~27 ms in one go): every entity with activity or consumers here, and with IDLE_TOO every
    other queue and subscription the backlog snapshot knows. With FIGURES, a quiet entity is
    left out while its figures are those last written and its heartbeat is not due; one whose
    consumers here left is written once more (0 consumers). The interval's tallies and gauges
    are taken at the call."""
    tallies, latencies = broker.counters.take()
    consumers = {
        (sub.address, subscription_label(sub.group)): len(sub.consumers)
        for sub in broker.subscriptions.values()
    }
    backlogs = backlog.by_label()
    now_ms = int(time.time() * 1000)
    entities = set(tallies) | set(consumers) | set(latencies)
    if idle_too:
        entities |= set(backlogs)
    if figures is not None:
        left = {e for e, (n, _, _) in figures.last.items() if n > 0 and e not in consumers}
        figures.forget_except(entities | left)
        quiet = entities - set(tallies) - set(latencies)
        entities -= {
            e for e in quiet
            if not figures.due(e, consumers.get(e, 0), backlogs.get(e, -1), now_ms)
        }  # fmt: skip
        entities |= left

    def record(entity: tuple[str, str]) -> MetricRecord:
        return MetricRecord.of(
            ts_ms=now_ms,
            interval_ms=interval_ms,
            replica=replica,
            address=entity[0],
            subscription=entity[1],
            counts=tallies.get(entity, {}),
            consumers=consumers.get(entity, 0),
            backlog=backlogs.get(entity, -1),
            latency=latencies.get(entity),
        )

    return _in_slices(sorted(entities), record)


async def _in_slices(
    entities: list[tuple[str, str]], record: Callable[[tuple[str, str]], MetricRecord]
) -> AsyncGenerator[list[MetricRecord], None]:
    for start in range(0, len(entities), RECORDS_PER_SLICE):
        if start:
            await asyncio.sleep(0)  # the loop's turn between slices
        yield [record(entity) for entity in entities[start : start + RECORDS_PER_SLICE]]
