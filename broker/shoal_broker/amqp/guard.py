"""
The broker's door: SASL on each new connection, connection/session/link limits, permissions.

Everything here is called from small hooks in ``connection.py``, ``connecting.py``,
``linking.py``, ``producing.py`` and ``attach.py`` so that the security decisions live in one
place. The pure parts (SCRAM, users file, permission
patterns) are in ``shoal_broker.security``; the SASL frames in ``amqp/sasl.py``.
"""

import asyncio
import collections
import logging
import os
import time
from typing import TYPE_CHECKING, Protocol

from shoal_broker.amqp import engine, sasl
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.links import ProducerLink
from shoal_broker.errors import (
    BrokerError,
    ResourceLimitExceeded,
    StoreCommandDenied,
    StoreFull,
    Unauthorized,
)
from shoal_broker.metrics import registry as metrics
from shoal_broker.metrics.registry import BACKGROUND_FAILURES
from shoal_broker.security.authenticator import Authenticator, AuthPolicy, Identity, UsersSource
from shoal_broker.security.permissions import Operation
from shoal_broker.settings import SecuritySettings

if TYPE_CHECKING:
    from shoal_broker.amqp.connection import AmqpConnection
    from shoal_broker.routing.storage import RegistryPort, UpkeepPort

MEMORY_SAMPLE_SECONDS = 0.5
STORE_MEMORY_SAMPLE_SECONDS = 0.1
STORE_LIMIT_RECHECK_SECONDS = 10.0
STORE_MEMORY_RETRY_SECONDS = 1.0
LOGIN_WINDOW_SECONDS = 60.0
"""The window ``max_failed_logins_per_minute`` counts in."""
MAX_THROTTLE_SOURCES = 10_000
"""Source addresses whose failed logins are remembered at once (the oldest are forgotten)."""
MEMORY_RELIEF = 0.9
"""Credit flows again once resident memory is below this fraction of the ceiling."""

logger = logging.getLogger(__name__)


class Producers(Protocol):
    """What the memory ceiling needs to give producers their credit back (``broker.Broker``)."""

    @property
    def connections(self) -> 'set[AmqpConnection]': ...

    def top_up(self, producer: ProducerLink) -> None: ...


class Guard:
    def __init__(self, settings: SecuritySettings, producers: Producers) -> None:
        self.settings = settings
        self.producers = producers
        users = UsersSource(settings.users_file) if settings.users_file else None
        self.authenticator = Authenticator(
            AuthPolicy(allow_anonymous=settings.allow_anonymous, users=users)
        )
        self.per_user: collections.Counter[str] = collections.Counter()
        self.created: collections.Counter[str] = collections.Counter()
        self._failed_logins: dict[str, collections.deque[float]] = {}
        """Source address -> times of its failed logins within the last minute."""
        """Addresses created on demand on this replica, per user (``check_creation_room``)."""
        self.admitted = 0
        self._sasl_timers: dict[int, asyncio.TimerHandle] = {}
        self._open_timers: dict[int, asyncio.TimerHandle] = {}
        """Each bound's timer, dropped once the bound is met (SASL done, Open in): a timer
        handle kept to its time or to the connection's end is ~0.4 KiB a connection."""
        self.memory_high = False
        """Resident memory is over the ceiling: producers get no credit (``Turns.top_up``)."""
        self.store_full: StoreFull | None = None
        """Redis is at its high watermark: publishes are refused with this error."""
        self.store_memory_denied: StoreCommandDenied | None = None
        """The Redis account may no longer sample memory: the watermark is off (``/readyz``)."""

    # -- connections ---------------------------------------------------------------------------

    def connection_made(self, conn: 'AmqpConnection', socket: asyncio.BaseTransport) -> None:
        conn.handshake = sasl.SaslHandshake(self.authenticator, certificate_name(socket))
        # A throttled address still gets our SASL header and mechanisms, and its sasl-init the
        # outcome sys-temp (amqp/sasl.py), so its client can tell "try later" from a network
        # fault; no credential is read or checked, and the SASL timeout bounds the wait.
        conn.handshake.throttled = self._throttled(source_host(socket))
        loop = asyncio.get_running_loop()
        self._sasl_timers[conn.id] = loop.call_later(
            self.settings.sasl_timeout_seconds, self._sasl_overdue, conn
        )
        if self.settings.open_timeout_seconds > 0:
            self._open_timers[conn.id] = loop.call_later(
                self.settings.open_timeout_seconds, self._open_overdue, conn
            )

    def opened(self, conn: 'AmqpConnection') -> None:
        """The peer's Open arrived: the open timeout no longer applies."""
        if (timer := self._open_timers.pop(conn.id, None)) is not None:
            timer.cancel()

    def handshake_input(self, conn: 'AmqpConnection', data: bytes) -> bytes:
        """Feed the SASL layer; return what belongs to proton (empty while SASL goes on)."""
        handshake = conn.handshake
        assert handshake is not None
        if handshake.failure is not None:  # bytes that were in flight when we hung up
            return b''
        step = handshake.receive(data)
        if step.output:
            conn.write_raw(step.output)
        if handshake.state is sasl.State.FAILED:
            # a throttled address is already told of once, by the WARNING that started it
            level = logging.DEBUG if handshake.throttled else logging.INFO
            logger.log(level, 'connection %d from %s refused: %s', conn.id, conn.peer,
                       handshake.failure)  # fmt: skip
            metrics.authentication_failed(handshake.mechanism, failure_reason(handshake, self))
            if handshake.credentials_refused:
                self._login_failed(conn)
            conn.hang_up()
            return b''
        if step.passthrough is None:
            return b''
        assert handshake.identity is not None
        conn.handshake = None
        if (timer := self._sasl_timers.pop(conn.id, None)) is not None:
            timer.cancel()
        self._admit(conn, handshake.identity)
        return step.passthrough

    def _admit(self, conn: 'AmqpConnection', identity: Identity) -> None:
        conn.identity = identity
        limit, per_user = self.settings.max_connections, self.settings.max_connections_per_user
        if limit and self.admitted >= limit:
            conn.refusal = ResourceLimitExceeded(
                f'this broker holds its limit of {limit} connections'
            )
        elif per_user and self.per_user[identity.name] >= per_user:
            conn.refusal = ResourceLimitExceeded(
                f'user {identity.name!r} holds its limit of {per_user} connections'
            )
        else:
            self.admitted += 1
            self.per_user[identity.name] += 1
            conn.counted = True
        logger.debug('connection %d authenticated as %r (%s)', conn.id, identity.name,
                     identity.mechanism)  # fmt: skip

    def connection_lost(self, conn: 'AmqpConnection') -> None:
        for timers in (self._sasl_timers, self._open_timers):
            if (timer := timers.pop(conn.id, None)) is not None:
                timer.cancel()
        if conn.counted and conn.identity is not None:
            conn.counted = False
            self.admitted -= 1
            self.per_user[conn.identity.name] -= 1
            if self.per_user[conn.identity.name] <= 0:
                del self.per_user[conn.identity.name]

    def _login_failed(self, conn: 'AmqpConnection') -> None:
        limit = self.settings.max_failed_logins_per_minute
        if not limit:
            return
        source = conn.peer.rpartition(':')[0]
        failures = self._failed_logins.pop(source, None) or collections.deque()
        self._failed_logins[source] = failures  # most recent last: the oldest are forgotten
        failures.append(time.monotonic())
        if len(failures) == limit:
            logger.warning('%d failed logins from %s within a minute: its connections are '
                           'refused until it has fewer', limit, source)  # fmt: skip
        while len(self._failed_logins) > MAX_THROTTLE_SOURCES:
            del self._failed_logins[next(iter(self._failed_logins))]

    def _throttled(self, source: str) -> bool:
        limit = self.settings.max_failed_logins_per_minute
        failures = self._failed_logins.get(source)
        if not limit or not failures:
            return False
        horizon = time.monotonic() - LOGIN_WINDOW_SECONDS
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            del self._failed_logins[source]
        return len(failures) >= limit

    def _sasl_overdue(self, conn: 'AmqpConnection') -> None:
        self._sasl_timers.pop(conn.id, None)
        if conn.alive and conn.handshake is not None:
            logger.info('connection %d from %s: SASL not finished in time', conn.id, conn.peer)
            metrics.authentication_failed(conn.handshake.mechanism, 'timeout')
            conn.abort()

    def _open_overdue(self, conn: 'AmqpConnection') -> None:
        self._open_timers.pop(conn.id, None)
        state = lib.pn_connection_state(conn.connection)
        if conn.alive and not state & (lib.PN_REMOTE_ACTIVE | lib.PN_REMOTE_CLOSED):
            logger.info('connection %d from %s: no Open in time', conn.id, conn.peer)
            conn.abort()

    # -- sessions and links --------------------------------------------------------------------

    def session_refused(self, conn: 'AmqpConnection', session: Ptr) -> bool:
        """True (and the session ended with the error) when the connection has too many."""
        limit = self.settings.max_sessions_per_connection
        if not limit:
            return False
        # sessions already answered or waiting for our Open (this one is neither yet)
        count = len(conn.pending_sessions)
        s = lib.pn_session_head(conn.connection, lib.PN_LOCAL_ACTIVE)
        while s != engine.NULL:
            count += 1
            s = lib.pn_session_next(s, lib.PN_LOCAL_ACTIVE)
        if count < limit:
            return False
        if not conn.opened.is_set():
            # proton never writes a Begin (or End) for a session answered before our Open, so
            # a peer pipelining this many sessions before it loses the whole connection
            conn.fail(ResourceLimitExceeded.condition, f'more than {limit} sessions before Open')
            return True
        engine.set_condition(
            lib.pn_session_condition(session),
            ResourceLimitExceeded.condition,
            f'a connection may have at most {limit} sessions',
        )
        lib.pn_session_open(session)
        lib.pn_session_close(session)
        return True

    def link_refusal(self, conn: 'AmqpConnection', link: Ptr) -> BrokerError | None:
        limit = self.settings.max_links_per_session
        if not limit or len(conn.links) < limit:  # no session can be at the limit: no walk of
            return None  # the links per attach, which made a burst of attaches quadratic
        session = lib.pn_link_session(link)
        count = sum(1 for ptr in conn.links if lib.pn_link_session(ptr) == session)
        if count < limit:
            return None
        return ResourceLimitExceeded(f'a session may have at most {limit} links')

    async def check_subscription_room(
        self, registry: 'RegistryPort', address: str, group: str
    ) -> None:
        """Refuse a subscription that would exceed ``max_subscriptions_per_topic``. Checked, not
        reserved: attaches racing on several replicas may pass it together."""
        limit = self.settings.max_subscriptions_per_topic
        if limit and not await registry.subscription_room(address, group, limit):
            raise ResourceLimitExceeded(f'topic {address!r} has its limit of {limit} subscriptions')

    def check_creation_room(self, user: str) -> None:
        """Refuse an address created on demand past the user's limit on this replica."""
        limit = self.settings.max_auto_created_addresses_per_user
        if limit and self.created[user] >= limit:
            raise ResourceLimitExceeded(
                f'user {user!r} has had its limit of {limit} addresses created on demand'
            )

    def address_created(self, user: str) -> None:
        self.created[user] += 1

    # -- memory --------------------------------------------------------------------------------

    def watch_memory(self) -> None:
        """Sample resident memory; over the ceiling, withhold producer credit (back-pressure
        rather than an out-of-memory kill); below 90 % of it, give credit back."""
        ceiling = self.settings.memory_ceiling_mb * 1024 * 1024
        if not ceiling:
            return
        loop = asyncio.get_running_loop()
        producers = self.producers

        def sample() -> None:
            rss = resident_bytes()
            if not self.memory_high and rss > ceiling:
                self.memory_high = True
                logger.warning('resident memory %d MiB over the ceiling: producers paused',
                               rss >> 20)  # fmt: skip
            elif self.memory_high and rss < ceiling * MEMORY_RELIEF:
                self.memory_high = False
                logger.warning('resident memory %d MiB: producers resume', rss >> 20)
                for conn in list(producers.connections):
                    for state in list(conn.links.values()):
                        if isinstance(state, ProducerLink) and state.opened and state.alive:
                            producers.top_up(state)
            loop.call_later(MEMORY_SAMPLE_SECONDS, sample)

        sample()

    async def watch_store_memory(self, upkeep: 'UpkeepPort') -> None:
        """Refuse publishes while Redis is above its high watermark (runs until cancelled)."""
        watermark = self.settings.redis_memory_high_watermark
        if watermark <= 0:
            return
        failing = False
        while True:
            try:
                used, limit = await upkeep.memory()
            except BrokerError as exc:
                BACKGROUND_FAILURES.labels('store_memory').inc()
                if isinstance(exc, StoreCommandDenied):
                    self.store_memory_denied = exc
                if not failing:
                    logger.error('Redis memory not sampled, the watermark is off: %s', exc)
                failing, limit = True, 0
            else:
                if failing:
                    logger.warning('Redis memory sampled again: the watermark is on')
                failing, self.store_memory_denied = False, None
                full = bool(limit) and used >= limit * watermark
                if full and self.store_full is None:
                    logger.warning('Redis uses %d of its %d bytes: refusing messages', used, limit)
                    self.store_full = StoreFull(
                        f'the message store is full ({used >> 20} of {limit >> 20} MiB used)',
                        'redis_watermark',
                    )
                elif not full and self.store_full is not None:
                    logger.warning('Redis memory below the watermark again: accepting messages')
                    self.store_full = None
            # without a maxmemory there is nothing to watch: look again now and then in case
            # one is configured at run time
            if limit:
                await asyncio.sleep(STORE_MEMORY_SAMPLE_SECONDS)
            else:
                await asyncio.sleep(
                    STORE_MEMORY_RETRY_SECONDS if failing else STORE_LIMIT_RECHECK_SECONDS
                )

    # -- permissions ---------------------------------------------------------------------------

    def refusal(
        self, conn: 'AmqpConnection', operation: Operation, address: str
    ) -> Unauthorized | None:
        identity = conn.identity
        if identity is None or identity.permissions is None:
            return None
        if identity.permissions.allows(operation, address):
            return None
        return Unauthorized(f'user {identity.name!r} may not {operation} {address!r}')

    def authorize(self, conn: 'AmqpConnection', operation: Operation, address: str) -> None:
        error = self.refusal(conn, operation, address)
        if error is not None:
            metrics.AUTHORIZATION_FAILURES.labels(operation).inc()
            raise error


def user_name(conn: 'AmqpConnection') -> str:
    """The authenticated user of a connection ('' before SASL has finished)."""
    return conn.identity.name if conn.identity is not None else ''


def resident_bytes() -> int:
    """This process's resident set size (Linux ``/proc``)."""
    with open('/proc/self/statm', encoding='ascii') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def source_host(socket: asyncio.BaseTransport) -> str:
    """The peer's address without its port (what failed logins are counted by)."""
    peer = socket.get_extra_info('peername')
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


def certificate_name(socket: asyncio.BaseTransport) -> str | None:
    """The verified client certificate's subject CN (the SASL EXTERNAL identity), if any."""
    ssl_object = socket.get_extra_info('ssl_object')
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get('subject', ()):
        for key, value in rdn:
            if key == 'commonName':
                return str(value)
    return None


def failure_reason(handshake: sasl.SaslHandshake, guard: Guard) -> str:
    """Why a SASL exchange failed, from a closed set (a metric label): ``throttled`` (the source
    address failed too many logins), ``protocol_header`` (no SASL header, or none without
    ANONYMOUS), ``malformed`` frames or responses, a ``mechanism`` not offered, or the
    ``credentials`` (unknown user, wrong password or certificate: what the throttle counts)."""
    if handshake.throttled:
        return 'throttled'
    if handshake.failure_code is None:
        return 'protocol_header'
    if handshake.credentials_refused:
        return 'credentials'
    offered = guard.authenticator.mechanisms(handshake.certificate_name)
    if handshake.failure_code is sasl.Code.AUTH and handshake.mechanism not in offered:
        return 'mechanism'
    return 'malformed'
