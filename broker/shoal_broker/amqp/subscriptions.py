"""
This replica's consumers of one subscription, and the loop that feeds them.

A subscription is a consumer group in Redis; this replica is one consumer of it, reading up to the
summed link credit of its local consumers (``fetch`` COUNT = free credit) and dealing entries out
round-robin among consumers that still have credit (seed 002), in attach order: the first entry
goes to the oldest consumer. Exactly one fetch per subscription
is in flight; anything that could make more entries deliverable (new credit, a notification, a
returned entry) while it is in flight sets ``again`` instead of starting a second one.

New credit alone does not fetch when the last fetch came back short and nothing has announced
entries since: every way an entry becomes fetchable (a publish here, another replica's
notification, a release, a reclaim, a commit) kicks the subscription. Clients top up credit as
they consume, so at a trickle this saved an empty fetch per message
(docs/performance.md#credit-and-fetches).

Sharing between replicas (docs/architecture.md): when other replicas have consumers of the
subscription too, a fetch hands this replica only its share, in proportion to free credit
(``routing/sharing.py``); the rest is reserved for the others. A fetch that comes back short with
entries left is not the store running dry: nothing is handed over or sent ahead (``shared``),
and this replica fetches again when something is announced, credit comes, or the others'
reservations could have lapsed (``check_share``).

Drain (jms-amqp-facts §6.3): when a fetch comes back short, the store had nothing more for this
replica, so every consumer that asked to drain is answered with ``drained`` (credit consumed,
flow sent), even when nothing was sent.

Hand-over (``take``) and sending ahead (``ahead``) let a message published here skip Redis on
its way to a local consumer; the rules, and why each keeps the queue's order, are in
``routing/dispatch.py``. What they hold is theirs to give back: ``spill`` sends held messages to
the store in order, as if they had never been held.
"""

import bisect
import logging
import time
from collections.abc import Sequence

from shoal_broker.amqp import groups as grouping
from shoal_broker.amqp.engine import lib
from shoal_broker.amqp.lines import SUBSCRIPTION_SLOTS, Line
from shoal_broker.amqp.links import ConsumerLink, Identifiers, PendingMessage, ProducerLink
from shoal_broker.amqp.outlets import Held, Intake, Outlet
from shoal_broker.errors import BrokerError, next_retry_pause
from shoal_broker.routing import dispatch
from shoal_broker.routing.dispatch import (
    FIRST,
    MAX_PARKED,
    SHARE_CHECK_SECONDS,
    STORE,
    Unwanted,
    expired,
    next_with_room,
)
from shoal_broker.routing.dispatch import MAX_HELD as MAX_HELD
from shoal_broker.routing.dispatch import MAX_HELD_BYTES as MAX_HELD_BYTES
from shoal_broker.routing.dispatch import PARK_SECONDS as PARK_SECONDS
from shoal_broker.routing.exclusive import STANDBY, is_exclusive
from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.routing.storage import Entry, Fetched, OutgoingMessage
from shoal_broker.settings import RoutingSettings

logger = logging.getLogger(__name__)

MAX_FETCH = 500
"""Entries per fetch script call: bounds how long one Lua script holds Redis."""


PRIVATE_GROUP_PREFIX = 'nd:'
"""A plain topic subscriber's own consumer group (``attach.py``): only its replica reads it, so
it stays out of the sharing between replicas."""


def _arrived(consumer: ConsumerLink) -> int:
    return consumer.arrived


class LocalSubscription(dispatch.Lane[Held, ConsumerLink], Line):
    """This replica's consumers of one subscription: fetches for their credit, deals to them."""

    __slots__ = SUBSCRIPTION_SLOTS  # the instance dict stays compact: see amqp/lines.py

    def __init__(self, outlet: Outlet, intake: Intake, address: str, group: str) -> None:
        super().__init__(group)
        self.outlet = outlet
        self.intake = intake
        self.address = address
        self.consumers: list[ConsumerLink] = []
        self._again = False
        self.retry_delay = 0.0
        self.filters_consume = dispatch.filters_consume(group)
        self.max_delivery_attempts = 0
        self.dead_letter_address = ''
        self.max_age_ms = 0
        """Entries enqueued longer ago expire at dispatch; 0 = no limit."""
        self.handover_allowed = False
        self.ahead_allowed = False
        self.hold_seconds = 0.0
        self._held_since = 0.0
        self.private = group.startswith(PRIVATE_GROUP_PREFIX)
        self._share_check = False
        self._due_at = 0.0
        """When the next look for a delayed redelivery is set (monotonic s; 0: none)."""
        self.groups = grouping.Groups()
        self.paused = False
        """Delivery paused by an operator (``Nodes.apply_pauses``): nothing is fetched, and a
        message published here goes to the store."""

    def apply(self, policy: EntityPolicy, defaults: RoutingSettings) -> None:
        """Take the declared policy (looked up once here, not per message), falling back to the
        broker-wide settings for what it leaves unset."""
        attempts, dla = policy.max_delivery_attempts, policy.dead_letter_address
        self.max_delivery_attempts = (
            attempts if attempts is not None else defaults.max_delivery_attempts
        )
        self.dead_letter_address = dla if dla is not None else defaults.dead_letter_address
        self.max_age_ms = (policy.max_age_seconds or 0) * 1000
        self.handover_allowed = defaults.handover
        self.ahead_allowed = defaults.deliver_ahead
        self.hold_seconds = max(0.0, defaults.handover_hold_seconds)
        self.groups.rebalance = bool(policy.group_rebalance)
        flipped = self._set_exclusive(
            not self.private
            and is_exclusive(policy.exclusive, self.address, defaults.exclusive_addresses)
        )
        self._consumers_changed()
        if flipped and self.consumers:  # a standby fetches (and joins the sharing) at once
            self.kick()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if not paused and self.consumers:
            self.kick()

    def add(self, consumer: ConsumerLink) -> None:
        """A consumer joins in attach order (``LinkState.arrived``), oldest first."""
        index = bisect.bisect_right(self.consumers, consumer.arrived, key=_arrived)
        self.consumers.insert(index, consumer)
        self.joined(index)
        consumer.subscription = self
        self._take_place(consumer)  # queued ahead of the fetch below
        if self.groups.rebalance and len(self.groups):
            grouping.let_go(self, everything=True)  # amqp/groups.py
        self._consumers_changed()
        self.kick()

    def remove(self, consumer: ConsumerLink) -> None:
        if consumer in self.consumers:
            index = self.consumers.index(consumer)
            del self.consumers[index]
            self.left(index)
        consumer.subscription = None
        grouping.move_off(self, consumer)
        if consumer.line == self._active_line:  # its place goes once its deliveries are back
            self._active_line = ''
        self._consumers_changed()
        if not self.consumers:
            self.spill()  # behind the fetch in flight: what it returns is given back first
            if not self.private:
                self.outlet.leave_sharing(self.address, self.group)
        if self._parked and not self.consumers:
            self.return_parked(everything=True)
        elif self._parked:
            self.kick()

    def _consumers_changed(self) -> None:
        traits = [(c.presettled, c.filtered) for c in self.consumers]
        self.hands_over = dispatch.hands_over(self.handover_allowed, self.group, traits)
        self.sends_ahead = dispatch.sends_ahead(self.ahead_allowed, self.group, traits)
        if self.exclusive:  # their shortcuts pick a consumer without asking the line
            self.hands_over = self.sends_ahead = False

    def claimed(self, entries: Sequence[Entry]) -> None:
        """Entries a claim read ahead of messages sent ahead: other replicas' messages, dealt
        after them like a fetch's."""
        if not entries:
            return
        if self.consumers:
            self._deal(entries, -1)
        else:  # everyone left meanwhile
            for entry in entries:
                self.outlet.release(self.address, self.group, entry, delivery_failed=False)

    def take(
        self, producer: ProducerLink, message: PendingMessage, stored: OutgoingMessage
    ) -> bool:
        """Hand an at-most-once message published here to a local consumer without the store, or
        hold it until it may go; False when it must be stored (see the module doc)."""
        verdict = self.take_rule()
        if verdict is STORE:
            return False
        if verdict is FIRST:  # nothing stored is unread: it may go first
            consumer = self._with_credit()
            if consumer is not None:
                consumer.hand((stored,))
                self.outlet.handed(consumer, 1)
                return True
            if not self.hold_seconds:
                return False
            self._held_since = time.monotonic()
            self.outlet.call_later(self.hold_seconds, self.spill_stale)
        self._held.append((producer, message, stored))  # behind the fetch, or waiting for credit
        self._held_bytes += len(stored.rest)
        return True

    def spill(self) -> None:
        """Send the held messages to the store, in order, ahead of anything published after."""
        if self._held:
            held, self._held = self._held, []
            self._held_bytes = 0
            self.intake.store_held(self, held)

    def spill_stale(self) -> None:
        """Held messages that have waited ``hold_seconds`` for credit go where any replica's
        consumers can take them."""
        if not self._held:
            return
        waited = time.monotonic() - self._held_since
        if waited >= self.hold_seconds:
            self.spill()
        else:  # the loop's clock ran ahead of ours, or credit came and ran out again since
            self.outlet.call_later(self.hold_seconds - waited, self.spill_stale)

    def _with_credit(self) -> ConsumerLink | None:
        """The next consumer in the round robin with credit left."""
        consumers = self.consumers
        if len(consumers) == 1:  # next_with_room for one, without its list: once per message
            self._next = 0
            return consumers[0] if consumers[0].credit() > 0 else None
        index = next_with_room(self._next, [c.credit() for c in consumers])
        if index < 0:
            return None
        self._next = index
        return consumers[index]

    def _hand_held(self) -> None:
        """Nothing stored is unread: the held messages go out as credit allows; the rest wait for
        more (``hold_seconds`` at most)."""
        if not self.hands_over or self.shared or self._parked:
            self.spill()
            return
        held = self._held
        handed: dict[ConsumerLink, int] = {}
        sent = 0
        for _, _, stored in held:
            consumer = self._with_credit()
            if consumer is None:
                break
            consumer.hand((stored,))
            handed[consumer] = handed.get(consumer, 0) + 1
            sent += 1
        for consumer, count in handed.items():
            self.outlet.handed(consumer, count)
        if sent == len(held):
            self._held = []
            self._held_bytes = 0
        else:  # the rest wait for credit, from now
            del held[:sent]
            self._held_bytes = sum(len(stored.rest) for _, _, stored in held)
            self._held_since = time.monotonic()
            self.outlet.call_later(self.hold_seconds, self.spill_stale)

    def check_share(self) -> None:
        """Look again after leaving entries to other replicas: what they skipped has lapsed."""
        self._share_check = False
        if self.consumers and not self._exhausted:
            self.kick()

    def on_notify(self, address: str) -> None:
        self.kick()

    def credit_added(self, consumer: ConsumerLink) -> None:
        """A consumer granted credit (or asked to drain)."""
        if self._exhausted and not self._fetching and not self._parked:
            if self._held:
                self._hand_held()
            if not lib.pn_link_get_drain(consumer.ptr):  # a drain is answered after a fetch
                return
        self.kick()

    def kick(self) -> None:
        """Fetch for the free credit of the local consumers, unless a fetch is in flight."""
        self._exhausted = False
        if self.paused:
            return
        if self._fetching or self.recovering:
            self._again = True
            return
        if self._parked:
            self._deliver_parked()
            if len(self._parked) >= MAX_PARKED:
                return  # nothing here wants what we hold: stop taking more until it goes back
        active = self._active() if self.exclusive else None
        credit = active.credit() if active else sum(c.credit() for c in self.consumers)
        want = min(credit, MAX_FETCH)
        if want <= 0:
            return
        self._fetching = True
        self._again = False
        self.groups.fetches += 1
        fetch = self.groups.fetches
        answered = self._answered_later if active or len(self.groups) else self._fetched
        self.outlet.store.messages.fetch_then(
            self.address,
            self.group,
            want,
            lambda entries, error: answered(entries, error, want, fetch),
            0 if self.private else len(self.consumers),
            credit,
            active.line if active else '',
        )

    def _fetched(
        self, entries: Fetched | None, error: BrokerError | None, asked: int, fetch: int
    ) -> None:
        self._fetching = False
        if entries is None:
            # Redis unavailable, or its reply lost: what it may have handed to us is recovered
            # (returned to the subscription) before fetching again, after a growing pause
            log = logger.warning if self.consumers else logger.debug  # none left: no news
            log('fetch from %s/%s failed: %s', self.address, self.group, error)
            self.spill()  # the stranded entries come back ahead of them
            self._finish_drains()
            self.retry_delay = next_retry_pause(self.retry_delay)
            self.outlet.schedule_recovery(self, self.retry_delay)
            return
        self.retry_delay = 0.0
        self.shared = entries.shared
        if entries.wait_ms:
            self._due_later(entries.wait_ms)
        if entries:
            self._deal(entries, fetch)
        if len(entries) >= asked or self._again:
            self.kick()  # held messages wait behind this next fetch, or go to the store
            if self._held and not self._fetching:
                self.spill()
        elif entries.left > 0:
            # the rest is other replicas' share (they were woken for it): not fetched again
            # until something is announced, credit comes, or their reservations lapse
            self.spill()
            self._finish_drains()
            if not self._share_check:
                self._share_check = True
                self.outlet.call_later(SHARE_CHECK_SECONDS, self.check_share)
        elif entries.left == STANDBY and self._first_elsewhere(entries.active):
            self.kick()  # another consumer here is first in line: fetch for it
        else:
            self._exhausted = True  # a standby fetches again when a hand-over is announced
            if self._held:
                self._hand_held()
            self._finish_drains()

    def _due_later(self, wait_ms: int) -> None:
        """A returned entry waits out a redelivery delay: fetch again when it is due (whichever
        replica gave it back, or died holding it), unless an earlier look is already set."""
        due = time.monotonic() + wait_ms / 1000
        if self._due_at and self._due_at <= due:
            return
        self._due_at = due
        self.outlet.call_later(wait_ms / 1000 + 0.002, self._due_now)

    def _due_now(self) -> None:
        self._due_at = 0.0
        if self.consumers:
            self.kick()

    def _deal(self, entries: Sequence[Entry], fetch: int) -> None:
        now_ms = int(time.time() * 1000)
        enqueued_before = dispatch.enqueued_before(now_ms, self.max_age_ms)  # retention.maxAge
        filtering = self.exclusive or any(c.filtered for c in self.consumers)
        if self.exclusive and not self._pool():  # fetched for a consumer that left since
            for entry in entries:
                self.outlet.release(self.address, self.group, entry, delivery_failed=False)
            return
        if len(self.consumers) == 1 and not filtering and not grouping.any_grouped(entries):
            self._deal_to_one(self.consumers[0], entries, now_ms, enqueued_before)
            return
        identifiers = Identifiers()
        credit: dict[ConsumerLink, int] = {}
        dealt: dict[ConsumerLink, list[Entry]] = {}
        for entry in entries:
            if expired(entry, now_ms, enqueued_before):
                self.outlet.expire(self.address, self.group, entry)
                continue
            wanting = self._wanting(entry, identifiers) if filtering else self.consumers
            if not wanting:
                self._refused(entry)
                continue
            if entry.group:  # amqp/groups.py
                if (consumer := grouping.grouped(self, entry, wanting, credit, fetch)) is None:
                    continue
            else:
                consumer = self._pick(entry, wanting, credit)
            if consumer is not None:
                credit[consumer] -= 1
                sent = dealt.get(consumer)
                if sent is None:
                    dealt[consumer] = [entry]
                else:
                    sent.append(entry)
            else:  # undeliverable-here (kept from the consumer that said so), or the consumers
                self._park(entry)  # took credit back meanwhile: first in line for new credit
        for consumer, sent in dealt.items():  # each consumer's in the order they were fetched
            consumer.send(sent)
            self.outlet.sent(consumer, sent)

    def _deal_to_one(
        self, consumer: ConsumerLink, entries: Sequence[Entry], now_ms: int, enqueued_before: int
    ) -> None:
        """``_deal`` for a lone consumer without filters: what ``_pick`` would decide for each
        entry, without its round robin and credit table."""
        left = consumer.credit()
        excluded = consumer.excluded
        sent: list[Entry] = []
        for entry in entries:
            if expired(entry, now_ms, enqueued_before):
                self.outlet.expire(self.address, self.group, entry)
            elif excluded and entry.key in excluded:
                self._park(entry)  # undeliverable-here: keep it from the consumer that said so
            elif left > 0:
                left -= 1
                sent.append(entry)
            else:  # the consumer took credit back meanwhile: first in line for new credit
                self._park(entry)
        if sent:
            consumer.send(sent)
            self.outlet.sent(consumer, sent)

    def _wanting(self, entry: Entry, identifiers: Identifiers) -> list[ConsumerLink]:
        return [c for c in self._pool() if not c.filtered or c.wants(entry, identifiers)]

    def _refused(self, entry: Entry) -> None:
        """No local consumer's selector or no-local filter takes the entry."""
        verdict = dispatch.unwanted(bool(self.consumers), self.filters_consume)
        if verdict is Unwanted.RELEASE:
            self.outlet.release(self.address, self.group, entry, delivery_failed=False)
        elif verdict is Unwanted.CONSUME:
            self.outlet.filtered(self.address, self.group, entry)
        else:
            self._park(entry)

    def _park(self, entry: Entry) -> None:
        self._parked.append((time.monotonic() + PARK_SECONDS, entry))
        self.outlet.call_later(PARK_SECONDS, self.return_parked)

    def _pick(
        self, entry: Entry, candidates: list[ConsumerLink], credit: dict[ConsumerLink, int]
    ) -> ConsumerLink | None:
        """Round-robin over consumers with credit that may take the entry. ``credit`` is what
        each has left in this deal (read from proton once per deal: only our sends change it
        meanwhile, and the caller counts those)."""
        consumers = self.consumers
        rooms = []
        for consumer in consumers:
            left = credit.get(consumer)
            if left is None:
                left = credit[consumer] = consumer.credit()
            may = (not consumer.excluded or entry.key not in consumer.excluded) and (
                candidates is consumers or consumer in candidates
            )
            rooms.append(left if may else 0)
        index = next_with_room(self._next, rooms)
        if index < 0:
            return None
        self._next = index
        return consumers[index]

    def _deliver_parked(self) -> None:
        grouping.deliver_parked(self)

    @property
    def fetching(self) -> bool:
        """A fetch or a claim is out: what it takes from Redis is not known here yet."""
        return self._fetching or self.claims > 0

    def held(self) -> set[tuple[int, str]]:
        """Entries of this subscription this replica legitimately holds: out at a consumer
        (unsettled) or parked here."""
        keys = {entry.key for _, entry in self._parked}
        for consumer in self.consumers:
            keys.update(entry.key for entry in consumer.unacked.values())
        return keys

    def return_parked(self, *, everything: bool = False) -> None:
        """Give parked entries back to the subscription for other replicas' consumers."""
        parked = dispatch.due_parked(self._parked, time.monotonic(), everything)
        due, keep = grouping.with_groups(self, *parked)  # a group's later ones go with it
        for entry in due:
            if entry.group:
                self.groups.unparked(entry)
            self.outlet.release(self.address, self.group, entry, delivery_failed=False)
        self._parked = keep
        if keep:
            self.outlet.call_later(PARK_SECONDS, self.return_parked)

    def _finish_drains(self) -> None:
        for consumer in self.consumers:
            if consumer.alive and consumer.opened and lib.pn_link_get_drain(consumer.ptr):
                lib.pn_link_drained(consumer.ptr)
                self.outlet.mark_dirty(consumer.conn)
