"""
The persistence ports: what the protocol edge needs from the store, one port per role.

Implemented by :mod:`shoal_broker.store.redisstore` and its parts; the AMQP edge is handed an
instance by :mod:`shoal_broker.app` and never imports the implementation, and each of its
modules depends on the ports it uses. Calls that sit on the per-message path (``publish``,
``fetch``, ``ack``, ``release``) return awaitables and are batched by the store into one Redis
round trip per event-loop turn; none of them costs a round trip of its own.
"""

import dataclasses
import enum
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from shoal_broker.errors import BrokerError
from shoal_broker.routing._entry import Entry as Entry  # C: see routing/_entry.c
from shoal_broker.routing.jms_subscriptions import SubscriptionKey, SubscriptionSpec
from shoal_broker.settings import AddressKind

QUEUE_GROUP = 'queue'
"""The subscription of a queue: all its consumers compete in it."""

LEVELS = 10
"""JMS priority levels, 0 to 9; each has a band of its own (one stream per address)."""
BANDS = tuple(range(LEVELS))
"""Bands in the order consumers are served: band ``9 - priority``, so band 0 holds priority 9
and sorts first wherever an entry's band leads a member (``store/keys.entry_member``)."""
NORMAL_BAND = 5
"""The band of priority 4, AMQP's and JMS's default: the one the fast paths serve."""


@dataclasses.dataclass(slots=True)  # not frozen: built once per message
class OutgoingMessage:
    """A message as stored: encoded header, and everything after it byte for byte."""

    band: int
    header: bytes
    rest: bytes
    expiry_ms: int = 0
    """Absolute expiry, ms since the epoch; 0 means never."""
    origin: str = ''
    """Container-id of the publishing connection (no-local subscribers skip their own)."""
    duplicate_id: bytes | None = None
    """The id duplicate detection checks (``amqp/duplicate_ids.py``); None: not checked."""
    last_value: bytes | None = None
    """The key of a last-value queue's message (its typed value, as ``duplicate_id``; b'': none,
    never replaced); None: not a last-value queue. Set with ``duplicate_id`` b'' at least, so that
    the message takes the checked publish path."""
    group: str = ''
    """properties.group-id (JMSXGroupID); '': ungrouped (docs/architecture.md, "Message
    groups")."""


GROUP_SEPARATOR = '\x1f'
"""Joins the origin and the group in the one script argument that carries both
(``stored_origin``); ``new_entry_fields.lua`` splits them into the fields ``c`` and ``g``."""


def stored_origin(message: OutgoingMessage) -> str:
    """The origin argument of the scripts that append entries: the origin, and the group after
    ``GROUP_SEPARATOR`` when the message has one (an argument more per message would change
    every appending script's stride)."""
    if message.group:
        return f'{message.origin}{GROUP_SEPARATOR}{message.group}'
    return message.origin


@dataclasses.dataclass(frozen=True, slots=True)
class DuplicateWindow:
    """An address's duplicate detection: the ids of its last ``count`` messages stored within
    ``seconds`` are remembered, and a message with one of them is dropped (answered accepted)."""

    count: int
    seconds: int
    id_property: str = ''
    """Application property holding the id; empty: the AMQP message-id."""


class Fetched(list[Entry]):
    """A fetch's entries, and what the sharing between replicas (``routing/sharing.py``) left
    behind for other replicas' consumers."""

    __slots__ = ('active', 'left', 'wait_ms')

    def __init__(
        self, entries: Iterable[Entry] = (), left: int = -1, wait_ms: int = 0, active: str = ''
    ) -> None:
        super().__init__(entries)
        self.wait_ms = wait_ms
        """In how many ms the first entry waiting out a redelivery delay is due; 0: none waits."""
        self.left = left
        """Entries left for other replicas (reserved for them, or more than this replica's credit
        could take); -1 when no other replica has consumers of the subscription; -2
        (``exclusive.STANDBY``) when the entity is exclusive and the consumer asked for is not
        first in its line."""
        self.active = active
        """With -2: this replica's consumer first in line (``ConsumerLink.line``), if any."""

    @property
    def shared(self) -> bool:
        """Other replicas have consumers of the subscription."""
        return self.left >= 0


@dataclasses.dataclass(frozen=True, slots=True)
class BrowseCursor:
    """Where a queue browser stands in each band: the last entry id it was shown."""

    positions: tuple[tuple[int, str], ...] = tuple((band, '0-0') for band in BANDS)


Notify = Callable[[str], None]


class JoinOutcome(enum.Enum):
    CREATED = 'created'
    JOINED = 'joined'
    RECREATED = 'recreated'
    """The definition changed while nobody was attached: a new subscription replaced the old."""


T = TypeVar('T')

PublishCallback = Callable[[list[T], bool | None, BrokerError | None], None]
"""``publish_then``'s answer: the tokens of the messages it answers, then (kept, None) or
(None, error)."""

ClaimCallback = Callable[[list[T], tuple[list[str], list[Entry]] | None, BrokerError | None], None]
"""``claim_then``'s answer: the tokens, then ((ids in token order, entries read ahead), None) or
(None, error)."""


class MessagePort(Protocol):
    """The messages: storing, handing out and settling them (``store/messages.py``)."""

    def publish(self, address: str, kind: AddressKind, message: OutgoingMessage) -> Awaitable[bool]:
        """Append a message; resolves False when a topic had no subscription to keep it, and
        fails with AddressNotFound when the address was deleted meanwhile."""
        ...

    def publish_then(
        self,
        address: str,
        kind: AddressKind,
        message: OutgoingMessage,
        callback: PublishCallback[T],
        token: T,
    ) -> None:
        """``publish`` for the per-message path, with no future in between: once the store
        answered, ``callback(tokens, kept, None)`` or ``callback(tokens, None, error)``. The
        messages of one cycle for the same address and band that name the same ``callback`` are
        stored together and answered in one call, ``tokens`` in the order they were published."""
        ...

    def duplicate_window(self, address: str) -> DuplicateWindow | None:
        """The address's duplicate detection; None when off. A message published with a
        ``duplicate_id`` is checked against the window in the same script that stores it."""
        ...

    @property
    def last_value_key(self) -> Callable[[str], str | None]:
        """Address -> the application property keying a last-value queue there; None when it
        is not one. Bound once by the producing side (a C-level call where it can be: every
        message asks). A message published with a ``last_value`` replaces the newest unread one
        with the same key in the script that stores it (``store/last_values.py``)."""
        ...

    def schedule(self, address: str, message: OutgoingMessage, due_ms: int) -> Awaitable[bool]:
        """Hold a message (JMS delivery delay) until ``due_ms``; then it is published."""
        ...

    def fetch(
        self, address: str, group: str, count: int, consumers: int = 0, credit: int = 0
    ) -> Awaitable[Fetched]:
        """Hand up to ``count`` entries of a subscription to this replica, band by band (higher
        priority first), in each returned ones first, then new ones. ``consumers`` is how many
        consumers of it this replica has and ``credit`` their free credit (0: ``count``): with
        other replicas serving it too, this replica gets its share (``routing/sharing.py``); no
        consumers leaves it out of the sharing (a group no other replica reads)."""
        ...

    def fetch_then(
        self,
        address: str,
        group: str,
        count: int,
        callback: Callable[[Fetched | None, BrokerError | None], None],
        consumers: int = 0,
        credit: int = 0,
        active: str = '',
    ) -> None:
        """``fetch`` for the per-message path: ``callback(entries, None)`` or ``callback(None,
        error)`` as the replies are read, not a loop turn later through a future. ``active``: the
        local consumer that must be first in an exclusive entity's line (routing/exclusive.py)."""
        ...

    def leave_sharing(self, address: str, group: str) -> Awaitable[None]:
        """This replica has no consumers of the subscription any more: it leaves the sharing
        (what was reserved for it goes back to the others)."""
        ...

    def drop_groups(self, address: str, group: str) -> Awaitable[None]:
        """Give up the message groups this replica owns in the subscription."""
        ...

    def forget_groups(self, address: str, group: str, groups: Sequence[str]) -> Awaitable[None]:
        """Let go of some message groups this replica owns in the subscription."""
        ...

    def replica_ready(self, address: str) -> Awaitable[bool]:
        """Whether a Redis replica of the primary serving ``address`` has everything the
        message path wrote there (``replicated``: a write would be confirmed now)."""
        ...

    def can_claim(self, address: str) -> bool:
        """Whether ``claim_then`` may take messages to ``address`` (no limit could refuse them)."""
        ...

    def claim_then(
        self,
        address: str,
        group: str,
        message: OutgoingMessage,
        callback: ClaimCallback[T],
        token: T,
    ) -> None:
        """``publish_then`` for a queue message a consumer on this replica already has: stored
        and claimed for this replica at once, with whatever of ``group`` is unread ahead of it.
        Answered ``callback(tokens, (ids, entries read ahead), None)``, the ids in token order,
        or ``callback(tokens, None, error)``."""
        ...

    def ack(self, address: str, group: str, entry: Entry) -> Awaitable[None]:
        """The entry is consumed: forget it for this subscription."""
        ...

    def ack_nowait(self, address: str, group: str, entries: Iterable[Entry]) -> None:
        """``ack`` of each entry, for a caller that does not wait for it (the per-message path).
        A failure is logged; the entries stay pending and are delivered again once reclaimed."""
        ...

    def release(
        self,
        address: str,
        group: str,
        entry: Entry,
        *,
        delivery_failed: bool,
        delay_ms: int = 0,
        ahead_of_fetch: bool = False,
    ) -> Awaitable[None]:
        """Make the entry available again to any replica (after ``delay_ms``: a redelivery
        delay); count a failed attempt if asked. ``ahead_of_fetch``: a consumer's give-back,
        which reaches the store before any fetch of the subscription this replica has asked
        for and not sent yet."""
        ...

    def release_behind(self, address: str, group: str, entries: Sequence[Entry]) -> None:
        """Make entries a fetch brought available again behind every returned entry (so behind
        one waiting out a redelivery delay) and ahead of new ones; counts unchanged."""
        ...

    def browse(
        self, address: str, group: str, cursor: BrowseCursor, count: int
    ) -> Awaitable[tuple[Sequence[Entry], BrowseCursor]]:
        """Up to ``count`` entries still available on a queue after ``cursor``, unconsumed."""
        ...

    async def commit(
        self,
        sends: Sequence[tuple[str, AddressKind, OutgoingMessage]],
        acks: Sequence[tuple[str, str, Entry]],
    ) -> None:
        """Apply a transaction's sends and acks all at once, or not at all (StoreUnavailable)."""
        ...

    async def return_stranded(self, address: str, group: str, held: set[tuple[int, str]]) -> int:
        """Return this replica's claimed entries of a subscription that it does not hold (a
        fetch whose reply was lost); returns how many."""
        ...


class RegistryPort(Protocol):
    """Addresses, subscriptions and ClientIDs, cluster-wide (``store/addresses.py``)."""

    async def address_kind(self, address: str) -> AddressKind | None:
        """The kind of an existing address, or None when it does not exist."""
        ...

    async def create_address(self, address: str, kind: AddressKind) -> AddressKind:
        """Create the address if absent; return the kind it has (which may be another)."""
        ...

    async def delete_address(self, address: str) -> None:
        """Remove the address with its messages and subscriptions."""
        ...

    async def create_subscription(self, address: str, group: str, *, from_start: bool) -> None:
        """Create a subscription; ``from_start`` sees stored messages, else only later ones."""
        ...

    async def delete_subscription(self, address: str, group: str) -> None:
        """Remove a subscription and everything it still held."""
        ...

    async def subscription_room(self, address: str, group: str, limit: int) -> bool:
        """Whether ``group`` exists on the address or fewer than ``limit`` groups do."""
        ...

    async def join_subscription(
        self, spec: SubscriptionSpec, consumer: str, default_max_consumers: int
    ) -> JoinOutcome:
        """Register a consumer of a named subscription cluster-wide, creating the subscription
        (or replacing one whose definition differs and has no consumer). ResourceLocked or
        ResourceLimitExceeded when it may not join."""
        ...

    async def leave_subscription(self, key: SubscriptionKey, consumer: str) -> int:
        """Unregister a consumer; a volatile subscription is deleted with its last consumer.
        Returns the consumers left anywhere."""
        ...

    async def unsubscribe(self, key: SubscriptionKey, consumer: str) -> None:
        """Delete a durable subscription; AddressNotFound or ResourceLocked when it cannot."""
        ...

    async def subscription_definition(self, key: SubscriptionKey) -> dict[str, str] | None:
        """The stored definition of a named subscription, or None."""
        ...

    async def claim_client(self, client_id: str, holder: str) -> bool:
        """Claim a ClientID cluster-wide; False when another connection holds it."""
        ...

    async def release_client(self, client_id: str, holder: str) -> None: ...


class UpkeepPort(Protocol):
    """The store's resources as the edge watches them (``store/upkeep.py``)."""

    async def memory(self) -> tuple[int, int]:
        """The store's memory in use and its limit (0: none), in bytes."""
        ...


class WatchPort(Protocol):
    """Wake-ups when other replicas add or return entries (``store/watching.py``)."""

    def watch(self, address: str, notify: Notify) -> None:
        """Call ``notify(address)`` when another replica adds or returns entries there."""
        ...

    def unwatch(self, address: str, notify: Notify) -> None: ...


class LinePort(Protocol):
    """The lines of exclusive queues and subscriptions (``routing/exclusive.py``,
    ``store/lines.py``); ``consumer`` is unique on this replica."""

    def join(self, address: str, group: str, consumer: str) -> Awaitable[bool]: ...

    def leave(
        self, address: str, group: str, consumer: str, *, hand_over: bool = True
    ) -> Awaitable[bool]: ...

    async def line(self, address: str, group: str) -> list[str]: ...


class MessageStore(Protocol):
    """The store the protocol edge is handed: one object per role, each behind its port."""

    @property
    def messages(self) -> MessagePort: ...

    @property
    def registry(self) -> RegistryPort: ...

    @property
    def upkeep(self) -> UpkeepPort: ...

    @property
    def watching(self) -> WatchPort: ...

    @property
    def lines(self) -> LinePort: ...
