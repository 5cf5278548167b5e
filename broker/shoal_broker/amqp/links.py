"""
What the broker remembers about each attached link, and how a message leaves on one.

Keyed by the link's cffi pointer in ``AmqpConnection.links``; each kind extends
``connection.LinkState``. ``alive`` turns False the moment the link, its session or its connection
goes away; store replies that arrive later check it before touching proton, because by then the
pointer may be freed. ``close_link`` closes our end of one with an error.
"""

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from shoal_broker import selector as selectors
from shoal_broker.amqp import codec, engine, recode
from shoal_broker.amqp.connection import LinkState as LinkState
from shoal_broker.amqp.engine import Ptr, lib, wire
from shoal_broker.metrics.registry import LinkDeliveries
from shoal_broker.routing.jms_subscriptions import SubscriptionKey
from shoal_broker.routing.outcomes import Disposition, Outcome
from shoal_broker.routing.storage import BrowseCursor, Entry, OutgoingMessage
from shoal_broker.settings import AddressKind

# Deliveries still unsettled when a consumer link goes away get the outcome Qpid JMS declares as
# its source's default-outcome: modified(delivery-failed). proton-c does not expose the peer's
# default-outcome, so this is the broker's rule for every peer; it makes JMSRedelivered true,
# which is the honest answer when the application may have seen the message.
UNSETTLED_ON_DETACH = Disposition(Outcome.MODIFIED, delivery_failed=True)


def transfer(
    link: Ptr, serial: int, entries: Iterable[Entry], unacked: dict[Ptr, Entry] | None
) -> int:
    """Send stored entries on a sending link, in order, and return the last serial used: the
    delivery tags are the link's serial numbers after ``serial``. With ``unacked``, each delivery
    is recorded there against its entry; without, the transfers go settled and their deliveries
    are proton's to free. One call per fetch's worth of a link's entries: three calls per
    message were ~0.5 µs."""
    send = wire.shoal_send
    settle = unacked is None
    for entry in entries:
        serial += 1
        header = entry.header
        if entry.delivery_count:  # a first delivery sends the stored bytes unchanged
            header = recode.delivery_header(header, entry.delivery_count)
        rest = entry.rest
        delivery = send(link, serial, header, len(header), rest, len(rest), settle)
        if unacked is not None:
            unacked[delivery] = entry
    return serial


@dataclasses.dataclass(eq=False, slots=True)
class PendingMessage:
    delivery: Ptr
    view: codec.RoutingView
    settled: bool
    transaction: Any = None
    """The ``transactions.Transaction`` this send belongs to, if any."""
    stored: OutgoingMessage | None = None
    """What is written to the store, kept for a write held through an outage (``holding.py``)."""
    kind: AddressKind | None = None
    due: int | None = None
    """A delayed message's delivery time (ms since the epoch)."""


@dataclasses.dataclass(eq=False, slots=True)
class ProducerLink(LinkState):
    """A peer's sender: messages come in on our receiving end."""

    address: str | None = None
    """None for the anonymous relay: each message names its address in ``to``."""
    kind: AddressKind | None = None
    in_store: int = 0
    """Messages read from this link whose store write has not been answered yet."""
    waiting: collections.deque[PendingMessage] | None = None
    """Anonymous-relay messages queued behind an address lookup, in arrival order; made on the
    first one (an empty deque is 760 bytes, and most producers never wait)."""
    resolving: bool = False


@dataclasses.dataclass(eq=False, slots=True)
class Ahead:
    """A delivery sent ahead of the store (``LocalSubscription.ahead``) whose entry id Redis has
    not named yet. What the peer decides meanwhile waits here (``settle``) and is applied to the
    entry once it is known; until then the delivery is in its consumer's ``ahead``, not
    ``unacked``."""

    delivery: Ptr
    message: OutgoingMessage
    settle: 'Callable[[Entry], object] | None' = None
    answered: 'asyncio.Future[None] | None' = None
    """Resolved once the store answered (``Producing._claimed``), for a transaction to wait on."""


class Feed(Protocol):
    """What a consumer link knows of the local subscription feeding it
    (``subscriptions.LocalSubscription``)."""

    address: str
    group: str
    consumers: 'list[ConsumerLink]'
    max_delivery_attempts: int
    exclusive: bool

    def credit_added(self, consumer: 'ConsumerLink') -> None: ...

    def remove(self, consumer: 'ConsumerLink') -> None: ...

    def on_notify(self, address: str) -> None: ...

    def gave_back(self) -> None: ...


@dataclasses.dataclass(eq=False, slots=True)
class ConsumerLink(LinkState):
    """A peer's receiver: messages go out on our sending end."""

    address: str = ''
    group: str = ''
    presettled: bool = False
    subscription: Feed | None = None
    unacked: dict[Ptr, Entry] = dataclasses.field(default_factory=dict)
    ahead: dict[Ptr, Ahead] = dataclasses.field(default_factory=dict)
    """Deliveries sent ahead of the store, unsettled, whose entry ids are not known yet."""
    stopped: bool = False
    """The replica is stopping (``Connecting.quiesce``): dealt nothing more, whatever credit."""
    excluded: set[tuple[int, str]] = dataclasses.field(default_factory=set)
    """Entries this consumer settled as undeliverable-here: never offered to it again."""
    owned_group: bool = False
    """The subscription exists for this link alone (non-durable topic consumer)."""
    named: SubscriptionKey | None = None
    """The durable or shared JMS subscription this link consumes from, if any."""
    consumer_key: str = ''
    """This link's registration among the named subscription's consumers cluster-wide."""
    line: str = ''
    """This link's place in an exclusive entity's line, unique on this replica
    (``routing/exclusive.py``)."""
    selector: selectors.Selector | None = None
    no_local: bool = False
    """Skip messages published by this link's own connection (JMS noLocal)."""
    deliveries: LinkDeliveries = dataclasses.field(default_factory=LinkDeliveries)
    """What was sent on this link, for ``shoal_consumer_deliveries`` (registered once attached)."""
    _tag: int = 0

    @property
    def filtered(self) -> bool:
        return self.selector is not None or self.no_local

    def wants(self, entry: Entry, identifiers: 'Identifiers') -> bool:
        """Whether this consumer's selector and no-local filter let ``entry`` through."""
        if self.no_local and entry.origin and entry.origin == self.conn.container_id:
            return False
        return self.selector is None or self.selector.matches(identifiers.of(entry))

    def credit(self) -> int:
        live = self.alive and self.opened and not self.stopped
        return int(lib.pn_link_credit(self.ptr)) if live else 0

    def send(self, entries: Iterable[Entry]) -> None:
        """Transfer entries; the header is re-encoded only when the delivery count changed."""
        unacked = None if self.presettled else self.unacked
        self._tag = transfer(self.ptr, self._tag, entries, unacked)

    def hand(self, messages: Iterable[OutgoingMessage]) -> None:
        """Transfer messages that were never stored (``LocalSubscription.take``), settled: only
        a pre-settled consumer is handed any. A first delivery, so the bytes go as received."""
        send = wire.shoal_send
        serial = self._tag
        for message in messages:
            serial += 1
            header, rest = message.header, message.rest
            send(self.ptr, serial, header, len(header), rest, len(rest), True)
        self._tag = serial

    def send_ahead(self, message: OutgoingMessage) -> Ahead:
        """Transfer a message, unsettled, before the store has it (``LocalSubscription.ahead``):
        a first delivery, so the bytes go as received."""
        self._tag += 1
        header, rest = message.header, message.rest
        delivery = wire.shoal_send(self.ptr, self._tag, header, len(header), rest, len(rest), False)
        ahead = self.ahead[delivery] = Ahead(delivery, message)
        return ahead


class Identifiers:
    """Selector identifiers of the entry being dealt, decoded at most once and only if asked."""

    def __init__(self) -> None:
        self._entry: Entry | None = None
        self._ids: dict[str, object] = {}

    def of(self, entry: Entry) -> dict[str, object]:
        if entry is not self._entry:
            self._entry = entry
            try:
                view = codec.selection_view(entry.header, entry.rest)
            except codec.DecodeError:
                self._ids = {}  # every identifier unknown: only `IS NULL` tests can match
            else:
                self._ids = selectors.identifiers(
                    view.header, view.properties, view.application_properties, view.annotations
                )
        return self._ids


@dataclasses.dataclass(eq=False, slots=True)
class LookupLink(LinkState):
    """A null-source link naming a durable subscription (Qpid JMS unsubscribe): closing it
    deletes the subscription."""

    key: SubscriptionKey | None = None


@dataclasses.dataclass(eq=False, slots=True)
class BrowserLink(LinkState):
    """A queue browser: a non-destructive, settled view of what a queue holds."""

    address: str = ''
    selector: selectors.Selector | None = None
    cursor: BrowseCursor = dataclasses.field(default_factory=BrowseCursor)
    busy: bool = False
    again: bool = False
    _tag: int = 0

    def send(self, entries: Iterable[Entry]) -> None:
        self._tag = transfer(self.ptr, self._tag, entries, None)  # browsing is settled


def close_link(link: Ptr, condition: str, description: str) -> None:
    """Close our end of an attached link with an error; the peer's detach frees it."""
    if lib.pn_link_state(link) & lib.PN_LOCAL_CLOSED:
        return
    engine.set_condition(lib.pn_link_condition(link), condition, description)
    if lib.pn_link_state(link) & lib.PN_LOCAL_UNINIT:
        lib.pn_link_open(link)
    lib.pn_link_close(link)
