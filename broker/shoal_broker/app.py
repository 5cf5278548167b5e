"""
The composition root: Redis (embedded or not), the store, the AMQP node, the listeners.

Owns the process lifecycle. On SIGTERM (what Kubernetes sends, after the preStop hook) the broker
stops accepting and drains (``running/draining.py``: each connection is closed with
``amqp:connection:forced`` once its sends are answered and its deliveries settled, within
``SHOAL_CONNECTION_DRAIN_SECONDS``), closes what is left the same way, returns what it still
holds to the store, waits (bounded) for in-flight store work, then stops Redis if it started
it. What runs beside the AMQP node (background chores, gauges, metric records, the TLS
listener) lives in ``running/``.
"""

import asyncio
import contextlib
import gc
import importlib
import logging
import resource
import signal
import sys
import uuid
from importlib import metadata

from shoal_broker.amqp.broker import Broker
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.selector_offload import SWITCH_INTERVAL_SECONDS
from shoal_broker.errors import StoreCommandDenied, StoreUnavailable
from shoal_broker.health import HealthServer, WebPort
from shoal_broker.management.access import Access
from shoal_broker.management.control import Control
from shoal_broker.management.operations import Operations
from shoal_broker.metrics.registry import (
    BACKGROUND_FAILURES,
    LEASE_UP,
    REDIS_UP,
    cap_address_series,
    cap_consumer_link_series,
    refusals_at_zero,
    register_counters,
    register_gauges,
)
from shoal_broker.routing.redelivery import Backoffs
from shoal_broker.routing.storage import UpkeepPort
from shoal_broker.running import chores, draining
from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.running.listeners import LISTEN_BACKLOG, listen_tls, split_host_port
from shoal_broker.running.reporting import broker_gauges, record_metrics, store_counters
from shoal_broker.security.tls import redis_url_with_ca
from shoal_broker.settings import BrokerSettings, Durability
from shoal_broker.stopping import cancel_and_wait
from shoal_broker.store.duplicates import window_of
from shoal_broker.store.embedded import EmbeddedRedis
from shoal_broker.store.management import StoreAdmin
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.replicas import LeaseKeeper, Liveness

logger = logging.getLogger(__name__)


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
    # an applied commit waits as long as a held send for a replica to confirm it
    store.messages.transactions.confirm_seconds = settings.store.hold_seconds
    # and an acknowledgement is sent again as long (replicated durability: store/acks.py)
    store.messages.acks.confirm_seconds = settings.store.hold_seconds
    store.messages.confirming.confirm_seconds = settings.store.hold_seconds  # and a fetch
    store.messages.big_body_bytes = settings.store.big_message_bytes or sys.maxsize  # bodies.py
    await store.start()
    await store.check_durability()
    store.upkeep.limit_backlog(
        settings.security.max_backlog_per_address, settings.security.backlog_overflow.value
    )
    store.messages.duplicates.everywhere = window_of(settings.duplicates)
    store.redelivery = Backoffs.of({}, settings.routing)  # a dead replica's, until policies come
    store.messages.last_values.configure(settings.last_values)
    await _check_memory_watch(store.upkeep, settings.security.redis_memory_high_watermark)
    token = uuid.uuid4().hex
    liveness = Liveness(store, settings.replica_id, token, settings.store.lease_seconds)
    await liveness.join()
    broker = Broker(settings, store, version())
    stop = asyncio.Event()
    lease = LeaseKeeper(
        url, settings.replica_id, token, settings.store.lease_seconds,
        chores.lease_reporter(liveness, broker, stop),
    )  # fmt: skip
    lease.start()
    broker.guard.watch_memory()
    await chores.refresh_policies(store, broker)  # declared policies apply from the first attach
    host, port = split_host_port(settings.amqp.listen)
    server = await loop.create_server(
        lambda: AmqpConnection(broker), host, port, backlog=LISTEN_BACKLOG, reuse_address=True
    )
    tls_servers, tls_tasks = await listen_tls(settings, broker)
    admin = StoreAdmin.from_url(url)
    control = Control(admin, broker, settings.replica_id)
    await control.refresh_pauses()  # paused before a restart: paused from the first attach
    health: HealthServer | None = None
    if settings.http:

        async def readiness() -> dict[str, bool | int | float]:
            return {
                'accepting': broker.accepting,
                'redis': await store.ping(),
                'store_memory_watch': broker.guard.store_memory_denied is None,
                # figures, not checks: sends held through a store outage (amqp/holding.py)
                'held_sends': broker.holding.count,
                'held_sends_oldest_seconds': round(broker.holding.oldest_seconds(), 3),
            }

        operations = Operations(admin, store.upkeep.backlog_limit)
        access = Access(broker.guard.authenticator, settings.security.management_credentials_dir)

        async def web_port() -> WebPort:
            # aiohttp is imported by the first request that is not a probe (health.py), in a
            # worker thread: ~0.2 s of imports the loop would otherwise wait for in one piece
            await asyncio.to_thread(importlib.import_module, 'shoal_broker.management.webport')
            from shoal_broker.management.webport import AiohttpPort

            return await AiohttpPort.start(readiness, operations, access)

        health = HealthServer(readiness, web_port)
        await health.start(*split_host_port(settings.http))
        logger.info('web console at http://%s/console/', settings.http)
    backlog = BacklogSnapshot(
        url, settings.store.backlog_refresh_seconds, shared=store.upkeep,
        walks=liveness.is_first_live,
    )  # fmt: skip
    cap_address_series(settings.security.metrics_max_addresses)
    cap_consumer_link_series(settings.security.metrics_max_consumer_links)
    register_gauges(lambda: broker_gauges(broker, backlog))
    register_counters(lambda: store_counters(store))
    LEASE_UP.set(1)
    REDIS_UP.set(1)
    tune_garbage_collector()
    tasks = {
        'trim': lambda: chores.trim_forever(
            store, settings.store.trim_interval_seconds, liveness, backlog
        ),
        'watches': lambda: chores.assert_watches_forever(liveness),
        'loop_lag': chores.measure_loop_lag,
        'reaping': lambda: chores.watch_others(liveness),
        'scheduled': lambda: chores.release_scheduled(store),
        'policies': lambda: chores.refresh_policies_forever(store, broker),
        'backlog': lambda: backlog.refresh_forever(),
        'store_memory': lambda: broker.guard.watch_store_memory(store.upkeep),
        'management': control.run_forever,
    }
    if settings.store.metrics_interval_seconds > 0:
        tasks['metric_records'] = lambda: record_metrics(settings, store, broker, backlog, liveness)
    refusals_at_zero()
    for task in (*tasks, 'lease'):  # the lease is renewed by its own thread (LeaseKeeper)
        BACKGROUND_FAILURES.labels(task)
    background = [*tls_tasks, *chores.start_supervised(tasks)]
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
    await draining.drain(broker, settings.connection_drain_seconds)
    broker.close_all(draining.CLOSE_CONDITION, draining.CLOSE_DESCRIPTION)  # what is left
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
    await admin.close()
    await store.close()
    await asyncio.to_thread(broker.close_tracing)
    logger.info('stopped')
    return 0


async def _check_memory_watch(upkeep: UpkeepPort, watermark: float) -> None:
    """Refuse to start when the Redis account cannot sample memory while a watermark is asked
    for: the broker would otherwise accept messages until Redis's own maxmemory."""
    if watermark <= 0:
        return
    try:
        await upkeep.memory()
    except StoreCommandDenied as exc:
        raise StoreCommandDenied(
            exc.command,
            'SHOAL_REDIS_MEMORY_HIGH_WATERMARK needs it to sample Redis memory; grant it '
            f'(+{exc.command.lower()}) or set the watermark to 0 to run without one',
        ) from exc


def _redacted(url: str) -> str:
    if '@' in url:
        scheme, _, rest = url.partition('://')
        return f'{scheme}://***@{rest.rpartition("@")[2]}'
    return url
