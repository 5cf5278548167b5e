"""
What a replica reports about itself: the gauges and counters read when Prometheus scrapes, and
one metric record per queue and subscription every interval for the analytics job.
"""

import asyncio
import logging
import time

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


def broker_gauges(
    broker: Broker, backlog: BacklogSnapshot
) -> list[tuple[str, str, list[str], list[tuple[list[str], float]]]]:
    """The scrape-time gauges: this replica's connections, links and consumers; backlogs."""
    links: dict[str, float] = {}
    for conn in broker.connections:
        for state in conn.links.values():
            role = type(state).__name__.removesuffix('Link').lower()
            links[role] = links.get(role, 0) + 1
    producers = links.get('producer', 0.0)
    blocked = [(['memory_ceiling'], producers if broker.guard.memory_high else 0.0),
               (['redis_watermark'], producers if broker.guard.store_full else 0.0)]  # fmt: skip
    consumers = [
        ([sub.address, subscription_label(sub.group)], float(len(sub.consumers)))
        for sub in broker.subscriptions.values()
    ]
    return [
        ('shoal_selector_compilations', 'Selector texts compiled since start (cached outcomes '
         'and attaches refused before compiling are not counted).', [],
         [([], float(selector.compilations()))]),
        ('shoal_connections', 'Open AMQP connections on this replica.', [],
         [([], float(len(broker.connections)))]),
        ('shoal_links', 'Attached links on this replica, by role.', ['role'],
         [([role], n) for role, n in sorted(links.items())]),
        (PRODUCERS_BLOCKED, PRODUCERS_BLOCKED_HELP, ['reason'], blocked),
        ('shoal_consumers', 'Consumers attached to this replica.', ['address', 'subscription'],
         consumers),
        ('shoal_backlog_messages', 'Messages not yet consumed, cluster-wide (refreshed every '
         f'{backlog.interval:g} s).', ['address', 'subscription'], backlog.samples),
        ('shoal_in_flight_messages', 'Messages handed to consumers and not yet settled, '
         f'cluster-wide (refreshed every {backlog.interval:g} s).', ['address', 'subscription'],
         backlog.in_flight),
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


async def record_metrics(
    settings: BrokerSettings,
    store: RedisStore,
    broker: Broker,
    backlog: BacklogSnapshot,
    liveness: Liveness,
) -> None:
    """Append one metric record per queue and subscription every interval (deltas + gauges).

    Each replica writes the records of the entities it saw activity on or has consumers of; the
    live replica with the smallest id also writes one for every other queue and subscription
    in Redis, idle or not (a dead-letter queue nobody reads, a backlog nobody consumes), so each
    appears every interval and only once for its idle part."""
    interval = settings.store.metrics_interval_seconds
    while True:
        await asyncio.sleep(interval)
        await backlog.refresh()  # the backlog at the end of the interval
        try:
            idle_too = await liveness.is_first_live()
        except StoreUnavailable:
            idle_too = False
        batch = metric_records(
            broker, backlog, settings.replica_id, int(interval * 1000), idle_too=idle_too
        )
        try:
            owners = await registry.declared_owners(store.client)  # resources declaring them
            batch = [registry.labelled(record, owners) for record in batch]
            await store.upkeep.append_records(
                [r.to_fields() for r in batch], settings.store.metrics_stream_length
            )
        except StoreUnavailable as exc:
            logger.warning('%d metric records lost: %s', len(batch), exc)


def metric_records(
    broker: Broker,
    backlog: BacklogSnapshot,
    replica: str,
    interval_ms: int,
    *,
    idle_too: bool = False,
) -> list[MetricRecord]:
    """This replica's records for the interval: every entity with activity or consumers here,
    and with IDLE_TOO every other queue and subscription the backlog snapshot knows."""
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
    return [
        MetricRecord.of(
            ts_ms=now_ms,
            interval_ms=interval_ms,
            replica=replica,
            address=address,
            subscription=subscription,
            counts=tallies.get((address, subscription), {}),
            consumers=consumers.get((address, subscription), 0),
            backlog=backlogs.get((address, subscription), -1),
            latency=latencies.get((address, subscription)),
        )
        for address, subscription in sorted(entities)
    ]
