"""
The AMQP 1.0 node of one replica: engine events in, store operations and transfers out.

Everything here runs on the one asyncio loop; proton objects are touched only from it. Attaches
that need the store (does the address exist? create it? create a subscription?) are answered
asynchronously: the link stays un-attached on our side until the store replies, and a link the
peer gave up on meanwhile is noticed through ``LinkState.alive``.

Errors: a ``BrokerError`` refuses the one link or message concerned with its AMQP condition
(DESIGN.md §8); anything else is a bug, logged, and answered with ``amqp:internal-error`` on that
link only.
"""

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from shoal_broker.amqp import attach, codec, engine, transactions
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.engine import Ptr, lib, wire
from shoal_broker.amqp.guard import Guard, user_name
from shoal_broker.amqp.links import (
    UNSETTLED_ON_DETACH,
    Ahead,
    BrowserLink,
    ConsumerLink,
    Identifiers,
    LinkState,
    LookupLink,
    PendingMessage,
    ProducerLink,
)
from shoal_broker.amqp.subscriptions import MAX_FETCH, MAX_RETRY_SECONDS, Held, LocalSubscription
from shoal_broker.errors import (
    AddressNotFound,
    BrokerError,
    InvalidField,
    MessageSizeExceeded,
    StoreFull,
    StoreUnavailable,
)
from shoal_broker.metrics import registry as metrics
from shoal_broker.metrics.registry import Counters
from shoal_broker.routing import addresses, outcomes
from shoal_broker.routing.jms_subscriptions import SubscriptionKey
from shoal_broker.routing.outcomes import Action, Disposition, Outcome
from shoal_broker.routing.policies import NO_POLICY, EntityPolicy, entity_field
from shoal_broker.routing.storage import (
    NORMAL_BAND,
    QUEUE_GROUP,
    Entry,
    MessageStore,
    OutgoingMessage,
)
from shoal_broker.security.permissions import Operation
from shoal_broker.settings import AddressKind, BrokerSettings

logger = logging.getLogger(__name__)

OFFERED_CAPABILITIES = [
    'SHARED-SUBS',
    'ANONYMOUS-RELAY',
    'DELAYED_DELIVERY',
    'sole-connection-for-container',
]
PRODUCT = 'shoal'

RECOVERY_WAIT_STEP = 0.01
RECOVERY_WAIT_STEPS = 1000
"""Recovery waits up to 10 s for a fetch in flight to be answered before it returns entries."""

_DISPOSITIONS = {
    engine.OUTCOME_ACCEPTED: Disposition(Outcome.ACCEPTED),
    engine.OUTCOME_REJECTED: Disposition(Outcome.REJECTED),
    engine.OUTCOME_RELEASED: Disposition(Outcome.RELEASED),
    **{
        engine.OUTCOME_MODIFIED | failed | undeliverable: Disposition(
            Outcome.MODIFIED,
            delivery_failed=bool(failed),
            undeliverable_here=bool(undeliverable),
        )
        for failed in (0, engine.MODIFIED_FAILED)
        for undeliverable in (0, engine.MODIFIED_UNDELIVERABLE)
    },
}
"""A consumer's outcome by ``wire.shoal_outcome``'s code, shared (frozen): building one per
acknowledgement cost ~2.5 µs."""


class Broker:
    def __init__(self, settings: BrokerSettings, store: MessageStore, version: str) -> None:
        self.settings = settings
        self.store = store
        self.version = version
        self.container_id = f'shoal:{settings.replica_id}'
        self.connections: set[AmqpConnection] = set()
        self.subscriptions: dict[tuple[str, str], LocalSubscription] = {}
        self.by_address: dict[str, list[LocalSubscription]] = {}
        self.browsers: dict[str, set[BrowserLink]] = {}
        self.kinds: dict[str, AddressKind] = {}
        self.policies: dict[str, EntityPolicy] = {}
        """Declared queues' and subscriptions' policies by entity (``apply_policies``)."""
        self.accepting = True
        self._loop = asyncio.get_running_loop()
        self.coordinator = transactions.Coordinator(self)
        self.guard = Guard(settings.security, self)
        self.counters = Counters()
        self._dirty: set[AmqpConnection] = set()
        self._delivering: set[AmqpConnection] = set()
        """Dirty connections with transfers to write: flushed first (see mark_delivering)."""
        self._flush_scheduled = False
        self._topping_up: set[ProducerLink] = set()
        """Producers whose stored messages free credit: topped up once per loop turn."""
        self._on_stored = self._stored  # one bound method: publish_then batches by callback
        self._on_claimed = self._claimed  # and so does claim_then
        self._tasks: set[asyncio.Future[Any]] = set()
        self._serial = itertools.count(1)
        self._handlers: dict[int, Callable[[AmqpConnection, Ptr], None]] = {
            lib.PN_CONNECTION_REMOTE_OPEN: self._on_connection_remote_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self._on_connection_remote_close,
            lib.PN_SESSION_REMOTE_OPEN: self._on_session_remote_open,
            lib.PN_SESSION_REMOTE_CLOSE: self._on_session_remote_close,
            lib.PN_LINK_REMOTE_OPEN: self._on_link_remote_open,
            lib.PN_LINK_REMOTE_CLOSE: self._on_link_remote_detach,
            lib.PN_LINK_REMOTE_DETACH: self._on_link_remote_detach,
            lib.PN_LINK_FLOW: self._on_link_flow,
            lib.PN_TRANSPORT_ERROR: self._on_transport_error,
            lib.PN_TRANSPORT_TAIL_CLOSED: self._on_transport_tail_closed,
            lib.PN_TRANSPORT_CLOSED: self._on_transport_closed,
        }

    # -- connection bookkeeping (called by AmqpConnection) -------------------------------------

    def connection_opened(self, conn: AmqpConnection) -> None:
        self.connections.add(conn)
        logger.debug('connection %d from %s', conn.id, conn.peer)

    def connection_lost(self, conn: AmqpConnection) -> None:
        self._sweep(conn, session=None)
        self.connections.discard(conn)
        self._dirty.discard(conn)
        self._delivering.discard(conn)
        if conn.claimed_client is not None:
            client_id, holder = conn.claimed_client
            conn.claimed_client = None
            self.spawn(self._release_client(client_id, holder))

    async def _release_client(self, client_id: str, holder: str) -> None:
        try:
            await self.store.registry.release_client(client_id, holder)
        except BrokerError as exc:  # held until this replica's lease ends and it is reaped
            logger.warning('ClientID %r not released: %s', client_id, exc)

    def dispatch(self, conn: AmqpConnection, kind: int, event: Ptr) -> None:
        """An engine event of type ``kind`` other than a delivery's (``on_delivery``)."""
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(conn, event)

    def mark_dirty(self, conn: AmqpConnection) -> None:
        """Conn's engine has work from outside its own events: process it this loop turn."""
        self._dirty.add(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_dirty)

    def mark_delivering(self, conn: AmqpConnection) -> None:
        """``mark_dirty`` for a connection given deliveries: it is written before the others.
        One store reply often both accepts a producer's message and hands it to a consumer;
        writing the accept first let the woken producer take the CPU before the consumer's
        transfer went out (2 vCPUs, docs/performance.md#flush-order)."""
        self._delivering.add(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        if self._topping_up:  # before the swap below: their connections are dirty already
            producers, self._topping_up = self._topping_up, set()
            for producer in producers:
                if producer.alive:
                    self.top_up(producer)
        self._flush_scheduled = False
        delivering, self._delivering = self._delivering, set()
        dirty, self._dirty = self._dirty, set()
        for conn in delivering:
            if conn.alive:
                conn.process()
        for conn in dirty:
            if conn.alive and conn not in delivering:
                conn.process()

    async def settle_down(self, bound_seconds: float) -> None:
        """Wait (bounded) for background work: refusals, leaves, moves to dead-letter queues."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=bound_seconds)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> 'asyncio.Future[None]':
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- connections and sessions ----------------------------------------------------------------

    def _on_connection_remote_open(self, conn: AmqpConnection, event: Ptr) -> None:
        c = conn.connection
        conn.container_id = engine.remote_container(c)
        if conn.refusal is not None:  # a connection limit (amqp/guard.py)
            metrics.CONNECTIONS_REFUSED.labels(conn.refusal.condition).inc()
            self._open_connection(conn, refused=True)
            conn.fail(conn.refusal.condition, str(conn.refusal))
            return
        desired = engine.symbols(lib.pn_connection_remote_desired_capabilities(c))
        if 'sole-connection-for-container' in desired and conn.container_id and self.accepting:
            self.spawn(self._claim_then_open(conn, conn.container_id))
        else:
            self._open_connection(conn)

    def _open_connection(self, conn: AmqpConnection, *, refused: bool = False) -> None:
        c = conn.connection
        engine.set_container(c, self.container_id)
        engine.put_symbols(lib.pn_connection_offered_capabilities(c), OFFERED_CAPABILITIES)
        properties: dict[str, Any] = {'product': PRODUCT, 'version': self.version}
        if refused:  # Qpid JMS then waits for our Close and reads its error (facts §1.5)
            properties['amqp:connection-establishment-failed'] = True
        engine.put_map(lib.pn_connection_properties(c), properties)
        # Set only now: before Open, Qpid JMS may legitimately stay silent for minutes.
        idle_ms = int(self.settings.amqp.idle_timeout_seconds * 1000)
        lib.pn_transport_set_idle_timeout(conn.transport, idle_ms)
        if lib.pn_connection_state(c) & lib.PN_LOCAL_UNINIT:
            lib.pn_connection_open(c)
        for session in conn.pending_sessions:  # Begins that arrived while our Open was pending
            if lib.pn_session_state(session) & lib.PN_LOCAL_UNINIT:
                lib.pn_session_open(session)
        conn.pending_sessions.clear()
        conn.opened.set()
        if not self.accepting:
            conn.fail('amqp:connection:forced', 'broker is shutting down')

    async def _claim_then_open(self, conn: AmqpConnection, client_id: str) -> None:
        """Enforce sole-connection-for-container: one connection per ClientID, cluster-wide."""
        holder = f'{self.settings.replica_id}|{conn.id}'
        try:
            claimed = await self.store.registry.claim_client(client_id, holder)
        except BrokerError as exc:
            conn.opened.set()
            if conn.alive:
                metrics.CONNECTIONS_REFUSED.labels(exc.condition).inc()
                conn.fail(exc.condition, f'cannot check the ClientID: {exc}')
                self.mark_dirty(conn)
            return
        if not conn.alive:
            if claimed:
                await self.store.registry.release_client(client_id, holder)
            return
        conn.opened.set()  # from here on attaches may be answered (or refused with the Close)
        if claimed:
            conn.claimed_client = (client_id, holder)
            self._open_connection(conn)
        else:
            metrics.CONNECTIONS_REFUSED.labels('amqp:invalid-field').inc()
            self._open_connection(conn, refused=True)
            condition = lib.pn_connection_condition(conn.connection)
            engine.set_condition(
                condition, 'amqp:invalid-field', f'the ClientID {client_id!r} is already in use'
            )
            engine.set_condition_info(condition, {'invalid-field': 'container-id'})
            lib.pn_connection_close(conn.connection)
        self.mark_dirty(conn)

    def _on_connection_remote_close(self, conn: AmqpConnection, event: Ptr) -> None:
        self._sweep(conn, session=None)
        if conn.claimed_client is not None:
            # release the ClientID before answering: a client that reconnects the moment it
            # sees our Close must find it free
            client_id, holder = conn.claimed_client
            conn.claimed_client = None
            self.spawn(self._release_then_close(conn, client_id, holder))
        elif not lib.pn_connection_state(conn.connection) & lib.PN_LOCAL_CLOSED:
            lib.pn_connection_close(conn.connection)

    async def _release_then_close(self, conn: AmqpConnection, client_id: str, holder: str) -> None:
        await self._release_client(client_id, holder)
        if conn.alive and not lib.pn_connection_state(conn.connection) & lib.PN_LOCAL_CLOSED:
            lib.pn_connection_close(conn.connection)
            self.mark_dirty(conn)

    def _on_session_remote_open(self, conn: AmqpConnection, event: Ptr) -> None:
        session = lib.pn_event_session(event)
        if self.guard.session_refused(conn, session):
            return
        if not conn.opened.is_set():
            conn.pending_sessions.append(session)  # pipelined Begin: answered after our Open
        elif lib.pn_session_state(session) & lib.PN_LOCAL_UNINIT:
            lib.pn_session_open(session)

    def _on_session_remote_close(self, conn: AmqpConnection, event: Ptr) -> None:
        session = lib.pn_event_session(event)
        if session in conn.pending_sessions:
            conn.pending_sessions.remove(session)
        # JMS Session.close() sends `end` with no per-link detach: every link of the session
        # ends here (jms-amqp-facts §2.2).
        self._sweep(conn, session=session)
        if not lib.pn_session_state(session) & lib.PN_LOCAL_CLOSED:
            lib.pn_session_close(session)
        lib.pn_session_free(session)

    def _on_transport_error(self, conn: AmqpConnection, event: Ptr) -> None:
        if conn.handshake is not None and conn.handshake.failure is not None:
            return  # refused during SASL (logged then): proton only saw no AMQP header arrive
        condition = engine.condition_text(lib.pn_transport_condition(conn.transport))
        logger.info('connection %d from %s: transport error %s', conn.id, conn.peer, condition)

    def _on_transport_tail_closed(self, conn: AmqpConnection, event: Ptr) -> None:
        # proton stops reading some malformed input without an error and without writing a
        # Close (measured: it writes our Open, then nothing), so the socket would hang. Unless
        # the peer closed properly or hung up, try to say why, then hang up ourselves.
        remote_closed = lib.pn_connection_state(conn.connection) & lib.PN_REMOTE_CLOSED
        if not conn.input_ended and not remote_closed:
            logger.info('connection %d from %s: malformed input, closing', conn.id, conn.peer)
            conn.fail('amqp:connection:framing-error', 'malformed or truncated input')
            conn.hang_up_when_flushed = True

    def _on_transport_closed(self, conn: AmqpConnection, event: Ptr) -> None:
        self._sweep(conn, session=None)

    def _sweep(self, conn: AmqpConnection, session: Ptr | None) -> None:
        """A session or connection ended: every link on it is gone (no per-link events come)."""
        for ptr, state in list(conn.links.items()):
            if session is None or lib.pn_link_session(ptr) == session:
                del conn.links[ptr]
                self._link_gone(state)

    # -- links -----------------------------------------------------------------------------------

    def _on_link_remote_open(self, conn: AmqpConnection, event: Ptr) -> None:
        link = lib.pn_event_link(event)
        if not lib.pn_link_state(link) & lib.PN_LOCAL_UNINIT:
            return
        name = engine.link_name(link)
        if not self.accepting:
            attach.refuse(link, BrokerError('broker is shutting down'))
            return
        if (limited := self.guard.link_refusal(conn, link)) is not None:
            attach.refuse(link, limited)
            return
        if (too_big := attach.reply_refusal(conn, link)) is not None:
            logger.info('attach %r refused: %s', name, too_big)
            attach.refuse(link, too_big)
            return
        if lib.pn_link_is_sender(link):
            placeholder = LinkState(conn, link, name)
            conn.links[link] = placeholder
            self._answer_attach(conn, placeholder, attach.consumer(self, conn, link, name))
        else:
            state = ProducerLink(conn, link, name)
            conn.links[link] = state
            self._answer_attach(conn, state, attach.producer(self, state))

    def _answer_attach(
        self, conn: AmqpConnection, state: LinkState, work: Coroutine[Any, Any, LinkState | None]
    ) -> None:
        async def answer() -> None:
            try:
                await conn.opened.wait()  # a pipelined attach waits for our Open
                if not (state.alive and conn.alive):
                    work.close()  # the link went while we waited: its pointer may be freed
                    return
                result = await work
            except BrokerError as exc:
                logger.info('attach %r refused: %s', state.name, exc)
                self._refuse(conn, state, exc)
            except Exception:
                logger.exception('attach %r failed', state.name)
                self._refuse(conn, state, BrokerError('internal error'))
            else:
                if result is not None and result is not state:
                    conn.links[state.ptr] = result
            if conn.alive:
                self.mark_dirty(conn)

        self.spawn(answer())

    def _refuse(self, conn: AmqpConnection, state: LinkState, error: BrokerError) -> None:
        # The link is freed when the peer's detach arrives (_on_link_remote_detach), not here:
        # freeing it now would free it twice.
        if state.alive and conn.alive:
            attach.refuse(state.ptr, error)
            conn.links.pop(state.ptr, None)
            self._link_gone(state)

    def _on_link_remote_detach(self, conn: AmqpConnection, event: Ptr) -> None:
        link = lib.pn_event_link(event)
        closed = lib.pn_event_type(event) == lib.PN_LINK_REMOTE_CLOSE
        state = conn.links.pop(link, None)
        key = _durable_key(state) if closed else None
        left = self._link_gone(state, unsubscribing=key is not None) if state is not None else None
        if key is not None and state is not None:
            # detach(closed=true) on a durable subscription is JMS unsubscribe: the answering
            # detach waits for the store, and carries resource-locked while consumers remain
            consumer = state.consumer_key if isinstance(state, ConsumerLink) else ''
            self.spawn(self._unsubscribe_then_close(conn, link, key, consumer))
            return
        if left is not None:
            # JMS consumer.close() waits for this answer and may unsubscribe right after, from
            # any replica: answer once the consumer is unregistered cluster-wide, or that
            # unsubscribe would still find it and be refused with resource-locked.
            self.spawn(self._answer_detach_after(conn, link, closed, left))
            return
        self._answer_detach(link, closed)

    async def _answer_detach_after(
        self, conn: AmqpConnection, link: Ptr, closed: bool, left: 'asyncio.Future[None]'
    ) -> None:
        await asyncio.wait([left])
        if conn.alive:
            self._answer_detach(link, closed)
            self.mark_dirty(conn)

    def _answer_detach(self, link: Ptr, closed: bool, error: BrokerError | None = None) -> None:
        if lib.pn_link_state(link) & lib.PN_LOCAL_UNINIT:
            attach.mirror_termini(link)
        if not lib.pn_link_state(link) & lib.PN_LOCAL_CLOSED:
            if error is not None:
                engine.set_condition(lib.pn_link_condition(link), error.condition, str(error))
            if closed:
                lib.pn_link_close(link)
            else:
                lib.pn_link_detach(link)
        lib.pn_link_free(link)

    async def _unsubscribe_then_close(
        self, conn: AmqpConnection, link: Ptr, key: SubscriptionKey, consumer: str
    ) -> None:
        error: BrokerError | None = None
        try:
            await self.store.registry.unsubscribe(key, consumer)
        except BrokerError as exc:
            error = exc
        if conn.alive:
            self._answer_detach(link, True, error)
            self.mark_dirty(conn)

    def _link_gone(
        self, state: LinkState, *, unsubscribing: bool = False
    ) -> 'asyncio.Future[None] | None':
        """Forget a link; for a named subscription's consumer, the unregistering under way."""
        state.alive = False
        left = None
        if isinstance(state, ConsumerLink):
            left = self._consumer_gone(state, unsubscribing=unsubscribing)
        elif isinstance(state, BrowserLink):
            self.browsers.get(state.address, set()).discard(state)
        elif isinstance(state, transactions.CoordinatorLink):
            self.coordinator.coordinator_gone(state)
        if state.owned_temporary:
            self.spawn(self.delete_temporary(state.owned_temporary))
        return left

    def _consumer_gone(
        self, consumer: ConsumerLink, *, unsubscribing: bool = False
    ) -> 'asyncio.Future[None] | None':
        metrics.link_detached(consumer.deliveries)
        sub = consumer.subscription
        if sub is not None:
            sub.remove(consumer)
        unacked, consumer.unacked = consumer.unacked, {}
        for ahead in consumer.ahead.values():  # returned once the store names their entries
            ahead.settle = lambda entry: self._apply(consumer, entry, UNSETTLED_ON_DETACH)
        consumer.ahead.clear()
        returned = [] if consumer.owned_group else [
            self._apply(consumer, entry, UNSETTLED_ON_DETACH) for entry in unacked.values()
        ]  # fmt: skip
        left = None
        if consumer.owned_group:
            self.spawn(self._drop_subscription(consumer.address, consumer.group))
        elif consumer.named is not None and not unsubscribing:
            left = self.spawn(self._leave(consumer.named, consumer.consumer_key, returned))
        if sub is not None and not sub.consumers:
            del self.subscriptions[(sub.address, sub.group)]
            self.by_address[sub.address].remove(sub)
            if not self.by_address[sub.address]:
                del self.by_address[sub.address]
            self.store.watching.unwatch(sub.address, sub.on_notify)
        return left

    async def _leave(
        self, key: SubscriptionKey, consumer: str, returned: list[Awaitable[None] | None]
    ) -> None:
        """Unregister a consumer once its unsettled entries are back (a volatile subscription
        may be deleted with its last consumer, and must not get entries returned afterwards)."""
        await asyncio.gather(*(r for r in returned if r is not None), return_exceptions=True)
        with contextlib.suppress(BrokerError):
            await self.store.registry.leave_subscription(key, consumer)

    async def _drop_subscription(self, address: str, group: str) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.registry.delete_subscription(address, group)

    async def delete_temporary(self, address: str) -> None:
        """Delete a dynamic node; its consumers on this replica are detached."""
        for conn in list(self.connections):
            for state in list(conn.links.values()):
                if isinstance(state, ConsumerLink | BrowserLink) and state.address == address:
                    attach.close_link(state.ptr, 'amqp:resource-deleted', 'temporary node deleted')
                    self.mark_dirty(conn)
        self.kinds.pop(address, None)
        with contextlib.suppress(StoreUnavailable):
            await self.store.registry.delete_address(address)

    def subscription(self, address: str, group: str) -> LocalSubscription:
        sub = self.subscriptions.get((address, group))
        if sub is None:
            sub = LocalSubscription(self, address, group)
            sub.apply(self.policy(address, group), self.settings.routing)
            self.subscriptions[(address, group)] = sub
            self.by_address.setdefault(address, []).append(sub)
            self.store.watching.watch(address, sub.on_notify)
        return sub

    def policy(self, address: str, group: str) -> EntityPolicy:
        return self.policies.get(entity_field(address, group)) or NO_POLICY

    def apply_policies(self, policies: dict[str, EntityPolicy]) -> None:
        """The declared policies as just read from the store: every local subscription whose
        policy changed takes the new one (for its next deliveries and outcomes)."""
        if policies == self.policies:
            return
        self.policies = policies
        for (address, group), sub in self.subscriptions.items():
            sub.apply(self.policy(address, group), self.settings.routing)

    def next_serial(self) -> int:
        return next(self._serial)

    # -- addresses -------------------------------------------------------------------------------

    async def resolve(
        self, address: str, requested: AddressKind | None, creator: str | None = None
    ) -> AddressKind:
        """The kind of ``address``, creating it when allowed; BrokerError otherwise. A
        ``creator`` (user name) is held to its limit of addresses created on demand."""
        address = addresses.check_name(address)
        known = self.kinds.get(address)
        if known is not None and (requested is None or requested == known):
            return known
        existing = known or await self.store.registry.address_kind(address)
        decision = addresses.resolve(address, requested, existing, self.settings.routing)
        kind = decision.kind
        if decision.create:
            if creator is not None:
                self.guard.check_creation_room(creator)
            kind = await self.store.registry.create_address(address, decision.kind)
            if creator is not None:
                self.guard.address_created(creator)
            addresses.resolve(address, requested, kind, self.settings.routing)  # lost a race?
        self.kinds[address] = kind
        return kind

    # -- flow ------------------------------------------------------------------------------------

    def _on_link_flow(self, conn: AmqpConnection, event: Ptr) -> None:
        state = conn.links.get(lib.pn_event_link(event))
        if isinstance(state, ConsumerLink) and state.subscription is not None:
            state.subscription.credit_added(state)
        elif isinstance(state, BrowserLink):
            self.browse(state)

    def top_up(self, producer: ProducerLink) -> None:
        """Give a producer credit back as its messages are stored (the back-pressure valve)."""
        if self.guard.memory_high:  # back-pressure: credit again once memory falls
            return
        window = self.settings.amqp.producer_credit
        credit = lib.pn_link_credit(producer.ptr)
        grant = window - producer.in_store - len(producer.waiting) - credit
        if grant > 0 and (credit <= window // 2 or credit + grant >= window):
            lib.pn_link_flow(producer.ptr, grant)
            self.mark_dirty(producer.conn)

    # -- deliveries ------------------------------------------------------------------------------

    def on_delivery(self, conn: AmqpConnection, delivery: Ptr, link: Ptr) -> None:
        """A delivery's event: a message in, a consumer's outcome, a transaction's control."""
        state = conn.links.get(link)
        kind = type(state)  # exact types: none of these link classes has a subclass
        if kind is ProducerLink:
            self._incoming(state, delivery)  # type: ignore[arg-type]
        elif kind is ConsumerLink:
            self._disposition(state, delivery)  # type: ignore[arg-type]
        elif kind is transactions.CoordinatorLink:
            self.coordinator.control(state, delivery)  # type: ignore[arg-type]
        elif lib.pn_delivery_settled(delivery) or lib.pn_delivery_updated(delivery):
            lib.pn_delivery_settle(delivery)

    def _incoming(self, producer: ProducerLink, delivery: Ptr) -> None:
        size = wire.shoal_pending(delivery, self.settings.amqp.max_message_size)
        if size < 0:
            if size == engine.IN_ABORTED:
                lib.pn_delivery_settle(delivery)
                self.top_up(producer)
            elif size == engine.IN_TOO_BIG:
                limit = self.settings.amqp.max_message_size
                self._fail_link(producer, MessageSizeExceeded(
                    f'message exceeds the maximum size of {limit} bytes'))  # fmt: skip
            return  # IN_PARTIAL: the rest of it is still to come
        data, offsets, settled, transactional = engine.receive(producer.ptr, delivery, size)
        try:
            if data is None:
                raise codec.DecodeError('the transfer held fewer bytes than it announced')
            view = codec.parse(data[:]) if offsets is None else codec.view(data, offsets)
        except codec.DecodeError as exc:
            self._outcome(producer, delivery, settled, BrokerError(str(exc)), 'amqp:decode-error')
            return
        message = PendingMessage(delivery, view, settled)
        if transactional:
            txn_id, _ = transactions.transaction_of(lib.pn_delivery_remote(delivery))
            message.transaction = self.coordinator.find(txn_id)
            if message.transaction is None:
                self._outcome(producer, delivery, settled, transactions.UnknownTransaction(
                    'the send names no open transaction'))  # fmt: skip
                return
        if producer.address is not None and producer.kind is not None:
            self._publish(producer, message, producer.address, producer.kind)
        else:
            self._relay(producer, message)

    def _relay(self, producer: ProducerLink, message: PendingMessage) -> None:
        """Anonymous relay: the message names its address; order is kept per producer."""
        view = message.view
        if view.to and (denied := self.guard.refusal(producer.conn, Operation.SEND, view.to)):
            metrics.AUTHORIZATION_FAILURES.labels(Operation.SEND).inc()
            self._outcome(producer, message.delivery, message.settled, denied)
            return
        known = self.kinds.get(view.to or '')
        wanted = addresses.kind_from_jms_dest(view.annotations.get('x-opt-jms-dest'))
        if not producer.waiting and view.to and known and wanted in (None, known):
            self._publish(producer, message, view.to, known)
            return
        producer.waiting.append(message)
        if not producer.resolving:
            producer.resolving = True
            self.spawn(self._resolve_waiting(producer))

    async def _resolve_waiting(self, producer: ProducerLink) -> None:
        try:
            while producer.waiting and producer.alive:
                message = producer.waiting[0]
                view = message.view
                try:
                    if not view.to:
                        raise InvalidField('a message on the anonymous relay needs a "to" address')
                    wanted = addresses.kind_from_jms_dest(view.annotations.get('x-opt-jms-dest'))
                    kind = await self.resolve(view.to, wanted, user_name(producer.conn))
                except BrokerError as exc:
                    producer.waiting.popleft()
                    if producer.alive:
                        self._outcome(producer, message.delivery, message.settled, exc)
                    continue
                producer.waiting.popleft()
                if producer.alive:
                    self._publish(producer, message, view.to, kind)
        finally:
            producer.resolving = False

    def _publish(
        self, producer: ProducerLink, message: PendingMessage, address: str, kind: AddressKind
    ) -> None:
        view = message.view
        if (full := self.guard.store_full) is not None and message.transaction is None:
            self._outcome(producer, message.delivery, message.settled, full)
            return
        header = view.header
        stored = OutgoingMessage(  # positional: keyword construction costs ~2 µs per message
            outcomes.priority_band(header.priority),  # band
            view.header_bytes,
            view.rest,
            (  # expiry_ms
                outcomes.expiry_ms(int(time.time() * 1000), header.ttl, view.absolute_expiry_time)
                if header.ttl or view.absolute_expiry_time
                else 0
            ),
            producer.conn.container_id or '',  # origin
        )
        if message.transaction is not None:  # held until the transaction is discharged
            message.transaction.sends.append((address, kind, stored))
            if message.settled:
                lib.pn_delivery_settle(message.delivery)
            else:
                transactions.reply(
                    message.delivery,
                    transactions.TRANSACTIONAL_STATE,
                    transactions.accepted_in(message.transaction.id),
                )
            self.top_up(producer)
            self.mark_dirty(producer.conn)
            return
        due = view.annotations.get('x-opt-delivery-time')
        if kind is AddressKind.QUEUE and (sub := self.subscriptions.get((address, QUEUE_GROUP))):
            if (
                message.settled
                and due is None
                and not stored.expiry_ms
                and sub.take(producer, message, stored)
            ):  # handed to a consumer here, or held to be: never stored (subscriptions.py)
                lib.pn_delivery_settle(message.delivery)
                self._top_up_later(producer)
                return
            sub.spill()  # what it holds was published first
            if (
                not message.settled
                and due is None
                and not stored.expiry_ms
                and stored.band == NORMAL_BAND
                and (consumer := sub.ahead()) is not None
                and self.store.messages.can_claim(address)
            ):
                self._send_ahead(producer, message, address, sub, consumer, stored)
                return
        producer.in_store += 1
        if message.settled:  # pre-settled by the peer: nothing to answer, free it now
            lib.pn_delivery_settle(message.delivery)
        if isinstance(due, int) and due > time.time() * 1000:
            future = self.store.messages.schedule(address, stored, due)  # JMS delivery delay
            future.add_done_callback(  # type: ignore[attr-defined]
                lambda f: self._stored([(producer, message, address)], *_outcome_of(f))
            )
        else:
            self.store.messages.publish_then(
                address, kind, stored, self._on_stored, (producer, message, address)
            )
        # Local consumers of this address fetch in the same pipeline, right after the publish:
        # one Redis round trip from producer to consumer instead of two (other replicas hear of
        # it through the notification the publish sends).
        for sub in self.by_address.get(address, ()):
            sub.kick()

    def _send_ahead(
        self,
        producer: ProducerLink,
        message: PendingMessage,
        address: str,
        sub: LocalSubscription,
        consumer: ConsumerLink,
        stored: OutgoingMessage,
    ) -> None:
        """An at-least-once message goes to a waiting local consumer while Redis stores and claims
        it for this replica (``LocalSubscription.ahead``); the producer is answered by the store,
        as ever."""
        producer.in_store += 1
        ahead = consumer.send_ahead(stored)
        sub.claims += 1
        self.counters.delivered(address, QUEUE_GROUP, 1)
        consumer.deliveries.count += 1
        self.mark_delivering(consumer.conn)
        token = (producer, message, address, sub, consumer, ahead)
        self.store.messages.claim_then(address, QUEUE_GROUP, stored, self._on_claimed, token)

    def _claimed(
        self,
        claims: list[
            tuple[ProducerLink, PendingMessage, str, LocalSubscription, ConsumerLink, Ahead]
        ],
        result: tuple[list[str], list[Entry]] | None,
        error: BrokerError | None,
    ) -> None:
        """The store's answer for messages sent ahead: the producers are answered as for any
        publish; each delivery becomes an entry its consumer holds, and what its consumer decided
        meanwhile is applied. Refused, the messages were never stored: what the consumers do
        with them no longer matters to Redis, and each producer may send its message again."""
        self._stored([claim[:3] for claim in claims], True if error is None else None, error)
        for claim in claims:
            claim[3].claims -= 1
        # the subscription now (its consumers may all have left and others come meanwhile)
        address, latest = claims[0][2], claims[-1][3]
        sub = self.subscriptions.get((address, QUEUE_GROUP), latest)
        for *_, ahead in claims:  # whatever happens below, a discharge waits no longer
            if ahead.answered is not None:
                _answer(ahead.answered)  # its waiter resumes after this call: after the settle
        if result is None:
            for _, _, _, _, consumer, ahead in claims:
                consumer.ahead.pop(ahead.delivery, None)
            if isinstance(error, StoreUnavailable):  # the reply, not the script, may be lost
                self.schedule_recovery(sub, max(0.25, sub.retry_delay))
            else:
                sub.kick()
            return
        ids, read_ahead = result
        for (_, _, _, _, consumer, ahead), entry_id in zip(claims, ids, strict=True):
            stored = ahead.message
            entry = Entry(entry_id, stored.band, stored.header, stored.rest, 0, 0, stored.origin)
            if ahead.settle is not None:  # settled meanwhile, or its link went
                ahead.settle(entry)
            elif consumer.ahead.pop(ahead.delivery, None) is not None:
                consumer.unacked[ahead.delivery] = entry
            else:  # nothing holds it any more: never leave an entry stranded here
                self.release(address, QUEUE_GROUP, entry, delivery_failed=True)
        sub.claimed(read_ahead)

    def _settle_ahead(
        self, consumer: ConsumerLink, delivery: Ptr, disposition: Disposition
    ) -> None:
        """A peer's outcome for a delivery sent ahead: applied once the store names its entry."""
        ahead = consumer.ahead.pop(delivery, None)
        if ahead is not None:
            ahead.settle = lambda entry: self._apply(consumer, entry, disposition)

    def store_held(self, sub: LocalSubscription, held: list[Held]) -> None:
        """Messages a subscription held for hand-over go to the store after all, in order."""
        for producer, message, stored in held:
            producer.in_store += 1
            self.store.messages.publish_then(
                sub.address,
                AddressKind.QUEUE,
                stored,
                self._on_stored,
                (producer, message, sub.address),
            )
        sub.kick()

    def handed(self, consumer: ConsumerLink, count: int) -> None:
        """``count`` messages went to ``consumer`` without the store: enqueued and delivered."""
        self.counters.enqueued(consumer.address, QUEUE_GROUP, count)
        self.counters.delivered(consumer.address, QUEUE_GROUP, count)
        consumer.deliveries.count += count
        self.mark_delivering(consumer.conn)

    def _top_up_later(self, producer: ProducerLink) -> None:
        """Credit back once per producer and loop turn, however many of its messages were
        answered meanwhile (one store reply often settles many: ``_flush_dirty``)."""
        if producer not in self._topping_up:
            self._topping_up.add(producer)
            self.mark_dirty(producer.conn)

    def _stored(
        self,
        stored: list[tuple[ProducerLink, PendingMessage, str]],
        kept: bool | None,
        error: BrokerError | None,
    ) -> None:
        """The store's answer for messages to one address (``publish_then``: one call for a
        cycle's messages to an address and band)."""
        address = stored[0][2]
        refusal: BrokerError | None = None
        if error is None:
            if kept:  # a queue's records pair enqueues with deliveries; a topic's stand alone
                queue = self.kinds.get(address) is AddressKind.QUEUE
                self.counters.enqueued(address, QUEUE_GROUP if queue else '', len(stored))
            else:
                self.counters.dropped(address, len(stored))
            state = lib.PN_ACCEPTED
        else:
            if isinstance(error, AddressNotFound):
                self.kinds.pop(address, None)
            if isinstance(error, StoreFull | AddressNotFound):  # stays so if sent again
                refusal = error  # refused, not released
            # never an accept that is then lost: on a store failure the peer may send it again
            state = lib.PN_RELEASED
        for producer, message, _ in stored:
            producer.in_store -= 1
            if not producer.alive:
                continue  # stored (or not) all the same; the peer will not hear of it
            try:  # as when each message had its own callback: a failure leaves the others be
                if not message.settled:
                    if refusal is not None:
                        self._outcome(producer, message.delivery, False, refusal)
                        continue
                    wire.shoal_settle_with(message.delivery, state)
                self._top_up_later(producer)
            except Exception:
                logger.exception('answering a stored message on connection %d failed',
                                 producer.conn.id)  # fmt: skip

    def _outcome(
        self,
        producer: ProducerLink,
        delivery: Ptr,
        settled: bool,
        error: BrokerError,
        condition: str | None = None,
    ) -> None:
        """Reject one message with the error's condition; the link stays open."""
        metrics.publish_refused(error)
        if not settled:
            local = lib.pn_delivery_local(delivery)
            engine.set_condition(
                lib.pn_disposition_condition(local), condition or error.condition, str(error)
            )
            lib.pn_delivery_update(delivery, lib.PN_REJECTED)
        lib.pn_delivery_settle(delivery)
        self.top_up(producer)
        self.mark_dirty(producer.conn)

    def _fail_link(self, state: LinkState, error: BrokerError) -> None:
        state.conn.links.pop(state.ptr, None)
        self._link_gone(state)
        attach.close_link(state.ptr, error.condition, str(error))
        self.mark_dirty(state.conn)

    # -- consumer side -------------------------------------------------------------------------

    def sent(self, consumer: ConsumerLink, entries: list[Entry]) -> None:
        """``entries`` went out on ``consumer``'s link (one fetch's worth: counted at once)."""
        self.counters.delivered(consumer.address, consumer.group, len(entries))
        consumer.deliveries.count += len(entries)
        if consumer.presettled:  # at-most-once: consumed the moment it is sent
            self.store.messages.ack_nowait(consumer.address, consumer.group, entries)
        self.mark_delivering(consumer.conn)

    def on_accepts(self, conn: AmqpConnection, accepts: Ptr, count: int) -> None:
        """``count`` plain accepts of consumers on ``conn``, settled already by the engine's event
        walk (``wire.shoal_next_event``): (delivery, link) pairs in ``accepts``. Each consumer's
        entries are acked and counted together (``_accepted``, which ``_apply`` calls for one).
        A link that is not a consumer's (a browser's) needed nothing more than the settlement."""
        links = conn.links
        accepted: dict[ConsumerLink, list[Entry]] = {}
        for i in range(0, 2 * count, 2):
            consumer = links.get(accepts[i + 1])
            if type(consumer) is not ConsumerLink:
                continue
            entry = consumer.unacked.pop(accepts[i], None)
            if entry is None:
                if consumer.ahead:
                    self._settle_ahead(consumer, accepts[i], _DISPOSITIONS[engine.OUTCOME_ACCEPTED])
                continue
            entries = accepted.get(consumer)
            if entries is None:
                accepted[consumer] = [entry]
            else:
                entries.append(entry)
        for consumer, entries in accepted.items():
            self._accepted(consumer, entries)

    def _accepted(self, consumer: ConsumerLink, entries: list[Entry]) -> None:
        """Entries ``consumer`` accepted: counted with their latencies, acked without waiting."""
        now = time.time()
        # seconds since each entry was appended: stream ids start with their time in ms
        ages = [now - int(entry.id.partition('-')[0] or 0) / 1000 for entry in entries]
        self.counters.accepted_all(consumer.address, consumer.group, ages)
        self.store.messages.ack_nowait(consumer.address, consumer.group, entries)

    def _disposition(self, consumer: ConsumerLink, delivery: Ptr) -> None:
        code = wire.shoal_outcome(delivery)  # settles a terminal outcome
        if code == engine.OUTCOME_NONE:  # e.g. `received`: not an outcome yet
            return
        if code == engine.OUTCOME_TRANSACTIONAL:
            self._transactional_ack(consumer, delivery)
            return
        entry = consumer.unacked.pop(delivery, None)  # the pointer is only a key by now
        if entry is not None:
            self._apply(consumer, entry, _DISPOSITIONS[code])
        elif consumer.ahead:
            self._settle_ahead(consumer, delivery, _DISPOSITIONS[code])

    def _transactional_ack(self, consumer: ConsumerLink, delivery: Ptr) -> None:
        """An outcome inside a transaction: an accept is held until discharge; others apply."""
        txn_id, outcome = transactions.transaction_of(lib.pn_delivery_remote(delivery))
        entry = consumer.unacked.pop(delivery, None)
        lib.pn_delivery_settle(delivery)
        if entry is not None:
            self._transactional(consumer, entry, txn_id, outcome)
        elif (ahead := consumer.ahead.pop(delivery, None)) is not None:
            ahead.settle = lambda entry: self._transactional(consumer, entry, txn_id, outcome)
            txn = self.coordinator.find(txn_id)
            if txn is not None:
                ahead.answered = self._loop.create_future()
                txn.naming.append(ahead.answered)

    def _transactional(
        self, consumer: ConsumerLink, entry: Entry, txn_id: Any, outcome: Any
    ) -> None:
        txn = self.coordinator.find(txn_id)
        code = getattr(outcome, 'descriptor', transactions.ACCEPTED)
        if txn is not None and code == transactions.ACCEPTED:
            txn.acks.append((consumer.address, consumer.group, entry))
        elif code == transactions.ACCEPTED:  # its transaction is gone: as if rolled back
            self.release(consumer.address, consumer.group, entry, delivery_failed=True)
        else:
            fields = getattr(outcome, 'value', None) or []
            failed = bool(fields[0]) if code == 0x27 and fields else False
            kind = {0x25: Outcome.REJECTED, 0x26: Outcome.RELEASED}.get(code, Outcome.MODIFIED)
            self._apply(consumer, entry, Disposition(kind, delivery_failed=failed))

    def _apply(
        self, consumer: ConsumerLink, entry: Entry, disposition: Disposition
    ) -> Awaitable[None] | None:
        if disposition.outcome is Outcome.ACCEPTED:  # decide()'s first rule, without the call
            self._accepted(consumer, [entry])
            return None
        sub = consumer.subscription
        attempts = sub.max_delivery_attempts if sub else self.settings.routing.max_delivery_attempts
        decision = outcomes.decide(disposition, entry.delivery_count, attempts)
        self.counters.settled(consumer.address, consumer.group, disposition.outcome)
        if decision.action is Action.RETURN:
            if decision.exclude_consumer:
                consumer.excluded.add(entry.key)
            return self.release(
                consumer.address, consumer.group, entry, delivery_failed=decision.delivery_failed
            )
        self.dead_letter(consumer.address, consumer.group, entry, decision.reason)
        return None

    def release(
        self, address: str, group: str, entry: Entry, *, delivery_failed: bool, retry: float = 0.0
    ) -> Awaitable[None]:
        """Give an entry back to its subscription. A release Redis refuses (full, or out of
        reach) is tried again with a growing pause: the entry is pending on this replica and
        nothing else would ever return it while the replica lives."""
        released = asyncio.ensure_future(
            self.store.messages.release(address, group, entry, delivery_failed=delivery_failed)
        )

        def check(done: 'asyncio.Future[None]') -> None:
            if done.cancelled() or done.exception() is None:
                return
            if not self.accepting:  # shutting down: leaving returns what this replica holds
                return
            pause = min(MAX_RETRY_SECONDS, max(0.25, retry * 2))
            logger.warning('release of %s to %s/%s failed (%s); again in %.2f s',
                           entry.id, address, group, done.exception(), pause)  # fmt: skip
            self._loop.call_later(
                pause,
                lambda: self.release(
                    address, group, entry, delivery_failed=delivery_failed, retry=pause
                ),
            )

        released.add_done_callback(check)
        return released

    def filtered(self, address: str, group: str, entry: Entry) -> None:
        """An entry a subscription's selector or no-local filter excludes: consumed unseen."""
        self.counters.filtered(address, group)
        self.store.messages.ack_nowait(address, group, (entry,))

    def expire(self, address: str, group: str, entry: Entry) -> None:
        self.counters.expired(address, group)
        target = self.settings.routing.expiry_address
        if target and target != address:
            self.spawn(self._move(address, group, entry, target, 'expired'))
        else:
            self.store.messages.ack_nowait(address, group, (entry,))

    def dead_letter(self, address: str, group: str, entry: Entry, reason: str) -> None:
        self.counters.dead_lettered(address, group)
        sub = self.subscriptions.get((address, group))
        target = sub.dead_letter_address if sub else self.settings.routing.dead_letter_address
        if target and target != address:
            self.spawn(self._move(address, group, entry, target, reason))
        else:
            self.store.messages.ack_nowait(address, group, (entry,))

    async def _move(self, address: str, group: str, entry: Entry, target: str, why: str) -> None:
        """Copy an entry to another queue (dead letters, expiries), then consume the original."""
        try:
            await self.resolve(target, AddressKind.QUEUE)
            rest = codec.with_annotations(
                entry.rest,
                {'x-opt-shoal-original-address': address, 'x-opt-shoal-reason': why},
            )
            header = codec.delivery_header(entry.header, entry.delivery_count)
            moved = OutgoingMessage(entry.band, header, rest, 0)
            await self.store.messages.publish(target, AddressKind.QUEUE, moved)
            # the publish notifies other replicas only (as in _publish): wake ours, or a consumer
            # already attached here to the dead-letter or expiry queue would wait for the next one
            for sub in self.by_address.get(target, ()):
                sub.kick()
            await self.store.messages.ack(address, group, entry)
        except (BrokerError, codec.DecodeError) as exc:
            logger.warning('could not move %s from %s to %s: %s', entry.id, address, target, exc)
            if isinstance(exc, codec.DecodeError):
                # cannot be annotated: drop, counted
                await self.store.messages.ack(address, group, entry)
            else:
                self.release(address, group, entry, delivery_failed=False)

    def schedule_recovery(self, sub: LocalSubscription, delay: float) -> None:
        """After a failed fetch: return entries Redis handed us but we never got, then fetch."""
        self._loop.call_later(delay, lambda: self.spawn(self._recover(sub)))

    async def _recover(self, sub: LocalSubscription) -> None:
        sub.recovering = True  # no new fetch until the stranded entries are back
        try:
            for _ in range(RECOVERY_WAIT_STEPS):  # a fetch started meanwhile must land first
                if not sub.fetching:
                    break
                await asyncio.sleep(RECOVERY_WAIT_STEP)
            else:
                raise StoreUnavailable('a fetch is still unanswered')
            held = sub.held() | self.coordinator.held(sub.address, sub.group)
            returned = await self.store.messages.return_stranded(sub.address, sub.group, held)
        except BrokerError as exc:
            sub.retry_delay = min(MAX_RETRY_SECONDS, max(0.25, sub.retry_delay * 2))
            logger.warning('recovery of %s/%s postponed: %s', sub.address, sub.group, exc)
            self.schedule_recovery(sub, sub.retry_delay)
            return
        finally:
            sub.recovering = False
        if returned:
            logger.warning('%d entries of %s/%s recovered after a failed fetch',
                           returned, sub.address, sub.group)  # fmt: skip
        if (sub.address, sub.group) in self.subscriptions:
            sub.kick()

    def schedule_spill(self, sub: LocalSubscription, delay: float) -> None:
        self._loop.call_later(delay, sub.spill_stale)

    def schedule_park_check(self, sub: LocalSubscription, delay: float) -> None:
        self._loop.call_later(delay, sub.return_parked)

    def schedule_share_check(self, sub: LocalSubscription, delay: float) -> None:
        self._loop.call_later(delay, sub.check_share)

    def leave_sharing(self, sub: LocalSubscription) -> None:
        """The subscription's last consumer here left: out of its sharing between replicas
        (queued now, so a consumer attaching right after registers again behind it)."""
        self.spawn(self._quietly(self.store.messages.leave_sharing(sub.address, sub.group)))

    async def _quietly(self, done: Awaitable[None]) -> None:
        with contextlib.suppress(BrokerError):
            await done

    # -- browsers ------------------------------------------------------------------------------

    def add_browser(self, browser: BrowserLink) -> None:
        watchers = self.browsers.setdefault(browser.address, set())
        watchers.add(browser)
        self.browse(browser)

    def browse(self, browser: BrowserLink) -> None:
        if browser.busy:
            browser.again = True
            return
        credit = lib.pn_link_credit(browser.ptr) if browser.alive and browser.opened else 0
        if credit <= 0:
            return
        browser.busy, browser.again = True, False
        asked = min(credit, MAX_FETCH)
        future = self.store.messages.browse(browser.address, QUEUE_GROUP, browser.cursor, asked)
        future.add_done_callback(  # type: ignore[attr-defined]
            lambda f: self._browsed(browser, asked, f)
        )

    def _browsed(self, browser: BrowserLink, asked: int, future: asyncio.Future[Any]) -> None:
        browser.busy = False
        if not browser.alive:
            return
        try:
            entries, cursor = future.result()
        except BrokerError as exc:
            logger.warning('browse of %s failed: %s', browser.address, exc)
            entries, cursor = [], browser.cursor
        browser.cursor = cursor
        identifiers = Identifiers()
        selector = browser.selector
        browser.send(e for e in entries if selector is None or selector.matches(identifiers.of(e)))
        if len(entries) >= asked or browser.again:
            self.browse(browser)
        elif lib.pn_link_get_drain(browser.ptr):
            lib.pn_link_drained(browser.ptr)
        self.mark_dirty(browser.conn)

    # -- shutdown ------------------------------------------------------------------------------

    def _returner(self, consumer: ConsumerLink) -> 'Callable[[Entry], object]':
        """Returns an entry of ``consumer``'s without counting an attempt (a replica stopping)."""
        return lambda entry: self.release(
            consumer.address, consumer.group, entry, delivery_failed=False
        )

    def close_all(self, condition: str, description: str, *, stop_accepting: bool = True) -> None:
        """Close every connection (clients fail over elsewhere); by default stop taking more."""
        self.accepting = not stop_accepting
        for conn in list(self.connections):
            for state in list(conn.links.values()):
                if isinstance(state, ConsumerLink):
                    # not a failure of the consumer: return without counting an attempt
                    for entry in state.unacked.values():
                        self.release(state.address, state.group, entry, delivery_failed=False)
                    state.unacked.clear()
                    for ahead in state.ahead.values():
                        ahead.settle = self._returner(state)
                    state.ahead.clear()
            conn.fail(condition, description)
            conn.process()


def _answer(future: 'asyncio.Future[None]') -> None:
    if not future.done():
        future.set_result(None)


def _durable_key(state: LinkState | None) -> SubscriptionKey | None:
    """The durable subscription a closing link deletes (JMS unsubscribe), if any."""
    if isinstance(state, LookupLink):
        return state.key
    if isinstance(state, ConsumerLink) and state.named is not None and state.named.durable:
        return state.named
    return None


def _outcome_of(future: 'asyncio.Future[bool]') -> tuple[bool | None, BrokerError | None]:
    try:
        return future.result(), None
    except BrokerError as exc:
        return None, exc
