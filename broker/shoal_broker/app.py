"""
The composition root: Redis (embedded or not), the store, the AMQP node, the listeners.

Owns the process lifecycle. On SIGTERM (what Kubernetes sends, after the preStop hook) the broker
stops accepting, returns what it holds for consumers to the store, closes every connection with
``amqp:connection:forced`` so clients fail over, waits (bounded) for in-flight store work, then
stops Redis if it started it.
"""

import asyncio
import contextlib
import gc
import logging
import math
import resource
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from importlib import metadata

from shoal_broker import selector
from shoal_broker.amqp.broker import Broker
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.selector_offload import SWITCH_INTERVAL_SECONDS
from shoal_broker.errors import StoreCommandDenied, StoreUnavailable
from shoal_broker.health import HealthServer
from shoal_broker.metrics.records import MetricRecord
from shoal_broker.metrics.registry import (
    BACKGROUND_FAILURES,
    LEASE_UP,
    LOOP_LAG,
    PRODUCERS_BLOCKED,
    PRODUCERS_BLOCKED_HELP,
    REDIS_RECONNECTS,
    REDIS_RECONNECTS_HELP,
    REDIS_UP,
    SENTINEL_SWITCHES,
    SENTINEL_SWITCHES_HELP,
    cap_address_series,
    cap_consumer_link_series,
    register_counters,
    register_gauges,
    subscription_label,
)
from shoal_broker.security.tls import ServerTls, redis_url_with_ca
from shoal_broker.settings import BrokerSettings, Durability
from shoal_broker.stopping import cancel_and_wait
from shoal_broker.store import connect, registry
from shoal_broker.store.embedded import EmbeddedRedis
from shoal_broker.store.inspect import Inspector
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.replicas import LeaseKeeper, Liveness

logger = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024


def split_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a pair."""
    host, sep, port = value.rpartition(':')
    if not sep or not port.isdigit():
        raise ValueError(f'expected HOST:PORT, got {value!r}')
    return host.strip('[]') or '0.0.0.0', int(port)


def version() -> str:
    try:
        return metadata.version('shoal')
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return '0+unknown'


def raise_file_limit() -> None:
    """Each connection is a file descriptor; the default soft limit (often 1024) is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between young-generation collections (CPython's default is 700)."""


def tune_garbage_collector() -> None:
    """Messages are short-lived and acyclic, so reference counting frees them; the cyclic
    collector mostly re-scans long-lived state (~11 % of broker CPU under load, measured in
    docs/performance.md#garbage-collector). Freeze what exists after start-up and collect young
    objects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


async def serve(settings: BrokerSettings) -> int:
    """Run the broker until SIGTERM or SIGINT; return the process exit code."""
    raise_file_limit()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)  # see amqp/selector_offload.py
    embedded: EmbeddedRedis | None = None
    url = settings.store.redis_url
    if url is None:
        fsync = settings.store.durability is Durability.FSYNC
        embedded = EmbeddedRedis(
            settings.store.data_dir, appendfsync='always' if fsync else 'everysec'
        )
        await embedded.start()
        url = embedded.url
    try:
        return await _serve_with_store(settings, url)
    finally:
        if embedded is not None:
            embedded.stop()


async def _serve_with_store(settings: BrokerSettings, url: str) -> int:
    loop = asyncio.get_running_loop()
    url = redis_url_with_ca(url, settings.security.redis_ca_file)
    store = RedisStore.from_url(
        url, settings.replica_id, settings.store.durability, settings.store.replication_timeout_ms
    )
    await store.start()
    await store.check_durability()
    store.upkeep.limit_backlog(
        settings.security.max_backlog_per_address, settings.security.backlog_overflow.value
    )
    await _check_memory_watch(store, settings.security.redis_memory_high_watermark)
    token = uuid.uuid4().hex
    liveness = Liveness(store, settings.replica_id, token, settings.store.lease_seconds)
    await liveness.join()
    broker = Broker(settings, store, version())
    stop = asyncio.Event()
    lease = LeaseKeeper(
        url, settings.replica_id, token, settings.store.lease_seconds,
        lease_reporter(liveness, broker, stop),
    )  # fmt: skip
    lease.start()
    broker.guard.watch_memory()
    await _refresh_policies(store, broker)  # declared policies apply from the first attach
    host, port = split_host_port(settings.amqp.listen)
    server = await loop.create_server(
        lambda: AmqpConnection(broker), host, port, backlog=LISTEN_BACKLOG, reuse_address=True
    )
    tls_servers, tls_tasks = await _listen_tls(settings, broker)
    health: HealthServer | None = None
    if settings.http:

        async def readiness() -> dict[str, bool]:
            return {
                'accepting': broker.accepting,
                'redis': await store.ping(),
                'store_memory_watch': broker.guard.store_memory_denied is None,
            }

        health = HealthServer(readiness)
        await health.start(*split_host_port(settings.http))
    backlog = BacklogSnapshot(url, settings.store.backlog_refresh_seconds)
    cap_address_series(settings.security.metrics_max_addresses)
    cap_consumer_link_series(settings.security.metrics_max_consumer_links)
    register_gauges(lambda: broker_gauges(broker, backlog))
    register_counters(lambda: store_counters(store))
    LEASE_UP.set(1)
    REDIS_UP.set(1)
    tune_garbage_collector()
    tasks = {
        'trim': lambda: _trim_forever(store, settings.store.trim_interval_seconds),
        'watches': lambda: _assert_watches_forever(liveness),
        'loop_lag': _measure_loop_lag,
        'reaping': lambda: _watch_others(liveness),
        'scheduled': lambda: _release_scheduled(store),
        'policies': lambda: _refresh_policies_forever(store, broker),
        'backlog': lambda: backlog.refresh_forever(),
        'store_memory': lambda: broker.guard.watch_store_memory(store),
    }
    if settings.store.metrics_interval_seconds > 0:
        tasks['metric_records'] = lambda: _record_metrics(
            settings, store, broker, backlog, liveness
        )
    background = [
        *tls_tasks,
        *(asyncio.create_task(supervised(name, run), name=name) for name, run in tasks.items()),
    ]
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logger.info(
        'shoal broker %s (replica %s) listening on %s, redis %s',
        version(), settings.replica_id, settings.amqp.listen, _redacted(url),
    )  # fmt: skip
    await stop.wait()
    logger.info('shutting down')
    for listener in (server, *tls_servers):
        listener.close()
    broker.close_all('amqp:connection:forced', 'broker is shutting down')
    await asyncio.sleep(0.05)  # let the Close frames reach the sockets
    for conn in list(broker.connections):
        conn.abort()
    await broker.settle_down(settings.shutdown_grace_seconds / 2)
    try:
        await asyncio.wait_for(store.flush(), settings.shutdown_grace_seconds)
    except TimeoutError:
        logger.warning('in-flight store work did not finish within the grace period')
    await cancel_and_wait(background)
    await asyncio.to_thread(lease.stop)
    try:
        await liveness.leave()
    except StoreUnavailable as exc:
        logger.warning('could not release the lease (others will reap this replica): %s', exc)
    if health is not None:
        await health.close()
    await backlog.close()
    await store.close()
    logger.info('stopped')
    return 0


async def _listen_tls(
    settings: BrokerSettings, broker: Broker
) -> tuple[list[asyncio.AbstractServer], list['asyncio.Task[None]']]:
    """The ``amqps`` acceptor, if configured, and the task that reloads its certificate when
    the files change (SIGHUP reloads at once)."""
    if not settings.security.tls_listen:
        return [], []
    tls = ServerTls(settings.security)
    loop = asyncio.get_running_loop()
    host, port = split_host_port(settings.security.tls_listen)
    server = await loop.create_server(
        lambda: AmqpConnection(broker), host, port, backlog=LISTEN_BACKLOG, reuse_address=True,
        ssl=tls.context,
    )  # fmt: skip
    loop.add_signal_handler(signal.SIGHUP, lambda: tls.reload(only_if_changed=False))
    logger.info('amqps listening on %s', settings.security.tls_listen)

    async def watch() -> None:
        while True:
            await asyncio.sleep(settings.security.tls_reload_interval_seconds)
            tls.reload(only_if_changed=True)

    return [server], [asyncio.create_task(watch())]


BACKGROUND_RESTART_SECONDS = 1.0


async def supervised(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run a background task to its end; should it fail, say so at once (ERROR and
    ``shoal_background_task_failures_total{task}``) and start it again after a pause, rather
    than let it die unseen until shutdown."""
    while True:
        try:
            await run()
            return
        except Exception:
            BACKGROUND_FAILURES.labels(name).inc()
            logger.exception('background task %s failed: restarting it', name)
        await asyncio.sleep(BACKGROUND_RESTART_SECONDS)


async def _check_memory_watch(store: RedisStore, watermark: float) -> None:
    """Refuse to start when the Redis account cannot sample memory while a watermark is asked
    for: the broker would otherwise accept messages until Redis's own maxmemory."""
    if watermark <= 0:
        return
    try:
        await store.upkeep.memory()
    except StoreCommandDenied as exc:
        raise StoreCommandDenied(
            exc.command,
            'SHOAL_REDIS_MEMORY_HIGH_WATERMARK needs it to sample Redis memory; grant it '
            f'(+{exc.command.lower()}) or set the watermark to 0 to run without one',
        ) from exc


WATCHES_PER_RENEWAL = 256
"""Watched addresses a lease renewal lists this replica under again (all of them within
ceil(n / 256) renewals); see Watching.assert_watches."""


def lease_reporter(
    liveness: Liveness, broker: Broker, stop: asyncio.Event
) -> Callable[[str, Exception | None], None]:
    """What the loop does with each lease renewal (made by LeaseKeeper's thread). Renewed late
    but not reaped: serve on. Lapsed and reaped (or being reaped): other replicas may have
    taken over this one's work, so drop every connection (clients reconnect and register
    afresh) rather than act on stale registrations. Taken by another process: stop."""

    def report(state: str, error: Exception | None) -> None:
        if error is not None:
            BACKGROUND_FAILURES.labels('lease').inc()
            REDIS_UP.set(0)
            logger.error('lease not renewed: %s', error)
            return
        REDIS_UP.set(1)
        LEASE_UP.set(1 if state in ('renewed', 'late') else 0)
        if state == 'late':
            logger.warning('lease renewed after it expired; no replica had reaped this one')
        elif state == 'lost':
            logger.error('lease lapsed: closing every connection so clients start afresh')
            broker.close_all(
                'amqp:connection:forced', 'broker replica lost its lease', stop_accepting=False
            )
        elif state == 'taken':
            logger.critical('another process took replica id %s: stopping', liveness.replica_id)
            stop.set()

    return report


async def _assert_watches_forever(liveness: Liveness) -> None:
    """List this replica under its watched addresses again, a slice per lease interval."""
    interval = liveness.lease_ms / 3000
    while True:
        await asyncio.sleep(interval)
        try:
            await liveness.store.watching.assert_watches(WATCHES_PER_RENEWAL)
        except StoreUnavailable as exc:
            logger.warning('watchers not renewed: %s', exc)


LOOP_LAG_SAMPLE_SECONDS = 0.1


async def _measure_loop_lag() -> None:
    """Feed ``shoal_event_loop_lag_seconds``: how late a 100 ms timer fires."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(LOOP_LAG_SAMPLE_SECONDS)
        LOOP_LAG.observe(max(0.0, loop.time() - start - LOOP_LAG_SAMPLE_SECONDS))


async def _watch_others(liveness: Liveness) -> None:
    """Reap replicas whose leases expired (about once a second)."""
    interval = min(1.0, liveness.lease_ms / 5000)
    while True:
        await asyncio.sleep(interval)
        try:
            for dead in await liveness.dead_replicas():
                await liveness.reap(dead)
        except StoreUnavailable as exc:
            BACKGROUND_FAILURES.labels('reaping').inc()
            logger.error('reaping skipped: %s', exc)


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


async def _record_metrics(
    settings: BrokerSettings,
    store: RedisStore,
    broker: Broker,
    backlog: 'BacklogSnapshot',
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
    backlog: 'BacklogSnapshot',
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


SCHEDULE_TICK_SECONDS = 0.1
"""How often each replica moves due scheduled messages: delivery-time precision."""


async def _release_scheduled(store: RedisStore) -> None:
    """Publish delayed messages when their delivery time comes (any live replica does it)."""
    while True:
        await asyncio.sleep(SCHEDULE_TICK_SECONDS)
        try:
            await store.upkeep.release_due(int(time.time() * 1000))
        except StoreUnavailable as exc:
            logger.warning('scheduled messages not moved: %s', exc)


POLICY_REFRESH_SECONDS = 2.0
"""How often each replica rereads the declared policies (``keys.POLICIES``): a changed or new
Queue/SharedSubscription ``delivery{}``/``retention{}`` reaches every live replica within this."""


async def _refresh_policies(store: RedisStore, broker: Broker) -> None:
    """Hand the declared policies to the broker's subscriptions and the store's publish limits."""
    try:
        policies = await store.registry.policies()
    except StoreUnavailable as exc:
        BACKGROUND_FAILURES.labels('policies').inc()
        logger.error('declared policies not refreshed: %s', exc)
        return
    broker.apply_policies(policies)
    store.upkeep.limit_address_backlogs({
        entity.removeprefix('queue:'): (policy.max_messages, policy.overflow.value)
        for entity, policy in policies.items()
        if entity.startswith('queue:') and policy.max_messages
    })  # fmt: skip


async def _refresh_policies_forever(store: RedisStore, broker: Broker) -> None:
    while True:
        await asyncio.sleep(POLICY_REFRESH_SECONDS)
        await _refresh_policies(store, broker)


async def _trim_forever(store: RedisStore, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            removed = await store.upkeep.trim()
        except StoreUnavailable as exc:
            BACKGROUND_FAILURES.labels('trim').inc()
            logger.error('trim skipped: %s', exc)
        else:
            if removed:
                logger.debug('trimmed %d consumed entries', removed)


def _redacted(url: str) -> str:
    if '@' in url:
        scheme, _, rest = url.partition('://')
        return f'{scheme}://***@{rest.rpartition("@")[2]}'
    return url
