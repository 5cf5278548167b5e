"""
The background chores of a replica: lease and watch renewal, reaping dead replicas, releasing
scheduled messages, rereading policies, trimming streams, sampling the loop's lag. Each runs
under ``supervised`` so a failure is seen at once and the chore starts again.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from shoal_broker.amqp.broker import Broker
from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.registry import BACKGROUND_FAILURES, LEASE_UP, LOOP_LAG, REDIS_UP
from shoal_broker.routing.policies import declared_duplicates, declared_last_values
from shoal_broker.routing.redelivery import Backoffs
from shoal_broker.running.backlog import BacklogSnapshot
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.replicas import Liveness

logger = logging.getLogger(__name__)

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


def start_supervised(
    chores: Mapping[str, Callable[[], Awaitable[None]]],
) -> list['asyncio.Task[None]']:
    """Start each named chore under ``supervised``, as a task of that name."""
    return [asyncio.create_task(supervised(name, run), name=name) for name, run in chores.items()]


WATCHES_PER_RENEWAL = 256
"""Watched addresses a lease renewal lists this replica under again (all of them within
ceil(n / 256) renewals); see RedisStore.assert_watches."""


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


async def assert_watches_forever(liveness: Liveness) -> None:
    """List this replica under its watched addresses again, a slice per lease interval."""
    interval = liveness.lease_ms / 3000
    while True:
        await asyncio.sleep(interval)
        try:
            await liveness.store.watching.assert_watches(WATCHES_PER_RENEWAL)
        except StoreUnavailable as exc:
            logger.warning('watchers not renewed: %s', exc)


LOOP_LAG_SAMPLE_SECONDS = 0.1


async def measure_loop_lag() -> None:
    """Feed ``shoal_event_loop_lag_seconds``: how late a 100 ms timer fires."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(LOOP_LAG_SAMPLE_SECONDS)
        LOOP_LAG.observe(max(0.0, loop.time() - start - LOOP_LAG_SAMPLE_SECONDS))


async def watch_others(liveness: Liveness) -> None:
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


SCHEDULE_TICK_SECONDS = 0.1
"""How often each replica moves due scheduled messages: delivery-time precision."""


async def release_scheduled(store: RedisStore) -> None:
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


async def refresh_policies(store: RedisStore, broker: Broker) -> None:
    """Hand the declared policies to the broker's subscriptions and the store's publish limits."""
    try:
        policies = await store.registry.policies()
    except StoreUnavailable as exc:
        BACKGROUND_FAILURES.labels('policies').inc()
        logger.error('declared policies not refreshed: %s', exc)
        return
    broker.apply_policies(policies)
    store.redelivery = Backoffs.of(policies, broker.settings.routing)
    store.upkeep.limit_address_backlogs({
        entity.removeprefix('queue:'): (policy.max_messages, policy.overflow.value)
        for entity, policy in policies.items()
        if entity.startswith('queue:') and policy.max_messages
    })  # fmt: skip
    defaults = broker.settings.duplicates
    store.messages.duplicates.set_per_address(declared_duplicates(policies, defaults))
    key_property = broker.settings.last_values.key_property
    store.messages.last_values.set_per_address(declared_last_values(policies, key_property))


async def refresh_policies_forever(store: RedisStore, broker: Broker) -> None:
    while True:
        await asyncio.sleep(POLICY_REFRESH_SECONDS)
        await refresh_policies(store, broker)


async def trim_forever(
    store: RedisStore, interval: float, liveness: Liveness, backlog: BacklogSnapshot
) -> None:
    """Trim every stream, when this is the live replica with the smallest id: trimming is the
    same walk over every address whoever does it, so one replica does it for all (another takes
    over within a lease when it dies), skipping the streams its latest backlog walk found
    nothing to trim in. Each replica tidies its own commit records."""
    while True:
        await asyncio.sleep(interval)
        try:
            first = await liveness.is_first_live()
            removed = await store.upkeep.trim(backlog.settled()) if first else 0
            await store.tidy_commits()
        except StoreUnavailable as exc:
            BACKGROUND_FAILURES.labels('trim').inc()
            logger.error('trim skipped: %s', exc)
        else:
            if removed:
                logger.debug('trimmed %d consumed entries', removed)
