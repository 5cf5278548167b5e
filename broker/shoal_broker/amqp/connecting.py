"""
Connections and sessions come and go: the Open answered (with this replica's capabilities, or a
refusal the client can read), sole-connection-for-container held cluster-wide (its check waits
through a store outage within the hold's bound), pipelined Begins answered after our Open,
and every link of an ended session or connection forgotten.

proton sends no per-link events when a session or connection ends (``sweep``), and stops reading
some malformed input without a word (``on_transport_tail_closed``): both are answered here.
"""

import asyncio
import logging
from typing import Any

from shoal_broker.amqp import engine
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.consuming import Consuming
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.guard import Guard
from shoal_broker.amqp.linking import Linking
from shoal_broker.amqp.links import ConsumerLink, ProducerLink
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError, StoreUnavailable
from shoal_broker.metrics import registry as metrics
from shoal_broker.routing.storage import MessageStore
from shoal_broker.settings import BrokerSettings

logger = logging.getLogger(__name__)

OFFERED_CAPABILITIES = [
    'SHARED-SUBS',
    'ANONYMOUS-RELAY',
    'DELAYED_DELIVERY',
    'sole-connection-for-container',
]
PRODUCT = 'shoal'
CLAIM_PAUSES = (0.05, 0.1, 0.2, 0.25)
"""Pauses between ClientID checks while the store does not answer (the last one repeated): the
longest is what an Open may wait past the store's return, as for a held send
(``holding.PAUSES``)."""


class Connecting:
    def __init__(
        self,
        settings: BrokerSettings,
        version: str,
        store: MessageStore,
        guard: Guard,
        turns: Turns,
        linking: Linking,
        consuming: Consuming,
        connections: set[AmqpConnection],
    ) -> None:
        self.settings = settings
        self.version = version
        self.container_id = f'shoal:{settings.replica_id}'
        self.store = store
        self.guard = guard
        self.turns = turns
        self.linking = linking
        self.consuming = consuming
        self.connections = connections
        self.mark_dirty = turns.mark_dirty
        self.spawn = turns.spawn

    def connection_opened(self, conn: AmqpConnection) -> None:
        self.connections.add(conn)
        logger.debug('connection %d from %s', conn.id, conn.peer)

    def connection_lost(self, conn: AmqpConnection) -> None:
        self.sweep(conn, session=None)
        self.connections.discard(conn)
        self.turns.forget(conn)
        if conn.claimed_client is not None:
            client_id, holder = conn.claimed_client
            conn.claimed_client = None
            self.spawn(self._release_client(client_id, holder))

    async def _release_client(self, client_id: str, holder: str) -> None:
        try:
            await self.store.registry.release_client(client_id, holder)
        except BrokerError as exc:  # held until this replica's lease ends and it is reaped
            logger.warning('ClientID %r not released: %s', client_id, exc)

    def on_connection_remote_open(self, conn: AmqpConnection, event: Ptr) -> None:
        self.guard.opened(conn)
        c = conn.connection
        conn.container_id = engine.remote_container(c)
        if conn.refusal is not None:  # a connection limit (amqp/guard.py)
            metrics.CONNECTIONS_REFUSED.labels(conn.refusal.condition).inc()
            self._open_connection(conn, refused=True)
            conn.fail(conn.refusal.condition, str(conn.refusal))
            return
        desired = engine.symbols(lib.pn_connection_remote_desired_capabilities(c))
        if (
            'sole-connection-for-container' in desired
            and conn.container_id
            and self.turns.accepting
        ):
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
        if not self.turns.accepting:
            conn.fail('amqp:connection:forced', 'broker is shutting down')

    async def _claim_then_open(self, conn: AmqpConnection, client_id: str) -> None:
        """Enforce sole-connection-for-container: one connection per ClientID, cluster-wide."""
        holder = f'{self.settings.replica_id}|{conn.id}'
        try:
            claimed = await self._claim_within_hold(conn, client_id, holder)
        except BrokerError as exc:
            conn.opened.set()
            if conn.alive:  # refused as Qpid JMS reads it: Open, then a Close that says why
                metrics.CONNECTIONS_REFUSED.labels(exc.condition).inc()
                self._open_connection(conn, refused=True)
                conn.fail(exc.condition, self._unchecked(client_id, exc))
                self.mark_dirty(conn)
            else:  # an attempt whose reply was lost may have claimed it
                self.spawn(self._release_client(client_id, holder))
            return
        if not conn.alive:
            self.spawn(self._release_client(client_id, holder))  # claimed, or perhaps claimed
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

    async def _claim_within_hold(self, conn: AmqpConnection, client_id: str, holder: str) -> bool:
        """Claim the ClientID, trying again through a store outage for up to the hold's bound
        (``SHOAL_STORE_HOLD_SECONDS``), as a held send waits: a client that connects while the
        store fails over gets its Open answered once the store is back, not refused. Stops
        early when the client hangs up (False: whatever it claimed is released)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.store.hold_seconds
        pause = CLAIM_PAUSES[0]
        attempt = 0
        while True:
            try:
                return await self.store.registry.claim_client(client_id, holder)
            except StoreUnavailable:
                left = deadline - loop.time()
                if left <= 0 or not conn.alive:
                    raise
                if attempt == 0:
                    logger.warning('ClientID %r waits for the store to answer', client_id)
            await asyncio.sleep(min(pause, left))  # a last attempt at the bound itself
            if not conn.alive:
                return False
            attempt += 1
            pause = CLAIM_PAUSES[min(attempt, len(CLAIM_PAUSES) - 1)]

    def _unchecked(self, client_id: str, exc: BrokerError) -> str:
        if not isinstance(exc, StoreUnavailable) or self.settings.store.hold_seconds <= 0:
            return f'cannot check the ClientID {client_id!r}: {exc}'
        return (
            f'the message store did not answer for {self.settings.store.hold_seconds:g} s: the '
            f'ClientID {client_id!r} could not be checked (connect again once the store is '
            f'back; {exc})'
        )

    def on_connection_remote_close(self, conn: AmqpConnection, event: Ptr) -> None:
        self.sweep(conn, session=None)
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

    def on_session_remote_open(self, conn: AmqpConnection, event: Ptr) -> None:
        session = lib.pn_event_session(event)
        if self.guard.session_refused(conn, session):
            return
        if not conn.opened.is_set():
            conn.pending_sessions.append(session)  # pipelined Begin: answered after our Open
        elif lib.pn_session_state(session) & lib.PN_LOCAL_UNINIT:
            lib.pn_session_open(session)

    def on_session_remote_close(self, conn: AmqpConnection, event: Ptr) -> None:
        session = lib.pn_event_session(event)
        if session in conn.pending_sessions:
            conn.pending_sessions.remove(session)
        # JMS Session.close() sends `end` with no per-link detach: every link of the session
        # ends here (jms-amqp-facts §2.2).
        self.sweep(conn, session=session)
        if not lib.pn_session_state(session) & lib.PN_LOCAL_CLOSED:
            lib.pn_session_close(session)
        lib.pn_session_free(session)

    def on_transport_error(self, conn: AmqpConnection, event: Ptr) -> None:
        if conn.handshake is not None and conn.handshake.failure is not None:
            return  # refused during SASL (logged then): proton only saw no AMQP header arrive
        condition = engine.condition_text(lib.pn_transport_condition(conn.transport))
        logger.info('connection %d from %s: transport error %s', conn.id, conn.peer, condition)

    def on_transport_tail_closed(self, conn: AmqpConnection, event: Ptr) -> None:
        # proton stops reading some malformed input without an error and without writing a
        # Close (measured: it writes our Open, then nothing), so the socket would hang. Unless
        # the peer closed properly or hung up, try to say why, then hang up ourselves.
        remote_closed = lib.pn_connection_state(conn.connection) & lib.PN_REMOTE_CLOSED
        if not conn.input_ended and not remote_closed:
            logger.info('connection %d from %s: malformed input, closing', conn.id, conn.peer)
            conn.fail('amqp:connection:framing-error', 'malformed or truncated input')
            conn.hang_up_when_flushed = True

    def on_transport_closed(self, conn: AmqpConnection, event: Ptr) -> None:
        self.sweep(conn, session=None)

    def sweep(self, conn: AmqpConnection, session: Ptr | None) -> None:
        """A session or connection ended: every link on it is gone (no per-link events come)."""
        for ptr, state in list(conn.links.items()):
            if session is None or lib.pn_link_session(ptr) == session:
                del conn.links[ptr]
                self.linking.link_gone(state)

    def close_all(self, condition: str, description: str, *, stop_accepting: bool = True) -> None:
        """Close every connection (clients fail over elsewhere); by default stop taking more.
        Their consumers' unsettled deliveries went out on the wire, so they are returned as when
        a consumer goes away (``links.UNSETTLED_ON_DETACH``: delivery-count + 1, JMSRedelivered
        for whoever gets them next); what was never sent (parked, held) goes back unchanged."""
        self.turns.accepting = not stop_accepting
        for conn in list(self.connections):
            conn.fail(condition, description)
            conn.process()

    def close_one(self, conn: AmqpConnection, condition: str, description: str) -> None:
        """Close one connection; what its consumers hold goes back without counting an
        attempt (an operator's close is not a failure of the consumer; a replica stopping
        drains first and counts what is still out: ``close_all``)."""
        for state in list(conn.links.values()):
            if isinstance(state, ConsumerLink):
                for entry in state.unacked.values():
                    self.consuming.release(state.address, state.group, entry, delivery_failed=False)
                state.unacked.clear()
                for ahead in state.ahead.values():
                    ahead.settle = self.consuming.returner(state)
                state.ahead.clear()
        conn.fail(condition, description)
        conn.process()

    def quiesce(self) -> None:
        """Stop handing out work: no connection or attach is taken, no consumer is dealt another
        message (``ConsumerLink.credit``), and producers get no more credit (``Turns.top_up``)
        and are asked to give back what they hold (a drain: Qpid JMS answers it at once, with
        what it had to send sent). What is under way goes on to its answer (``owed``)."""
        self.turns.accepting = False
        for conn in self.connections:
            for state in conn.links.values():
                if isinstance(state, ConsumerLink):
                    state.stopped = True
                elif isinstance(state, ProducerLink) and state.alive:
                    lib.pn_link_set_drain(state.ptr, True)
            self.turns.mark_dirty(conn)

    def close_settled(self, condition: str, description: str) -> tuple[int, int, int]:
        """Close each connection that owes nothing (``owed``), so its clients move as soon as
        they can; return (connections still open, sends and deliveries they owe)."""
        left = sends = deliveries = 0
        for conn in list(self.connections):
            if lib.pn_connection_state(conn.connection) & lib.PN_LOCAL_CLOSED:
                continue
            owed = _owed(conn)
            if any(owed):
                left += 1
                sends += owed[0]
                deliveries += owed[1]
            else:
                conn.fail(condition, description)
                conn.process()
        return left, sends, deliveries

    def owed(self) -> tuple[int, int]:
        """(sends owed an answer or credit not given back, deliveries not settled yet)."""
        sends = deliveries = 0
        for conn in self.connections:
            s, d = _owed(conn)
            sends += s
            deliveries += d
        return sends, deliveries


def _owed(conn: AmqpConnection) -> tuple[int, int]:
    sends = deliveries = 0
    for state in conn.links.values():
        if isinstance(state, ProducerLink):
            sends += state.in_store + len(state.waiting or ())
            if state.alive:
                sends += lib.pn_link_credit(state.ptr)
        elif isinstance(state, ConsumerLink):
            deliveries += len(state.unacked) + len(state.ahead)
    return sends, deliveries
