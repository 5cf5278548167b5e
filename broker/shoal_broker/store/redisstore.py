"""
The Redis store: every message, subscription and in-flight delivery of the cluster.

Per-message operations (publish, fetch, ack, release) are queued and sent as one pipeline per
cycle: while pipelines are in flight, the next one fills up, so the batch grows with load and
there is never one round trip per message (DESIGN.md §3). Up to ``PIPELINES_IN_FLIGHT``
pipelines are in flight at a time, all on one connection (``lane.py``): Redis applies them in
the order they were written, which keeps one producer's messages in order, and nothing is
accepted before its pipeline's reply. Multi-key changes that must be atomic are Lua scripts in
``lua/`` (one file per operation, KEYS and ARGV documented in its header).

Wake-ups: a cycle that added or returned entries publishes one notification per address; other
replicas with hungry consumers fetch on it instead of polling. A replica with consumers of an
address lists itself in the address's watchers, after subscribing to its channel and before
looking once more, so the notification is sent only when another replica is listening.

Only this package imports redis; Redis failures become ``StoreUnavailable``.
"""

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import (
    AddressNotFound,
    BrokerError,
    NotAllowed,
    ResourceLimitExceeded,
    ResourceLocked,
    StoreCommandDenied,
    StoreFull,
    StoreUnavailable,
)
from shoal_broker.metrics.registry import PRIVATE_LABEL, REDIS_ROUND_TRIP
from shoal_broker.routing.jms_subscriptions import SubscriptionKey, SubscriptionSpec
from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.routing.storage import (
    NORMAL_BAND,
    BrowseCursor,
    ClaimCallback,
    Entry,
    Fetched,
    JoinOutcome,
    Notify,
    OutgoingMessage,
    PublishCallback,
    T,
)
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.stopping import cancel_and_wait
from shoal_broker.store import connect, keys, scripts
from shoal_broker.store.lane import BULK_HEADS, CRLF, Encoded, Lane, encode
from shoal_broker.store.notifications import NotificationReader

logger = logging.getLogger(__name__)

_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
SCRIPTS = (
    'publish', 'create_address', 'create_group', 'delete_group', 'fetch', 'browse', 'trim',
    'join', 'leave', 'unsubscribe', 'release_client', 'release_clients', 'reclaim',
    'reap_consumers', 'renew_lease', 'schedule', 'release_due', 'publish_limited', 'notify',
    'publish_claim',
)  # fmt: skip


MAX_REDIS_CONNECTIONS = 64
"""Redis connections per replica: the pipeline, the notification channel and cold-path calls."""

NOTIFICATION_IDLE_SECONDS = 30.0
"""A notification channel quiet this long is pinged; quiet for twice as long, it is dead."""

POOL_WAIT_SECONDS = 20.0
"""How long a Redis call waits for a free connection before it fails."""

PIPELINES_IN_FLIGHT = 4
"""Per-message pipelines sent but not yet answered. One left the broker idle for every round
trip (73 % CPU at saturation); more than a few only shrinks the batches
(docs/performance.md#store-lane)."""

BULK_FETCH_ENTRIES = 16
"""A fetch this big, with nothing returned or high-band in it, makes the next fetches of its
subscription read the normal band directly (``_fetch_op``), until one finds returned or
high-band entries or comes back short and smaller. An empty fetch says nothing (under load it
finds the stream just drained), nor does a full small one (it was asked for little: credit)."""

GIVE_BACK_MAX_PAUSE = 2.0
"""Longest pause between attempts to return entries a fetch in bulk must not deliver."""

TRIM_STEP_ENTRIES = 1000
"""Entries one trim.lua call may remove (whole stream nodes): ~0.25 ms of Redis for 1 KiB
messages, where one exact trim of a 100 000-entry backlog held it for 25 ms."""

MAX_TRIM_STEPS = 1000
"""Steps per stream and trim pass; what is left waits for the next pass."""

MAX_BULK_FETCHES = 10_000
"""Bound on the subscriptions remembered as fetching in bulk (each is dropped by its next small
fetch; one deleted mid-burst would otherwise stay)."""

ACK_COALESCE_SECONDS = 0.002
"""How long an ack waits for a pipeline to ride along with. Under load every cycle carries acks
anyway; at a trickle (1 000 msg/s) each ack otherwise paid a pipeline and two wake-ups of its own
(docs/performance.md#ack-coalescing), while the next publish comes within a millisecond. An ack
still queued when the replica dies only means a redelivery, which at-least-once allows."""

UNCONFIRMED_WARNING_SECONDS = 10.0
"""At most one warning this often while no Redis replica confirms writes (``replicated``)."""

PARTS_PER_MESSAGE = 7
"""A published message's script arguments as encoded parts: the header's bulk-string head,
the header, CRLF, the same three for the rest, and the expiry and origin, encoded together."""

MAX_CACHED_TAILS = 4096
"""Encoded (no expiry, origin) pairs kept (``RedisStore._encoded``): one per producing
connection, so the cache is cleared when it fills rather than grown."""


@dataclasses.dataclass(slots=True)
class _Op:
    """Commands queued for the next pipeline and what to do with their replies."""

    commands: list[tuple[Any, ...]]
    finish: Callable[[list[Any]], Any]
    future: asyncio.Future[Any] | None
    """Resolved with the outcome; None when ``callback`` gets it instead."""
    notify: str | None = None
    """Address to announce to other replicas once the commands succeeded."""
    notify_local: bool = False
    """Also wake this replica's own consumers of ``notify`` (returned entries)."""
    batch: tuple[Any, ...] | None = None
    """Ops with the same key are merged into one command per cycle (publish, ack)."""
    batch_args: Sequence[Any] = ()
    callback: Callable[[Any, BrokerError | None], None] | None = None
    """Called with (result, None) or (None, error) as the replies are read: a future and its
    scheduled callback cost ~4 µs per message (``publish_then``)."""
    answered: bool = False

    def done(self) -> bool:
        return self.answered or (self.future is not None and self.future.done())

    def resolve(self, value: Any) -> None:
        self.answered = True
        if self.callback is not None:
            try:  # _call_back written out: this runs once per message
                self.callback(value, None)
            except Exception:
                logger.exception('store callback failed')
        elif self.future is not None:
            self.future.set_result(value)

    def reject(self, error: BrokerError) -> None:
        self.answered = True
        if self.callback is not None:
            _call_back(self.callback, None, error)
        elif self.future is not None:
            self.future.set_exception(error)


def _call_back(callback: Callable[[Any, BrokerError | None], None], value: Any,
               error: BrokerError | None) -> None:  # fmt: skip
    try:
        callback(value, error)
    except Exception:  # like an asyncio callback: logged, and the other ops still settle
        logger.exception('store callback failed')


def _no_result(replies: list[Any]) -> None:
    return None


class _Tokens:
    """The tokens of the messages batched into one publish op, in their order, and the one
    callback that answers them all: one op per address and band per cycle, not one per message
    (an op, its finisher and its settling were ~2 µs per message; a callback per message ~1 µs)."""

    __slots__ = ('args', 'callback', 'tokens')

    def __init__(
        self, callback: PublishCallback[Any] | ClaimCallback[Any], token: Any, args: list[Any]
    ) -> None:
        self.callback = callback
        self.tokens = [token]
        self.args = args
        """The op's ``batch_args``: each message's four script arguments (header, rest, expiry
        and origin), encoded as PARTS_PER_MESSAGE parts (``RedisStore._encoded``)."""

    def __call__(self, value: Any, error: BrokerError | None) -> None:
        self.callback(self.tokens, value, error)


_Unit = tuple[list[tuple[Any, ...]], list[_Op]]
"""Commands sent together and the ops their replies belong to."""


class RedisStore:
    """Implements ``routing.storage.MessageStore`` on one Redis (or a Redis Cluster slot set)."""

    _backlog: tuple[int, str] | None = None
    """(limit, overflow policy) of every address's backlog; None = unlimited (limit_backlog)."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        replica_id: str,
        durability: Durability = Durability.MEMORY,
        replication_timeout_ms: int = 1000,
    ) -> None:
        self._client = client
        self._durability = durability
        self._replication_timeout_ms = replication_timeout_ms
        self._replica_id = replica_id
        self._sha: dict[str, str] = {}
        self._source: dict[str, str] = {}
        self._queued: list[_Op] = []
        self._open_publishes: dict[tuple[Any, ...], _Tokens] = {}
        """The open publish op of each (address, band, kind), which later messages join."""
        self._open_acks: dict[tuple[Any, ...], _Op] = {}
        """The same for ``ack_nowait``: its (address, band, group)'s queued op."""
        self._tails: dict[str, bytes] = {}
        """The encoded expiry and origin of messages without an expiry, by origin."""
        self._in_flight: dict[int, list[_Op]] = {}
        """Ops of each pipeline sent and not yet answered, by cycle number."""
        self._cycle_number = 0
        self._lane = Lane(client.connection_pool, PIPELINES_IN_FLIGHT)
        self._retry: list[_Op] = []
        """Ops to send again, in order, once the scripts are loaded (Redis had forgotten them)."""
        self._sending: list[_Op] = []
        """Ops taken from the queue whose pipeline is being written."""
        self._wakeup = asyncio.Event()
        self._kinds: dict[str, AddressKind] = {}
        self._watchers: dict[str, list[Notify]] = {}
        self._watch_lock = asyncio.Lock()
        self._watch_cursor = 0
        """Where the next partial ``assert_watches`` starts in the watched addresses."""
        self._pubsub: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lazy_wakeup: asyncio.TimerHandle | None = None
        """Armed while only acks are queued (ACK_COALESCE_SECONDS)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._pending_tasks: set[asyncio.Future[None]] = set()
        self._closed = False
        self._bulk_fetches: set[tuple[str, str]] = set()
        self._shared: set[tuple[str, str]] = set()
        """(address, group) whose last fetch found other replicas serving it too."""
        """(address, group) whose last fetch was big and found nothing returned or high-band."""
        self._address_backlogs: dict[str, tuple[int, str]] = {}
        """Declared queues' own backlog limits (``retention.maxMessages``), over ``_backlog``."""
        self._unconfirmed_warned_at = -UNCONFIRMED_WARNING_SECONDS
        self.pipelines = 0
        """Pipelines sent so far (a batching measure for benchmarks and tests)."""
        self.resubscribes = 0
        """Times the notification channel was lost and subscribed again (a metric)."""
        self.commands = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        replica_id: str,
        durability: Durability = Durability.MEMORY,
        replication_timeout_ms: int = 1000,
    ) -> 'RedisStore':
        # Blocking pool: a burst of attaches or closes waits for a connection instead of failing
        # with "Too many connections" (redis-py's default pool refuses past its size).
        pool = connect.connection_pool(
            url, blocking=True, max_connections=MAX_REDIS_CONNECTIONS, timeout=POOL_WAIT_SECONDS,
            health_check_interval=30,
        )  # fmt: skip
        client = redis.asyncio.Redis.from_pool(pool)  # owns the pool: aclose() closes it
        return cls(client, replica_id, durability, replication_timeout_ms)

    @property
    def reconnects(self) -> dict[str, int]:
        """Connections lost and opened again, by connection (a metric)."""
        return {'pipeline': self._lane.reconnects, 'notifications': self.resubscribes}

    async def check_durability(self) -> None:
        """Refuse to start when Redis cannot give the promised durability."""
        if self._durability is not Durability.FSYNC:
            return
        config = await self._call(self._client.config_get('append*'))
        values = {as_text(k): as_text(v) for k, v in config.items()}
        if values.get('appendonly') != 'yes' or values.get('appendfsync') != 'always':
            raise StoreUnavailable(
                'SHOAL_DURABILITY=fsync needs Redis with appendonly yes and appendfsync always '
                f'(found appendonly={values.get("appendonly")}, '
                f'appendfsync={values.get("appendfsync")})'
            )

    async def start(self) -> None:
        """Load the scripts and start the pipeline and notification tasks."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._load_scripts()
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            await self._pubsub.subscribe(f'{keys.PREFIX}:__replica__:{self._replica_id}')
        except _REDIS_DOWN as exc:
            raise StoreUnavailable(f'cannot reach Redis: {exc}') from exc
        self._tasks = [
            asyncio.create_task(self._run_cycles(), name='store-cycles'),
            asyncio.create_task(self._listen(), name='store-notifications'),
        ]

    async def close(self) -> None:
        self._closed = True
        if self._lazy_wakeup is not None:
            self._lazy_wakeup.cancel()
        await cancel_and_wait(self._tasks)
        await self._lane.close()
        for op in (*self._queued, *self._sending, *self._retry, *self._in_flight_ops()):
            if not op.done():
                _fail(op, StoreUnavailable('broker shutting down'))
        if self._pubsub is not None:
            with contextlib.suppress(*_REDIS_DOWN):
                await self._pubsub.aclose()
        await connect.close(self._client)

    async def flush(self) -> None:
        """Wait until everything queued or in flight has been sent and answered."""
        while self._queued or self._sending or self._in_flight or self._retry:
            ops = (*self._queued, *self._sending, *self._retry, *self._in_flight_ops())
            futures = [op.future for op in ops if op.future is not None]
            if futures:
                await asyncio.gather(*futures, return_exceptions=True)
            else:  # only callback ops left: they are answered with their pipeline
                await asyncio.sleep(0.01)

    def _in_flight_ops(self) -> list[_Op]:
        return [op for ops in self._in_flight.values() for op in ops]

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except _REDIS_DOWN:
            return False

    async def _load_scripts(self) -> None:
        for name in SCRIPTS:
            self._source[name] = scripts.source(name)
            self._sha[name] = as_text(await self._client.script_load(self._source[name]))

    # -- the per-message path: queued, batched, a few pipelines in flight on one connection -----

    def _queue(
        self,
        commands: list[tuple[Any, ...]],
        finish: Callable[[list[Any]], Any],
        notify: str | None = None,
        *,
        notify_local: bool = False,
        batch: tuple[Any, ...] | None = None,
        batch_args: Sequence[Any] = (),
        lazy: bool = False,
    ) -> asyncio.Future[Any]:
        """Queue commands for the next cycle; a ``lazy`` op waits up to ACK_COALESCE_SECONDS
        for another op to start that cycle."""
        loop = self._loop or asyncio.get_running_loop()  # cached: this runs once per message
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.append(_Op(commands, finish, future, notify, notify_local, batch, batch_args))
        if lazy:
            self._wake_lazily()
        else:
            self._wakeup.set()
        return future

    def _wake_lazily(self) -> None:
        """Start a cycle within ACK_COALESCE_SECONDS, unless another op starts one first."""
        if self._lazy_wakeup is None:
            loop = self._loop or asyncio.get_running_loop()
            self._lazy_wakeup = loop.call_later(ACK_COALESCE_SECONDS, self._wakeup.set)

    def _script(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        return ('EVALSHA', self._sha[name], len(keys_), *keys_, *args)

    async def _run_cycles(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._queued:
                continue
            await self._lane.wait_for_room()  # meanwhile the batch grows
            ops, self._queued = self._queued, []
            self._open_publishes.clear()  # what is published from now on goes in the next cycle
            self._open_acks.clear()
            if self._lazy_wakeup is not None:  # the acks waiting for a ride go in this one
                self._lazy_wakeup.cancel()
                self._lazy_wakeup = None
            self._sending = ops
            try:
                await self._send_cycle(ops)
            except Exception as exc:  # a bug must not stop every later store operation
                logger.exception('store cycle failed')
                for op in ops:
                    if not op.done():
                        _fail(op, StoreUnavailable(f'store cycle failed: {exc}'))
            finally:
                self._sending = []

    async def _send_cycle(self, ops: list[_Op]) -> None:
        units = self._units(ops)
        commands = [command for unit_commands, _ in units for command in unit_commands]
        announced = {op.notify for op in ops if op.notify}  # a publish announces in its script
        for address in announced:  # by source, like publish: a lost script must not lose it
            k = keys.AddressKeys.of(address)
            commands.append(
                ('EVAL', self._source['notify'], 1, k.watchers, k.notify, self._replica_id)
            )
        waits = self._durability is Durability.REPLICATED and any(
            op.batch is not None and op.batch[0] in _WRITES for op in ops
        )
        if waits:  # accepted only once a Redis replica has it
            commands.append(('WAIT', 1, self._replication_timeout_ms))
        self.pipelines += 1
        self.commands += len(commands)
        started = time.perf_counter()
        number = self._cycle_number = self._cycle_number + 1

        def answered(replies: list[Any] | None, error: BaseException | None) -> None:
            self._in_flight.pop(number, None)
            self._answered(ops, units, replies, error, waits=waits, started=started)

        self._in_flight[number] = ops
        try:
            await self._lane.send_then(commands, answered)
        except BaseException as exc:  # not sent: nothing will answer it
            self._in_flight.pop(number, None)
            if not isinstance(exc, _REDIS_DOWN):
                raise
            _unreachable(ops, exc)

    def _answered(
        self,
        ops: list[_Op],
        units: list[_Unit],
        replies: list[Any] | None,
        error: BaseException | None,
        *,
        waits: bool,
        started: float,
    ) -> None:
        """Settle a cycle's ops from its replies (called in the order the cycles were sent)."""
        if error is not None or replies is None:
            _unreachable(ops, error or StoreUnavailable('no replies'))
            return
        REDIS_ROUND_TRIP.observe(time.perf_counter() - started)
        if waits and not (isinstance(replies[-1], int) and replies[-1] >= 1):
            self._warn_unconfirmed()
            _unconfirmed(ops)
        self._settle_units(units, replies)
        for address in {op.notify for op in ops if op.notify and op.notify_local}:
            self._notify_local(address)

    def _warn_unconfirmed(self) -> None:
        """Say why every message is released while the primary has no replica (after a
        Sentinel failover, until one joins), once per UNCONFIRMED_WARNING_SECONDS."""
        now = time.monotonic()
        if now - self._unconfirmed_warned_at >= UNCONFIRMED_WARNING_SECONDS:
            self._unconfirmed_warned_at = now
            logger.warning(
                'no Redis replica confirmed writes within %d ms: messages are released, not '
                'accepted (SHOAL_DURABILITY=replicated needs a replica of the Redis primary)',
                self._replication_timeout_ms,
            )

    def _settle_units(self, units: list[_Unit], replies: list[Any]) -> None:
        retry: list[_Op] = []
        pos = 0
        for commands, members in units:
            mine = replies[pos : pos + len(commands)]
            pos += len(commands)
            # a merged command's replies belong to each of its members: looked at once per unit
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if error is None:
                for op in members:
                    _settle(op, mine)
            elif any(_is_noscript(r) for r in mine):
                retry += members
            else:
                for op in members:
                    if not op.done():
                        _fail(op, _refusal(error))
        if retry:
            if not self._retry:
                self._background(self._reload_then_retry())
            self._retry += retry  # cycles are answered in order, so the retries stay in order

    async def _reload_then_retry(self) -> None:
        """Redis forgot the scripts (restarted or flushed): load them, then send those ops again
        ahead of everything queued (a script's hash is its SHA1: the commands stay valid). Only
        idempotent scripts (fetch, browse, schedule) go by hash; publish goes as source, so a
        lost script can never reorder a producer's messages."""
        try:
            await self._load_scripts()
        except _REDIS_DOWN as exc:
            retry, self._retry = self._retry, []
            _unreachable(retry, exc)
            return
        retry, self._retry = self._retry, []
        self._queued[:0] = retry
        self._wakeup.set()

    def _units(self, ops: list[_Op]) -> list[_Unit]:
        """Group ops into pipeline units, merging batchable ones where the first of them stood."""
        units: list[_Unit] = []
        batches: dict[tuple[Any, ...], int] = {}
        for op in ops:
            if op.batch is None:
                units.append((op.commands, [op]))
            elif op.batch in batches:
                units[batches[op.batch]][1].append(op)
            else:
                batches[op.batch] = len(units)
                units.append(([], [op]))
        for key, index in batches.items():
            members = units[index][1]
            units[index] = (self._merged(key, members), members)
        return units

    def _merged(self, key: tuple[Any, ...], members: list[_Op]) -> list[tuple[Any, ...]]:
        k = keys.AddressKeys.of(key[1])
        if key[0] == 'publish':
            _, _, band, kind = key
            args = _quadruples(members)
            # by source, not hash: see _reload_then_retry (Redis caches it by its SHA1)
            backlog = self._address_backlogs.get(key[1], self._backlog)
            announce = (k.notify, self._replica_id)  # other replicas' consumers, in the script
            if backlog is not None:  # a declared queue's maxMessages, SHOAL_MAX_BACKLOG_PER_ADDRESS
                script_keys = (k.streams[band], k.groups, *k.streams, k.watchers)
                return [
                    ('EVAL', self._source['publish_limited'], len(script_keys), *script_keys,
                     kind, *backlog, *announce, args)
                ]  # fmt: skip
            return [
                ('EVAL', self._source['publish'], 3, k.streams[band], k.groups, k.watchers, kind,
                 *announce, args)
            ]  # fmt: skip
        if key[0] == 'claim':  # by source, as publish
            _, _, band, group, _ = key
            args = _quadruples(members)
            return [
                ('EVAL', self._source['publish_claim'], 2, k.streams[band], k.groups, group,
                 self._replica_id, band, args)
            ]  # fmt: skip
        _, _, band, group = key  # ack: one XACK for all ids, one HDEL for the counted ones
        # batch_args: (id, counted field or None) pairs, one pair per ack or many (ack_nowait)
        commands: list[tuple[Any, ...]] = [
            ('XACK', k.streams[band], group, *(i for op in members for i in op.batch_args[::2]))
        ]
        counted = [f for op in members for f in op.batch_args[1::2] if f]
        if counted:
            commands.append(('HDEL', k.delivery_counts(group), *counted))
        return commands

    def publish(self, address: str, kind: AddressKind, message: OutgoingMessage) -> Awaitable[bool]:
        future: asyncio.Future[bool] = (self._loop or asyncio.get_running_loop()).create_future()
        self._queue_publish(address, kind, message, future, None)
        return future

    def _encoded(self, message: OutgoingMessage) -> tuple[bytes, ...]:
        """A message's four script arguments (header, rest, expiry, origin) as the
        PARTS_PER_MESSAGE parts of an ``Encoded``. The last two are the same for every message
        of a producing connection that sets no expiry, so those are encoded once."""
        header, rest, expiry_ms, origin = (
            message.header, message.rest, message.expiry_ms, message.origin
        )  # fmt: skip
        if expiry_ms:
            tail = encode(b'%d' % expiry_ms, origin.encode())
        else:
            known = self._tails.get(origin)
            if known is None:
                if len(self._tails) >= MAX_CACHED_TAILS:
                    self._tails.clear()
                known = self._tails[origin] = encode(b'0', origin.encode())
            tail = known
        return (BULK_HEADS[len(header)], header, CRLF, BULK_HEADS[len(rest)], rest, CRLF, tail)

    def publish_then(
        self,
        address: str,
        kind: AddressKind,
        message: OutgoingMessage,
        callback: PublishCallback[T],
        token: T,
    ) -> None:
        batched = self._open_publishes.get(('publish', address, message.band, kind))
        # this cycle's op for the address and band takes the message, if it answers the same
        # callback (written out here: this runs once per message)
        if batched is not None and batched.callback is callback:
            batched.args += self._encoded(message)
            batched.tokens.append(token)
            return
        self._queue_publish(address, kind, message, None, callback, token)

    def _queue_publish(
        self,
        address: str,
        kind: AddressKind,
        message: OutgoingMessage,
        future: 'asyncio.Future[bool] | None',
        callback: PublishCallback[Any] | None,
        token: Any = None,
    ) -> None:
        """A new publish op; one with a ``callback`` stays open for the cycle (``publish_then``)."""
        key = ('publish', address, message.band, kind)  # kind: a StrEnum, a str
        args = list(self._encoded(message))
        if callback is None:  # a later message for the same key must not overtake this one
            self._open_publishes.pop(key, None)

        def finish(replies: list[Any]) -> bool:
            if replies[0] == -1:
                self._kinds.pop(address, None)
                raise AddressNotFound(f'{address!r} no longer exists')
            if replies[0] == -2:
                limit = self._backlog_limit(address)
                raise StoreFull(f'{address!r} holds its limit of {limit} messages', 'address_limit')
            return bool(replies[0])

        answer = None
        if callback is not None:  # the op stays open for the cycle: its arguments grow
            answer = self._open_publishes[key] = _Tokens(callback, token, args)
        op = _Op(
            [],
            finish,
            future,
            None,  # notify: publish.lua wakes other replicas itself
            False,  # notify_local
            key,  # batch
            args,  # batch_args
            answer,  # callback
        )
        self._queued.append(op)
        self._wakeup.set()

    def leave_sharing(self, address: str, group: str) -> Awaitable[None]:
        self._shared.discard((address, group))
        shares = keys.AddressKeys.of(address).shares(group)
        return self._queue([('HDEL', shares, self._replica_id)], _no_result)

    def can_claim(self, address: str) -> bool:
        """Whether ``claim_then`` may take a message to ``address``: not when the address has a
        backlog limit, which could refuse it after a consumer has it."""
        return self._address_backlogs.get(address, self._backlog) is None

    def claim_then(
        self,
        address: str,
        group: str,
        message: OutgoingMessage,
        callback: ClaimCallback[T],
        token: T,
    ) -> None:
        """Publish a message a consumer on this replica already has, and claim it for this replica
        in the same script (publish_claim.lua), with whatever of the group is unread ahead of it.
        The callback gets (ids of the messages in token order, entries read ahead of them)."""
        # the callback in the key: ops never share a script unless one _Tokens answers them all
        key = ('claim', address, message.band, group, callback)
        batched = self._open_publishes.get(key)
        if batched is not None:
            batched.args += self._encoded(message)
            batched.tokens.append(token)
            return
        args = list(self._encoded(message))

        def finish(replies: list[Any]) -> tuple[list[str], list[Entry]]:
            head = replies[0]
            if head == -1:
                self._kinds.pop(address, None)
                raise AddressNotFound(f'{address!r} no longer exists')
            count = int(head[0])
            return [raw.decode() for raw in head[1 : count + 1]], _entries(head, count + 1)

        answer = self._open_publishes[key] = _Tokens(callback, token, args)
        self._queued.append(_Op([], finish, None, None, False, key, args, answer))
        self._wakeup.set()

    def schedule(self, address: str, message: OutgoingMessage, due_ms: int) -> Awaitable[bool]:
        """Hold a message until ``due_ms``; any replica moves it into the stream then."""
        k = keys.AddressKeys.of(address)
        member = f'{due_ms}-{uuid.uuid4().hex}'
        args = (due_ms, member, message.band, message.header, message.rest,
                str(message.expiry_ms), message.origin)  # fmt: skip
        commands: list[tuple[Any, ...]] = [
            self._script('schedule', (k.scheduled, k.scheduled_messages), args),
            ('SADD', keys.SCHEDULED, address),
        ]
        return self._queue(commands, lambda r: True)

    async def release_due(self, now_ms: int, limit: int = 500) -> int:
        """Move every due scheduled message into its address's streams; returns how many."""
        moved_total = 0
        for raw in await self._call(self._client.smembers(keys.SCHEDULED)):
            address = as_text(raw)
            kind = await self.address_kind(address) or AddressKind.QUEUE
            k = keys.AddressKeys.of(address)
            script_keys = (k.scheduled, k.scheduled_messages, *k.streams, k.groups)
            moved = int(await self.evalsha('release_due', script_keys, (now_ms, limit, kind.value)))
            if moved:
                moved_total += moved
                await self.announce(address)
        return moved_total

    def fetch(
        self, address: str, group: str, count: int, consumers: int = 0, credit: int = 0
    ) -> Awaitable[Fetched]:
        return self._queue(*self._fetch_op(address, group, count, consumers, credit or count))

    def fetch_then(
        self,
        address: str,
        group: str,
        count: int,
        callback: Callable[[Fetched | None, BrokerError | None], None],
        consumers: int = 0,
        credit: int = 0,
    ) -> None:
        commands, finish = self._fetch_op(address, group, count, consumers, credit or count)
        self._queued.append(_Op(commands, finish, None, None, False, None, (), callback))
        self._wakeup.set()

    def _fetch_op(
        self, address: str, group: str, count: int, consumers: int, credit: int
    ) -> tuple[list[tuple[Any, ...]], Callable[[list[Any]], Fetched]]:
        """The commands of one fetch and what makes entries of their replies. A subscription
        fetching in bulk (BULK_FETCH_ENTRIES) has its normal band read by a plain XREADGROUP:
        handed back through Lua, an entry costs Redis ~3 µs more
        (docs/performance.md#bulk-fetch). At a trickle one EVALSHA stays cheaper. A subscription
        other replicas serve too is never read in bulk: only the script knows this replica's
        share."""
        k = keys.AddressKeys.of(address)
        script_keys = (
            *k.streams, k.returned(group), k.delivery_counts(group), k.shares(group)
        )  # fmt: skip
        subscription = (address, group)
        sharing = (consumers, credit, k.notify)
        if subscription in self._bulk_fetches and subscription not in self._shared:
            # fetch.lua takes returned and high-band entries; the normal band is read directly.
            # The script goes as source: if Redis had forgotten it, a retry would send the
            # XREADGROUP again, stranding what the first one claimed.
            commands = [
                ('EVAL', self._source['fetch'], 5, *script_keys,
                 group, self._replica_id, count, '0', *sharing),
                ('XREADGROUP', 'GROUP', group, self._replica_id, 'COUNT', count,
                 'STREAMS', k.streams[NORMAL_BAND], '>'),
            ]  # fmt: skip
        else:
            commands = [
                self._script('fetch', script_keys, (group, self._replica_id, count, '1', *sharing))
            ]

        def finish(replies: list[Any]) -> Fetched:
            head = replies[0]
            entries = Fetched(_entries(head, 2), int(head[1]))
            if entries.shared:
                if len(self._shared) < MAX_BULK_FETCHES:
                    self._shared.add(subscription)
            else:
                self._shared.discard(subscription)
            if len(replies) > 1:
                new = _new_entries(replies[1])
                if not head[0]:
                    entries += new
                elif new:  # more returned entries may wait: the new ones must not overtake them
                    # their releases are queued now, before any fetch the caller's callback
                    # starts: queued from the background task, they went after it, and that
                    # fetch handed out newer entries first
                    releases = [self.release(address, group, e, delivery_failed=False) for e in new]
                    self._background(self._give_back(address, group, new, releases))
            if head[0] or 0 < len(entries) < min(count, BULK_FETCH_ENTRIES):
                self._bulk_fetches.discard(subscription)
            elif len(entries) >= BULK_FETCH_ENTRIES and len(self._bulk_fetches) < MAX_BULK_FETCHES:
                self._bulk_fetches.add(subscription)
            return entries

        return commands, finish

    def ack(self, address: str, group: str, entry: Entry) -> Awaitable[None]:
        counted = keys.entry_field(entry.band, entry.id) if entry.delivery_count else None
        return self._queue(
            [],
            _no_result,
            batch=('ack', address, entry.band, group),
            batch_args=(entry.id, counted),
            lazy=True,
        )

    def ack_nowait(self, address: str, group: str, entries: Iterable[Entry]) -> None:
        open_acks = self._open_acks
        band: int | None = None
        args: list[Any] = []
        for entry in entries:
            if entry.band != band:  # this cycle's op for the address, band and group takes it
                band = entry.band
                key = ('ack', address, band, group)
                batched = open_acks.get(key)
                if batched is None:
                    batched = open_acks[key] = _Op([], _no_result, None, None, False, key, [])
                    self._queued.append(batched)
                    self._wake_lazily()  # as _queue's lazy ops: ride with the next pipeline
                args = batched.batch_args  # type: ignore[assignment]
            if entry.delivery_count:
                args += (entry.id, keys.entry_field(band, entry.id))
            else:
                args += (entry.id, None)

    async def _give_back(
        self, address: str, group: str, entries: list[Entry], releases: list[Awaitable[None]]
    ) -> None:
        """See that the releases ``_fetch_op`` queued for new entries a fetch in bulk read beside
        returned or high-band ones are done. A refusal is tried again with a growing pause, as
        ``Broker.release`` does: the entries are pending on this replica, and nothing else would
        return them while it lives."""
        pause = 0.0
        while True:
            try:  # in one cycle, in order; a release already done is only done again
                await asyncio.gather(*releases)
                return
            except BrokerError as exc:
                if self._closed:  # pending on a replica that stops: reclaimed like a crash's
                    return
                pause = min(GIVE_BACK_MAX_PAUSE, max(0.25, pause * 2))
                logger.warning('returning %d entries to %s/%s failed (%s); again in %.2f s',
                               len(entries), address, group, exc, pause)  # fmt: skip
                await asyncio.sleep(pause)
                releases = [self.release(address, group, e, delivery_failed=False) for e in entries]

    def release(
        self, address: str, group: str, entry: Entry, *, delivery_failed: bool
    ) -> Awaitable[None]:
        k = keys.AddressKeys.of(address)
        commands: list[tuple[Any, ...]] = []
        if delivery_failed:
            # count first: a replica fetching between the two commands must see the new count
            field = keys.entry_field(entry.band, entry.id)
            commands.append(('HINCRBY', k.delivery_counts(group), field, 1))
        member = keys.entry_member(entry.band, entry.id)
        commands.append(('ZADD', k.returned(group), 0, member))
        return self._queue(commands, lambda r: None, notify=address, notify_local=True)

    def browse(
        self, address: str, group: str, cursor: BrowseCursor, count: int
    ) -> Awaitable[tuple[Sequence[Entry], BrowseCursor]]:
        k = keys.AddressKeys.of(address)
        commands = [
            self._script('browse', (k.streams[band],), (group, position, count))
            for band, position in cursor.positions
        ]

        def finish(replies: list[Any]) -> tuple[Sequence[Entry], BrowseCursor]:
            # bands are read independently, highest first; show at most ``count`` in all
            shown: list[Entry] = []
            positions = []
            for (band, position), reply in zip(cursor.positions, replies, strict=True):
                found = [
                    Entry(as_text(reply[i]), band, reply[i + 1], reply[i + 2], int(reply[i + 3]), 0)
                    for i in range(1, len(reply), 4)
                ]
                room = count - len(shown)
                if len(found) <= room:
                    positions.append((band, as_text(reply[0])))
                    shown += found
                else:
                    shown += found[:room]
                    positions.append((band, found[room - 1].id if room else position))
            return shown, BrowseCursor(tuple(positions))

        return self._queue(commands, finish)

    # -- addresses and subscriptions: cold path, direct calls -----------------------------------

    async def address_kind(self, address: str) -> AddressKind | None:
        if address in self._kinds:
            return self._kinds[address]
        raw = await self._call(self._client.hget(keys.ADDRESSES, address))
        if raw is None:
            return None
        kind = AddressKind(as_text(raw))
        self._kinds[address] = kind
        return kind

    async def create_address(self, address: str, kind: AddressKind) -> AddressKind:
        k = keys.AddressKeys.of(address)
        script_keys = (keys.ADDRESSES, *k.streams, k.groups)
        args = (address, kind.value, keys.QUEUE_GROUP)
        actual = AddressKind(as_text(await self.evalsha('create_address', script_keys, args)))
        self._kinds[address] = actual
        return actual

    async def delete_address(self, address: str) -> None:
        k = keys.AddressKeys.of(address)
        groups = [as_text(g) for g in await self._call(self._client.smembers(k.groups))]
        doomed = [*k.streams, k.groups]
        for group in groups:
            doomed += [k.returned(group), k.delivery_counts(group), k.shares(group),
                       k.delivered(group)]  # fmt: skip
        await self._call(self._client.delete(*doomed))
        await self._call(self._client.hdel(keys.ADDRESSES, address))
        self._kinds.pop(address, None)

    async def create_subscription(self, address: str, group: str, *, from_start: bool) -> None:
        k = keys.AddressKeys.of(address)
        args = (group, '0' if from_start else '$')
        await self._call(self._evalsha('create_group', (*k.streams, k.groups), args))

    async def delete_subscription(self, address: str, group: str) -> None:
        k = keys.AddressKeys.of(address)
        script_keys = (
            *k.streams, k.groups, k.returned(group), k.delivery_counts(group), k.shares(group),
            k.delivered(group),
        )  # fmt: skip
        await self._call(self._evalsha('delete_group', script_keys, (group,)))

    async def append_records(self, records: Sequence[Mapping[str, str]], max_length: int) -> None:
        """Append metric records to the metrics stream, trimmed to about ``max_length``, and add
        each queue's and named subscription's deliveries to its per-replica total
        (``AddressKeys.delivered``)."""
        if not records:
            return
        pipe = self._client.pipeline(transaction=False)
        for fields in records:
            entry: dict[Any, Any] = dict(fields)
            pipe.xadd(keys.METRICS, entry, maxlen=max_length, approximate=True)
            delivered = int(fields.get('delivered') or 0)
            group = fields.get('subscription', '')
            if delivered and group and group != PRIVATE_LABEL:
                totals = keys.AddressKeys.of(fields['address']).delivered(group)
                pipe.hincrby(totals, fields['replica'], delivered)
        await self._call(pipe.execute())

    async def return_stranded(self, address: str, group: str, held: set[tuple[int, str]]) -> int:
        """Return this replica's pending entries of a subscription that it does not hold (a lost
        fetch reply left them claimed but undelivered); their count is unchanged."""
        k = keys.AddressKeys.of(address)
        returned = 0
        for band, stream in enumerate(k.streams):
            pending = await self._call(
                self._client.xpending_range(stream, group, '-', '+', 10_000, self._replica_id)
            )
            members = [
                keys.entry_member(band, as_text(p['message_id']))
                for p in pending
                if (band, as_text(p['message_id'])) not in held
            ]
            if members:
                await self._call(self._client.zadd(k.returned(group), dict.fromkeys(members, 0)))
                returned += len(members)
        if returned:
            await self.announce(address)
        return returned

    # -- transactions ---------------------------------------------------------------------------

    async def commit(
        self,
        sends: Sequence[tuple[str, AddressKind, OutgoingMessage]],
        acks: Sequence[tuple[str, str, Entry]],
    ) -> None:
        """Apply a transaction's sends and acks atomically (MULTI/EXEC), across any addresses.

        The publish script is sent as text (EVAL), not by hash: inside MULTI a NOSCRIPT error
        would fail that one command while the others apply, half-applying the commit.
        """
        if not sends and not acks:
            return
        pipe = self._client.pipeline(transaction=True)
        for address, kind, message in sends:
            k = keys.AddressKeys.of(address)
            pipe.eval(
                self._source['publish'], 3, k.streams[message.band], k.groups, k.watchers,
                kind.value, '', self._replica_id,  # announced below, once committed (and WAITed)
                message.header, message.rest, str(message.expiry_ms), message.origin,
            )  # fmt: skip
        for address, group, entry in acks:
            k = keys.AddressKeys.of(address)
            pipe.xack(k.streams[entry.band], group, entry.id)
            if entry.delivery_count:
                pipe.hdel(k.delivery_counts(group), keys.entry_field(entry.band, entry.id))
        replies = await self._call(pipe.execute(raise_on_error=False))
        errors = [r for r in replies if isinstance(r, Exception)]
        if errors:
            raise StoreUnavailable(f'Redis refused part of a commit: {errors[0]}')
        if self._durability is Durability.REPLICATED:
            confirmed = await self._call(self._client.wait(1, self._replication_timeout_ms))
            if confirmed < 1:
                raise StoreUnavailable('no Redis replica confirmed the commit in time')
        for address in {address for address, _, _ in sends}:
            await self.announce(address)

    # -- named subscriptions and ClientIDs -------------------------------------------------------

    async def join_subscription(
        self, spec: SubscriptionSpec, consumer: str, default_max_consumers: int
    ) -> JoinOutcome:
        key = spec.key
        k = keys.SubscriptionKeys.of(key.id)
        definition = spec.definition()
        args = (
            consumer, self._replica_id, key.id, '1' if spec.shared else '0',
            '1' if key.durable else '0', key.scope.value, key.client_id, key.name,
            definition['topic'], definition['selector'], definition['no_local'],
            default_max_consumers,
        )  # fmt: skip
        reply = await self._call(
            self._evalsha('join', (k.definition, k.consumers, keys.SUBSCRIPTIONS), args)
        )
        outcome, detail = as_text(reply[0]), as_text(reply[1])
        if outcome == 'locked':
            raise ResourceLocked(detail)
        if outcome == 'limit':
            raise ResourceLimitExceeded(detail)
        if outcome == 'recreated':  # the old subscription's messages go with it
            await self.delete_subscription(detail or spec.topic, key.id)
        # idempotent: a replica joining an existing subscription makes sure its group exists
        await self.create_subscription(spec.topic, key.id, from_start=False)
        return JoinOutcome(outcome)

    async def leave_subscription(self, key: SubscriptionKey, consumer: str) -> int:
        k = keys.SubscriptionKeys.of(key.id)
        script_keys = (k.definition, k.consumers, keys.SUBSCRIPTIONS)
        reply = await self._call(self._evalsha('leave', script_keys, (consumer, key.id)))
        left, topic = int(reply[0]), as_text(reply[1])
        if topic:
            await self.delete_subscription(topic, key.id)
        return left

    async def unsubscribe(self, key: SubscriptionKey, consumer: str) -> None:
        k = keys.SubscriptionKeys.of(key.id)
        script_keys = (k.definition, k.consumers, keys.SUBSCRIPTIONS)
        reply = await self._call(self._evalsha('unsubscribe', script_keys, (consumer, key.id)))
        outcome = as_text(reply[0])
        if outcome == 'missing':
            raise AddressNotFound(f'no durable subscription named {key.name!r}')
        if outcome == 'owned':
            raise NotAllowed(f'subscription {key.name!r} is declared by {as_text(reply[1])}')
        if outcome == 'locked':
            raise ResourceLocked(f'there are active consumers on the subscription {key.name!r}')
        await self.delete_subscription(as_text(reply[1]), key.id)

    async def subscription_definition(self, key: SubscriptionKey) -> dict[str, str] | None:
        k = keys.SubscriptionKeys.of(key.id)
        raw = await self._call(self._client.hgetall(k.definition))
        return {as_text(f): as_text(v) for f, v in raw.items()} or None

    async def subscriptions(self) -> list[dict[str, Any]]:
        """Every named subscription with its consumers per replica (for introspection)."""
        ids = sorted(
            as_text(i) for i in await self._call(self._client.smembers(keys.SUBSCRIPTIONS))
        )
        found = []
        for subscription_id in ids:
            k = keys.SubscriptionKeys.of(subscription_id)
            definition = await self._call(self._client.hgetall(k.definition))
            consumers = await self._call(self._client.hgetall(k.consumers))
            per_replica: dict[str, int] = {}
            for replica in consumers.values():
                per_replica[as_text(replica)] = per_replica.get(as_text(replica), 0) + 1
            entry: dict[str, Any] = {as_text(f): as_text(v) for f, v in definition.items()}
            found.append({'id': subscription_id, **entry, 'consumers': per_replica})
        return found

    async def claim_client(self, client_id: str, holder: str) -> bool:
        return bool(await self._call(self._client.hsetnx(keys.CLIENTS, client_id, holder)))

    async def release_client(self, client_id: str, holder: str) -> None:
        await self._call(self._evalsha('release_client', (keys.CLIENTS,), (client_id, holder)))

    async def trim(self) -> int:
        """Trim every address's streams below what its subscriptions still need, in steps of at
        most TRIM_STEP_ENTRIES entries per script call (trim.lua), so that no call holds Redis
        for long; a stream is trimmed again while its last step removed something."""
        removed = 0
        cursor: int = 0
        while True:
            cursor, batch = await self._call(self._client.hscan(keys.ADDRESSES, cursor, count=200))
            streams = [s for a in batch for s in keys.AddressKeys.of(as_text(a)).streams]
            for _ in range(MAX_TRIM_STEPS):  # a stream consumed as fast as it grows: next pass
                if not streams:
                    break
                pipe = self._client.pipeline(transaction=False)
                for stream in streams:
                    pipe.evalsha(self._sha['trim'], 1, stream, TRIM_STEP_ENTRIES)
                counts = [int(r) for r in await self._call(pipe.execute())]
                removed += sum(counts)
                streams = [s for s, count in zip(streams, counts, strict=True) if count]
            if not cursor:
                return removed

    # -- limits (docs/security.md) ----------------------------------------------------------------

    def limit_backlog(self, limit: int, overflow: str) -> None:
        """Cap what every address holds: at ``limit`` entries a publish is refused
        (``reject-publish``) or the oldest entries are dropped (``drop-oldest``). 0 = no cap."""
        self._backlog = (limit, overflow) if limit > 0 else None

    def limit_address_backlogs(self, limits: Mapping[str, tuple[int, str]]) -> None:
        """Replace the per-address caps (address -> (limit, overflow)) that override
        ``limit_backlog`` for those addresses: declared queues' ``retention.maxMessages``."""
        self._address_backlogs = dict(limits)

    def _backlog_limit(self, address: str) -> int:
        backlog = self._address_backlogs.get(address, self._backlog)
        return backlog[0] if backlog is not None else 0

    async def policies(self) -> dict[str, EntityPolicy]:
        """Every declared queue's and subscription's policy by entity (``keys.POLICIES``); one
        that cannot be parsed is logged and left out (the broker-wide settings apply)."""
        raw = await self._call(self._client.hgetall(keys.POLICIES))
        found = {}
        for entity, text in raw.items():
            try:
                found[as_text(entity)] = EntityPolicy.from_json(text)
            except ValueError as exc:
                logger.warning('ignoring the policy of %s: %s', as_text(entity), exc)
        return found

    async def memory(self) -> tuple[int, int]:
        """Redis's ``used_memory`` and ``maxmemory`` (0: no limit), in bytes."""
        try:
            info = await self._call(self._client.info('memory'))
        except redis.exceptions.NoPermissionError as exc:
            raise StoreCommandDenied('INFO', str(exc)) from exc
        return int(info.get('used_memory', 0)), int(info.get('maxmemory', 0))

    async def subscription_room(self, address: str, group: str, limit: int) -> bool:
        """Whether ``group`` exists on the address or fewer than ``limit`` groups do."""
        k = keys.AddressKeys.of(address)
        pipe = self._client.pipeline(transaction=False)
        pipe.sismember(k.groups, group)
        pipe.scard(k.groups)
        exists, count = await self._call(pipe.execute())
        return bool(exists) or int(count) < limit

    @property
    def client(self) -> 'redis.asyncio.Redis':
        """The Redis client, for the store's own companion modules (liveness, inspection)."""
        return self._client

    async def call(self, awaitable: Awaitable[Any]) -> Any:
        """Await a Redis call, turning a connection failure into StoreUnavailable."""
        return await self._call(awaitable)

    async def evalsha(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one of the store's Lua scripts by name."""
        return await self._call(self._evalsha(name, keys_, args))

    async def announce(self, address: str) -> None:
        """Tell every replica (this one included) that ``address`` has entries to fetch."""
        await self._call(self._client.publish(keys.AddressKeys.of(address).notify, 'reaper'))
        self._notify_local(address)

    async def _evalsha(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._client.evalsha(self._sha[name], len(keys_), *keys_, *args)
        except redis.exceptions.NoScriptError:
            await self._load_scripts()
            return await self._client.evalsha(self._sha[name], len(keys_), *keys_, *args)

    async def _call(self, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except _REDIS_DOWN as exc:
            raise StoreUnavailable(f'Redis unreachable: {exc}') from exc

    # -- notifications -------------------------------------------------------------------------

    def watch(self, address: str, notify: Notify) -> None:
        watchers = self._watchers.setdefault(address, [])
        watchers.append(notify)
        if len(watchers) == 1 and self._pubsub is not None:
            self._background(self._sync_watch(address))

    def unwatch(self, address: str, notify: Notify) -> None:
        watchers = self._watchers.get(address, [])
        if notify in watchers:
            watchers.remove(notify)
        if not watchers and address in self._watchers:
            del self._watchers[address]
            if self._pubsub is not None:
                self._background(self._sync_watch(address))

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending_tasks.add(task)
        task.add_done_callback(self._pending_tasks.discard)

    async def _sync_watch(self, address: str) -> None:
        """Make Redis match whether this replica watches ``address`` now (changes are applied
        one at a time, each to the latest wish, so a quick unwatch and watch end up watched)."""
        k = keys.AddressKeys.of(address)
        async with self._watch_lock:
            with contextlib.suppress(*_REDIS_DOWN):
                if address in self._watchers:
                    await self._pubsub.subscribe(k.notify)
                    await self._client.hset(k.watchers, self._replica_id, 1)
                    # anything published before other replicas could see us: look once more
                    self._notify_local(address)
                else:
                    await self._client.hdel(k.watchers, self._replica_id)
                    await self._pubsub.unsubscribe(k.notify)

    async def assert_watches(self, limit: int | None = None) -> None:
        """List this replica again among the watchers of the addresses it watches: a listing
        lost to a Redis error, restart or flush would otherwise leave its consumers unwoken by
        other replicas' publishes. With ``limit``, only that many, taking up where the last
        call stopped: each lease renewal re-lists a slice (one HSET per address every ~1.7 s
        was a Redis write load growing with the addresses a replica watches), and a re-subscribe
        after a lost connection re-lists them all."""
        async with self._watch_lock:
            addresses = list(self._watchers)
            if not addresses:
                return
            if limit is not None and limit < len(addresses):
                start = self._watch_cursor % len(addresses)
                addresses = (addresses[start:] + addresses[:start])[:limit]
                self._watch_cursor = start + limit
            pipe = self._client.pipeline(transaction=False)
            for address in addresses:
                pipe.hset(keys.AddressKeys.of(address).watchers, self._replica_id, 1)
            await self._call(pipe.execute())

    def _notify_local(self, address: str) -> None:
        for notify in list(self._watchers.get(address, ())):
            notify(address)

    async def _listen(self) -> None:
        channel_prefix = f'{keys.PREFIX}:{{a:'.encode()
        channel_suffix = b'}:notify'
        own = self._replica_id.encode()
        reader = NotificationReader(self._pubsub, NOTIFICATION_IDLE_SECONDS)
        while True:
            try:
                messages = await reader.messages()
            except _REDIS_DOWN as exc:
                logger.warning('notification channel lost: %s; resubscribing', exc)
                await asyncio.sleep(0.5)
                await self._resubscribe()
                continue
            for channel, data in messages:
                if data == own:
                    continue  # our own cycle already woke our consumers
                if channel.startswith(channel_prefix) and channel.endswith(channel_suffix):
                    self._notify_local(channel[len(channel_prefix) : -len(channel_suffix)].decode())

    async def _resubscribe(self) -> None:
        with contextlib.suppress(*_REDIS_DOWN, StoreUnavailable):
            await self._pubsub.connect()  # reconnecting re-subscribes every channel it had
            self.resubscribes += 1
            channels = [keys.AddressKeys.of(a).notify for a in self._watchers]
            if channels:
                await self._pubsub.subscribe(*channels)
            await self.assert_watches()  # a Redis that restarted forgot the watchers
            # anything published while we were away: let every watcher look once
            for address in list(self._watchers):
                self._notify_local(address)


def _settle(op: _Op, replies: list[Any]) -> None:
    """Settle an op whose commands all succeeded: with its result, or its finisher's error."""
    if op.done():
        return
    try:
        result = op.finish(replies)
    except BrokerError as exc:
        _fail(op, exc)
    except Exception as exc:  # a reply of an unexpected shape: fail this op, not the cycle
        logger.exception('unexpected Redis reply')
        _fail(op, StoreUnavailable(f'unexpected Redis reply: {exc}'))
    else:
        op.resolve(result)


def _refusal(error: Exception) -> BrokerError:
    """What an error reply means to the op whose command got it (a new one per op: one exception
    raised in several awaiting tasks would collect all their tracebacks)."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return StoreFull('the message store is full (Redis maxmemory reached)')
    return StoreUnavailable(f'Redis refused: {error}')


def _unreachable(ops: list[_Op], exc: BaseException) -> None:
    logger.warning('Redis unreachable: %s', exc)
    for op in ops:
        if not op.done():
            _fail(op, StoreUnavailable(f'Redis unreachable: {exc}'))


_WRITES = ('publish', 'claim')
"""Batched ops that append messages: a replicated durability waits for them, and fails them
unconfirmed."""


def _quadruples(members: list[_Op]) -> Encoded:
    """The merged publish (or claim) ops' messages as the script's quadruples, in order."""
    parts = [part for op in members for part in op.batch_args]
    return Encoded(parts, len(parts) // PARTS_PER_MESSAGE * 4)


def _unconfirmed(ops: list[_Op]) -> None:
    """Messages written but not confirmed by a Redis replica in time: never accept them."""
    for op in ops:
        if op.batch is not None and op.batch[0] in _WRITES and not op.done():
            _fail(op, StoreUnavailable('no Redis replica confirmed the write in time'))


def _fail(op: _Op, error: BrokerError) -> None:
    """Fail an op. Acks and releases are fire-and-forget for the broker: mark the exception
    seen (the entry stays pending and is redelivered; the failure is logged) so asyncio does not
    complain about an exception nobody retrieved; an awaiting caller still gets it."""
    op.reject(error)
    if (op.batch is not None and op.batch[0] == 'ack') or op.notify_local:
        logger.debug('store operation failed: %s', error)
        if op.future is not None:
            op.future.exception()


def _is_noscript(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.NoScriptError) or (
        isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith('NOSCRIPT')
    )


def _entries(flat: list[Any], start: int = 0) -> list[Entry]:
    """Entries from fetch.lua's septuples (from ``start`` in its reply)."""
    # positional (id, band, header, rest, expiry_ms, delivery_count, origin): keyword
    # construction costs ~2 µs per entry
    return [
        Entry(
            flat[i + 1].decode(),
            int(flat[i]),
            flat[i + 2],
            flat[i + 3],
            int(flat[i + 4]),
            int(flat[i + 5]),
            flat[i + 6].decode(),
        )
        for i in range(start, len(flat), 7)
    ]


def _new_entries(reply: Any) -> list[Entry]:
    """Entries from a plain XREADGROUP of the normal band: fields in append_entries.lua's order,
    header and rest first, then expiry and origin when present. The reply is a map under RESP3
    (the store's connections) and a list of (stream, entries) pairs under RESP2."""
    if not reply:
        return []
    entries: list[Entry] = []
    read = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    append = entries.append
    for raw_id, fields in read:
        expiry_ms, origin = 0, ''
        if len(fields) == 6 and fields[4] == b'c':  # the common shape: an origin, no expiry
            origin = fields[5].decode()
        else:
            for i in range(4, len(fields), 2):
                if fields[i] == b'x':
                    expiry_ms = int(fields[i + 1])
                elif fields[i] == b'c':
                    origin = fields[i + 1].decode()
        append(Entry(raw_id.decode(), NORMAL_BAND, fields[1], fields[3], expiry_ms, 0, origin))
    return entries


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
