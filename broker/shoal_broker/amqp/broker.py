"""
The AMQP 1.0 node of one replica: its parts put together, and the switchboard of engine events.

A message's way through the parts, in the order a reader meets them:

- ``connection.py``: bytes in, engine events out to this switchboard (``dispatch``,
  ``on_delivery``, ``on_accepts``).
- ``connecting.py``: connections and sessions open and end; ``linking.py`` (with ``attach.py``):
  links attach and detach.
- ``producing.py``: a transfer in becomes a store write (or a hand-over, or a send ahead), and
  its producer is answered when the store is.
- ``subscriptions.py``: each local subscription fetches for its consumers' credit and deals
  entries out by the rules of ``routing/dispatch.py``.
- ``consuming.py``: what went out and what the peer decided; ``returns.py``: where an entry goes
  when no consumer keeps it; ``transactions.py``: outcomes and sends held until discharge.
- ``turns.py``: what all of them leave to be written at the end of the loop turn.

Lower parts know higher ones only through small protocols they declare (``connection.Node``,
``guard.Producers``, ``links.Feed``, ``subscriptions.Outlet`` and ``Intake``,
``attach.Attaching``); the import-linter contract in pyproject.toml keeps amqp/ in these layers.

Everything runs on the one asyncio loop; proton objects are touched only from it. Errors: a
``BrokerError`` refuses the one link or message concerned with its AMQP condition (DESIGN.md §8);
anything else is a bug, logged, and answered with ``amqp:internal-error`` on that link only.
"""

from collections.abc import Callable

from shoal_broker.amqp import transactions
from shoal_broker.amqp.browsing import Browsing
from shoal_broker.amqp.connecting import Connecting
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.consuming import Consuming
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.guard import Guard
from shoal_broker.amqp.holding import Holding
from shoal_broker.amqp.linking import Linking
from shoal_broker.amqp.links import BrowserLink, ConsumerLink, ProducerLink
from shoal_broker.amqp.nodes import Nodes
from shoal_broker.amqp.producing import Producing
from shoal_broker.amqp.returns import Returns
from shoal_broker.amqp.spans import Spans
from shoal_broker.amqp.subscriptions import LocalSubscription
from shoal_broker.amqp.turns import Turns
from shoal_broker.metrics.registry import Counters
from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.routing.storage import MessageStore
from shoal_broker.settings import BrokerSettings
from shoal_broker.tracing import start as start_tracing


class Broker:
    def __init__(self, settings: BrokerSettings, store: MessageStore, version: str) -> None:
        self.settings = settings
        self.store = store
        self.max_frame_size = settings.amqp.max_frame_size
        self.connections: set[AmqpConnection] = set()
        self.counters = Counters()
        self.guard = Guard(settings.security, self)
        self.turns = Turns(self.guard, settings.amqp.producer_credit)
        self.nodes = Nodes(settings, store, self.guard)
        self.returns = Returns(settings.routing, store, self.counters, self.turns, self.nodes)
        self.coordinator = transactions.Coordinator(
            store, self.turns, self.nodes, self.returns, settings.store.hold_seconds
        )
        self.consuming = Consuming(
            settings.routing, store, self.counters, self.turns, self.nodes, self.returns,
            self.coordinator,
        )  # fmt: skip
        self.browsing = Browsing(store, self.turns)
        self.linking = Linking(
            settings, store, self.guard, self.turns, self.nodes, self.browsing, self.consuming,
            self.coordinator, self.connections,
        )  # fmt: skip
        self.holding = Holding(
            self.turns, settings.store.hold_seconds, settings.store.hold_max_bytes, self._producers,
            store.messages.replica_ready,
        )  # fmt: skip
        self.producing = Producing(
            settings.amqp.max_message_size, store, self.guard, self.counters, self.turns,
            self.nodes, self.coordinator, self.consuming, self.linking, self.holding,
        )  # fmt: skip
        self.connecting = Connecting(
            settings, version, store, self.guard, self.turns, self.linking, self.consuming,
            self.connections,
        )  # fmt: skip
        self.nodes.feed(self.consuming, self.producing)
        tracing = start_tracing(settings.tracing, settings.replica_id)
        self.spans = None if tracing is None else Spans(tracing)
        self.producing.spans = self.consuming.spans = self.spans
        # the engine's hottest events go straight to their part (``connection.Node``)
        self.on_accepts = self.consuming.on_accepts
        self.connection_opened = self.connecting.connection_opened
        self.connection_lost = self.connecting.connection_lost
        self.top_up = self.turns.top_up  # guard.Producers
        self._handlers: dict[int, Callable[[AmqpConnection, Ptr], None]] = {
            lib.PN_CONNECTION_REMOTE_OPEN: self.connecting.on_connection_remote_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self.connecting.on_connection_remote_close,
            lib.PN_SESSION_REMOTE_OPEN: self.connecting.on_session_remote_open,
            lib.PN_SESSION_REMOTE_CLOSE: self.connecting.on_session_remote_close,
            lib.PN_LINK_REMOTE_OPEN: self.linking.on_link_remote_open,
            lib.PN_LINK_REMOTE_CLOSE: self.linking.on_link_remote_detach,
            lib.PN_LINK_REMOTE_DETACH: self.linking.on_link_remote_detach,
            lib.PN_LINK_FLOW: self._on_link_flow,
            lib.PN_TRANSPORT_ERROR: self.connecting.on_transport_error,
            lib.PN_TRANSPORT_TAIL_CLOSED: self.connecting.on_transport_tail_closed,
            lib.PN_TRANSPORT_CLOSED: self.connecting.on_transport_closed,
        }
        self._incoming = self.producing.incoming
        self._disposition = self.consuming.disposition
        self._control = self.coordinator.control

    # -- the switchboard -------------------------------------------------------------------------

    def dispatch(self, conn: AmqpConnection, kind: int, event: Ptr) -> None:
        """An engine event of type ``kind`` other than a delivery's (``on_delivery``)."""
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(conn, event)

    def on_delivery(self, conn: AmqpConnection, delivery: Ptr, link: Ptr) -> None:
        """A delivery's event: a message in, a consumer's outcome, a transaction's control."""
        state = conn.links.get(link)
        kind = type(state)  # exact types: none of these link classes has a subclass
        if kind is ProducerLink:
            self._incoming(state, delivery)  # type: ignore[arg-type]
        elif kind is ConsumerLink:
            self._disposition(state, delivery)  # type: ignore[arg-type]
        elif kind is transactions.CoordinatorLink:
            self._control(state, delivery)  # type: ignore[arg-type]
        elif lib.pn_delivery_settled(delivery) or lib.pn_delivery_updated(delivery):
            lib.pn_delivery_settle(delivery)

    def _on_link_flow(self, conn: AmqpConnection, event: Ptr) -> None:
        state = conn.links.get(lib.pn_event_link(event))
        if isinstance(state, ConsumerLink) and state.subscription is not None:
            state.subscription.credit_added(state)
        elif isinstance(state, BrowserLink):
            self.browsing.browse(state)

    def _producers(self) -> list[ProducerLink]:
        return [
            state
            for conn in self.connections
            for state in conn.links.values()
            if isinstance(state, ProducerLink) and state.opened
        ]

    # -- what the composition root (app.py) asks of the node -------------------------------------

    @property
    def accepting(self) -> bool:
        return self.turns.accepting

    @property
    def subscriptions(self) -> dict[tuple[str, str], LocalSubscription]:
        return self.nodes.subscriptions

    def apply_policies(self, policies: dict[str, EntityPolicy]) -> None:
        self.nodes.apply_policies(policies)

    def close_all(self, condition: str, description: str, *, stop_accepting: bool = True) -> None:
        """Close every connection (clients fail over elsewhere); by default stop taking more."""
        self.connecting.close_all(condition, description, stop_accepting=stop_accepting)

    def quiesce(self) -> None:
        """Stopping: take and hand out nothing more; what is under way goes on (``owed``)."""
        self.connecting.quiesce()

    def close_settled(self, condition: str, description: str) -> tuple[int, int, int]:
        """Close the connections that owe nothing; (connections left, their sends, deliveries)."""
        return self.connecting.close_settled(condition, description)

    def owed(self) -> tuple[int, int]:
        """(sends owed an answer, deliveries not settled by their consumers) on this replica."""
        return self.connecting.owed()

    async def settle_down(self, bound_seconds: float) -> None:
        """Wait (bounded) for background work: refusals, leaves, moves to dead-letter queues."""
        await self.turns.settle_down(bound_seconds)

    def close_tracing(self) -> None:
        """End the spans still open and export what is buffered (a blocking call)."""
        if self.spans is not None:
            self.spans.close()
