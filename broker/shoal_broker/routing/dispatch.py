"""
How a local subscription deals entries out: the rules, as plain data in and decisions out.

``amqp/subscriptions.py`` keeps a subscription's state (its consumers, what it fetched, parked or
holds) and makes the proton calls; what it does with an entry or a message published here is
decided here, with no proton, asyncio or Redis, so each rule is unit-tested on its own
(tests/unit/test_dispatch.py):

- round robin over consumers with room (seed 002), in attach order and oldest first:
  ``next_with_room``, ``Lane.joined`` and ``Lane.left``;
- expiry at dispatch (a message's TTL, or a queue's retention.maxAge): ``expired``;
- an entry no local consumer takes now: released, consumed unseen or parked (``unwanted``), and
  a parked entry's time with this replica (``PARK_SECONDS``, ``due_parked``);
- hand-over of at-most-once messages without the store (``hands_over``, ``Lane.take_rule``)
  and sending at-least-once messages ahead of it (``sends_ahead``, ``Lane.ahead``).

Hand-over (``take``): an at-most-once message (sent pre-settled, no expiry, no delivery delay)
published on this replica to a queue whose local consumers are all pre-settled and unfiltered (and
its only consumers cluster-wide) never needs Redis when the queue has nothing stored for them: it
goes straight to a consumer with credit. Nobody can settle, release or redeliver it, so Redis would
have held it only to hand it back (5.5 µs of Redis and 1.7 µs of broker CPU per message,
docs/performance.md#hand-over). The one rule that keeps this faithful is order: a message is
handed over only when nothing this replica stored for the queue is still unread, which a short
fetch with nothing announced since proves (``exhausted``). While a fetch is in flight such
messages wait here behind it, and go out after what it returns; with no credit left they wait for
credit, ``hold_seconds`` at most (``SHOAL_HANDOVER_HOLD_SECONDS``, 0.1 s; bounded by MAX_HELD
and MAX_HELD_BYTES). Anything that would break the rule (a message that must be stored, consumers
that change or all leave, a fetch that fails or leaves more behind it, the wait running out) sends
the held messages to the store first, in order, as if they had never been held
(``LocalSubscription.spill``). Under a closed-loop load whose consumer's credit runs out now and
then, the wait for credit is what keeps the stream of messages on this path: with only the wait
behind a fetch, 82 % of them ended up stored. ``SHOAL_HANDOVER=false`` turns the hand-over off.

Sending ahead (``ahead``): an at-least-once message published here to a queue whose local
consumers all settle and are unfiltered (and are its only consumers cluster-wide) goes to a
consumer with credit before Redis has it, under the same rule of order (``exhausted``, no
fetch in flight, nothing parked), while the store appends it and claims it for this replica in
one script (``RedisStore.claim_then``). Redis leaves the path from producer to consumer, which is
what the latency at a trickle was made of; the producer is still answered only once Redis has the
message, and what the consumer decides before the entry has an id waits on the delivery
(``links.Ahead``). ``SHOAL_DELIVER_AHEAD=false`` turns it off.
"""

import enum
from collections.abc import Sequence
from typing import Final, Generic, TypeVar

from shoal_broker.routing.sharing import LAPSE_MS
from shoal_broker.routing.storage import QUEUE_GROUP, Entry

T = TypeVar('T')
H = TypeVar('H')
C = TypeVar('C')

PARK_SECONDS: Final = 5.0
"""How long a parked entry (every local consumer refused it, or none had credit left for it)
stays with this replica before it is returned for other replicas' consumers. An entry fetched
beyond the credit a consumer then took back (a receiver may lower its credit with a flow) used
to be released at once: when that release failed (Redis at maxmemory) and waited to be tried
again, the next fetch handed out newer entries first (tests/security/test_limits.py, 5 of 15
runs on a busy 2-vCPU VM). Parked, it goes out first when credit comes back."""

MAX_PARKED: Final = 1000
"""Entries a replica holds that none of its consumers can take now (selectors on a queue,
undeliverable-here, credit a consumer took back while a fetch was out) before it stops fetching
more."""

SHARE_CHECK_SECONDS: Final = LAPSE_MS / 1000 + 0.1
"""After a fetch that left entries reserved for other replicas, when to look again: by then a
reservation its replica did not collect has lapsed, and this replica may take it."""

MAX_HELD: Final = 1000
MAX_HELD_BYTES: Final = 1024 * 1024
"""At-most-once messages (and their bytes) held to be handed over (``take``); past either bound
they go to the store."""


NONE_SERVED: Final = -1
"""The round robin's ``last`` before any consumer was served: the first entry goes to the oldest
consumer. JMS lets either of two consumers with credit have it, but the JMS 2.0 TCK
(``jms/core20`` sessiontests and jmscontexttopictests, createShared*) expects the first consumer
of a shared subscription to receive the first message and the second the next one, and the
attach order is the only order a client can see."""


def next_with_room(last: int, rooms: Sequence[int]) -> int:
    """Round robin: the first index after ``last`` (wrapping around) whose room is above 0, or
    -1 when none has any. ``rooms`` is each consumer's credit left, 0 for one that may not take
    the entry at hand; they are in attach order, so from ``NONE_SERVED`` the oldest comes
    first."""
    count = len(rooms)
    for step in range(1, count + 1):
        index = (last + step) % count
        if rooms[index] > 0:
            return index
    return -1


def enqueued_before(now_ms: int, max_age_ms: int) -> int:
    """The enqueue time (ms) before which an entry is past the retention.maxAge ``max_age_ms``;
    0 when there is no such limit."""
    return now_ms - max_age_ms if max_age_ms else 0


def expired(entry: Entry, now_ms: int, before_ms: int) -> bool:
    """Past its expiry, or enqueued before ``before_ms`` (``enqueued_before``; a stream id starts
    with its enqueue time in ms): never delivered."""
    return bool(entry.expiry_ms and entry.expiry_ms <= now_ms) or bool(
        before_ms and int(entry.id.partition('-')[0]) < before_ms
    )


class Unwanted(enum.Enum):
    """What becomes of an entry no local consumer's selector or no-local filter takes."""

    RELEASE = 'release'
    """Its consumers all left while the fetch was out: not a filter decision, back it goes."""
    CONSUME = 'consume'
    """A topic subscription's filters refuse it: it is not for this subscription."""
    PARK = 'park'
    """A queue: another consumer, here or on another replica, may want it."""


def unwanted(has_consumers: bool, filters_consume: bool) -> Unwanted:
    if not has_consumers:
        return Unwanted.RELEASE
    return Unwanted.CONSUME if filters_consume else Unwanted.PARK


def filters_consume(group: str) -> bool:
    """On a topic subscription, an entry its consumers' filters refuse is consumed; on a queue it
    stays for other consumers."""
    return group != QUEUE_GROUP


def due_parked(
    parked: Sequence[tuple[float, T]], now: float, everything: bool
) -> tuple[list[T], list[tuple[float, T]]]:
    """Parked entries (deadline, entry) split into those to return now and those kept."""
    due: list[T] = []
    keep: list[tuple[float, T]] = []
    for deadline, entry in parked:
        if everything or deadline <= now:
            due.append(entry)
        else:
            keep.append((deadline, entry))
    return due, keep


def hands_over(allowed: bool, group: str, consumers: Sequence[tuple[bool, bool]]) -> bool:
    """A queue whose local consumers, (pre-settled, filtered) each, are all pre-settled and
    unfiltered: its at-most-once messages published here may skip the store."""
    return (
        allowed
        and group == QUEUE_GROUP
        and bool(consumers)
        and all(presettled and not filtered for presettled, filtered in consumers)
    )


def sends_ahead(allowed: bool, group: str, consumers: Sequence[tuple[bool, bool]]) -> bool:
    """A queue whose local consumers, (pre-settled, filtered) each, all settle and are
    unfiltered: its at-least-once messages published here may go out before the store has them."""
    return (
        allowed
        and group == QUEUE_GROUP
        and bool(consumers)
        and all(not presettled and not filtered for presettled, filtered in consumers)
    )


class Take(enum.Enum):
    """What becomes of an at-most-once message published to a queue that hands over."""

    STORE = 'store'
    """It must be stored: it goes the way of every other message."""
    FIRST = 'first'
    """Nothing stored is unread and nothing is held: a consumer with credit may have it now;
    with none, it is held for credit (``hold_seconds``) or stored."""
    HOLD = 'hold'
    """Held behind the fetch in flight, or behind the messages already held."""


STORE, FIRST, HOLD = Take.STORE, Take.FIRST, Take.HOLD  # bound once: read per message


class Lane(Generic[H, C]):
    """A local subscription's dispatch state, as plain data, and the per-message rules that read
    it. ``amqp/subscriptions.LocalSubscription`` is a Lane that also fetches and sends; ``H`` is
    what it holds for hand-over, ``C`` its consumers. The rules are methods so that the hot path
    pays one call with no arguments for each (a function of eight arguments cost ~0.3 µs per
    message)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._next = NONE_SERVED
        """The index of the consumer last served (``next_with_room``), among consumers kept in
        attach order; ``joined`` and ``left`` keep it on the same consumer as the list changes."""
        self._fetching = False
        self._exhausted = False
        """The last fetch came back short and nothing announced entries since."""
        self.recovering = False
        """Returning stranded entries after a failed fetch: no fetch may be in flight meanwhile
        (what it claims would look stranded, be returned and then delivered twice)."""
        self._parked: list[tuple[float, Entry]] = []
        self.shared = False
        """The last fetch found consumers of the subscription on other replicas: every message
        goes through the store, where the sharing rule (``routing/sharing.py``) decides which
        replica takes it, so nothing is handed over or sent ahead here."""
        self.claims = 0
        """Messages sent ahead of the store whose claims Redis has not answered yet."""
        self.hands_over = False
        """A queue whose local consumers are all pre-settled and unfiltered (``hands_over``)."""
        self.sends_ahead = False
        """A queue whose local consumers all settle and are unfiltered (``sends_ahead``)."""
        self._held: list[H] = []
        self._held_bytes = 0

    def ahead(self) -> C | None:
        """The consumer an at-least-once message published here may be sent to before the store
        has it (``Producing._send_ahead``), or None when it must wait for a fetch: the queue
        sends ahead, no other replica has consumers of it, nothing stored is unread
        (``_exhausted``), and no fetch, parked entry or recovery and at most one other claim is
        in its way. Not more: with claims back to back nothing ever fetched, so nothing batched
        (1→4 competing fell from ~77k to ~48k msg/s, docs/performance.md#send-ahead); with two, at
        a trickle a message that comes while Redis is slow to answer the last claim goes ahead
        too, not behind a fetch (docs/performance.md#trickle). The rule and the consumer's choice
        are one call: a second call per message cost ~1 % of the broker's instructions."""
        if (
            self.sends_ahead
            and not self.shared
            and self._exhausted
            and self.claims < 2
            and not self._fetching
            and not self._parked
            and not self.recovering
        ):
            return self._with_credit()
        return None

    def joined(self, index: int) -> None:
        """A consumer took its place at ``index`` among the consumers in attach order (at the end,
        unless an older attach was answered later): the turn stays where it was."""
        if index <= self._next:
            self._next += 1

    def left(self, index: int) -> None:
        """The consumer at ``index`` left: the turn stays with the consumer after the one last
        served, and goes back to the oldest (``NONE_SERVED``) when all have left."""
        if index <= self._next:
            self._next -= 1

    def _with_credit(self) -> C | None:
        """The local consumer with credit next in turn (``next_with_room``); a Lane on its own
        has no consumers."""
        return None

    def take_rule(self) -> Take:
        """The hand-over rule for an at-most-once message published here: it skips the store
        only while nothing this replica stored for the queue is unread, so the order holds."""
        if (
            not self.hands_over
            or self.shared
            or self._parked
            or len(self._held) >= MAX_HELD
            or self._held_bytes >= MAX_HELD_BYTES
        ):
            return STORE
        if self._exhausted:
            return HOLD if self._held else FIRST
        if not self._fetching or self.recovering:
            return STORE
        return HOLD
