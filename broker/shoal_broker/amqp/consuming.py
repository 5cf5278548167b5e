"""
The consumers' side of a message's way: what went out on a link, and what its peer decided.

Local subscriptions deal entries to consumer links and report here (``sent``, ``handed``). A
peer's outcome arrives either as one of the plain accepts ``wire.shoal_next_event`` settles on
its way (``on_accepts``: acknowledged per consumer in one call) or as a delivery event
(``disposition``), decoded by ``wire.shoal_outcome`` into a code of the table in
``outcome_codes.py``; the rules of ``routing/outcomes.py`` decide what each means for the entry,
and ``returns.py`` carries it out. An outcome inside a transaction is held by the transaction
until discharge. A delivery sent ahead of the store (``links.Ahead``) has no entry yet: its
outcome waits on it.

This is also what local subscriptions report to and schedule through (``outlets.Outlet``), and
where a subscription whose fetch failed recovers the entries Redis may have handed it.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shoal_broker.amqp import outcome_codes as codes
from shoal_broker.amqp import transactions
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.engine import Ptr, lib, wire
from shoal_broker.amqp.links import ConsumerLink
from shoal_broker.amqp.nodes import Nodes
from shoal_broker.amqp.outlets import Fed
from shoal_broker.amqp.returns import Returns
from shoal_broker.amqp.spans import Spans
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError, StoreUnavailable, next_retry_pause
from shoal_broker.metrics.registry import EXCLUSIVE_HANDOVERS, Counters
from shoal_broker.routing import outcomes
from shoal_broker.routing.outcomes import Action, Disposition, Outcome
from shoal_broker.routing.storage import QUEUE_GROUP, Entry, MessageStore
from shoal_broker.settings import RoutingSettings

logger = logging.getLogger(__name__)

LEAVE_ATTEMPTS = 30
"""Tries to give up a place in an exclusive entity's line (about a minute); after that, the
replica's next fetch finds its own departed consumer first in line and takes it out."""

RECOVERY_WAIT_STEP = 0.01
RECOVERY_WAIT_STEPS = 1000
"""Recovery waits up to 10 s for a fetch in flight to be answered before it returns entries."""

_DISPOSITIONS = {
    **{row.code: Disposition(Outcome[row.name]) for row in codes.OUTCOMES},
    **{
        codes.OUTCOME_MODIFIED | failed | undeliverable: Disposition(
            Outcome.MODIFIED,
            delivery_failed=bool(failed),
            undeliverable_here=bool(undeliverable),
        )
        for failed in (0, codes.MODIFIED_FAILED)
        for undeliverable in (0, codes.MODIFIED_UNDELIVERABLE)
    },
}
"""A consumer's outcome by ``wire.shoal_outcome``'s code, shared (frozen): building one per
acknowledgement cost ~2.5 µs."""
ACCEPTED = _DISPOSITIONS[codes.OUTCOME_ACCEPTED]


class Consuming:
    def __init__(
        self,
        routing: RoutingSettings,
        store: MessageStore,
        counters: Counters,
        turns: Turns,
        nodes: Nodes,
        returns: Returns,
        coordinator: transactions.Coordinator,
    ) -> None:
        self.routing = routing
        self.store = store
        self.counters = counters
        self.turns = turns
        self.nodes = nodes
        self.coordinator = coordinator
        # what subscriptions call, bound once (``outlets.Outlet``)
        self.release = returns.release
        self.redeliver = returns.redeliver
        self.expire = returns.expire
        self.filtered = returns.filtered
        self.dead_letter = returns.dead_letter
        self.mark_dirty = turns.mark_dirty
        self.mark_delivering = turns.mark_delivering
        self.call_later = turns.call_later
        self.spans: Spans | None = None
        """Set by ``Broker`` when tracing is on."""
        self._recoveries: set[int] = set()
        """The subscriptions (``id``) with a recovery scheduled or running."""

    # -- what went out -------------------------------------------------------------------------

    def sent(self, consumer: ConsumerLink, entries: list[Entry]) -> None:
        """``entries`` went out on ``consumer``'s link (one fetch's worth: counted at once)."""
        self.counters.delivered(consumer.address, consumer.group, len(entries))
        consumer.deliveries.count += len(entries)
        if self.spans is not None:
            self.spans.sent(consumer, entries)
        if consumer.presettled:  # at-most-once: consumed the moment it is sent
            self.store.messages.ack_nowait(consumer.address, consumer.group, entries)
        self.mark_delivering(consumer.conn)

    def handed(self, consumer: ConsumerLink, count: int) -> None:
        """``count`` messages went to ``consumer`` without the store: enqueued and delivered."""
        self.counters.enqueued(consumer.address, QUEUE_GROUP, count)
        self.counters.delivered(consumer.address, QUEUE_GROUP, count)
        consumer.deliveries.count += count
        self.mark_delivering(consumer.conn)

    # -- what the peer decided -----------------------------------------------------------------

    def on_accepts(self, conn: AmqpConnection, accepts: Ptr, count: int) -> None:
        """``count`` plain accepts of consumers on ``conn``, settled already by the engine's event
        walk (``wire.shoal_next_event``): (delivery, link) pairs in ``accepts``. Each consumer's
        entries are acked and counted together (``_accepted``, which ``apply`` calls for one).
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
                    self.settle_ahead(consumer, accepts[i], ACCEPTED)
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
        if self.spans is not None:
            self.spans.settled(entries, 'accepted')
        self.counters.accepted_all(consumer.address, consumer.group, entries, time.time())
        self.store.messages.ack_nowait(consumer.address, consumer.group, entries)

    def disposition(self, consumer: ConsumerLink, delivery: Ptr) -> None:
        code = wire.shoal_outcome(delivery)  # settles a terminal outcome
        if code == codes.OUTCOME_NONE:  # e.g. `received`: not an outcome yet
            return
        if code == codes.OUTCOME_TRANSACTIONAL:
            self._transactional_ack(consumer, delivery)
            return
        entry = consumer.unacked.pop(delivery, None)  # the pointer is only a key by now
        if entry is not None:
            self.apply(consumer, entry, _DISPOSITIONS[code])
        elif consumer.ahead:
            self.settle_ahead(consumer, delivery, _DISPOSITIONS[code])

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
                ahead.answered = self.turns.loop.create_future()
                txn.naming.append(ahead.answered)

    def _transactional(
        self, consumer: ConsumerLink, entry: Entry, txn_id: Any, outcome: Any
    ) -> None:
        txn = self.coordinator.find(txn_id)
        code = getattr(outcome, 'descriptor', codes.ACCEPTED)
        if txn is not None and code == codes.ACCEPTED:
            txn.acks.append((consumer.address, consumer.group, entry))
        elif code == codes.ACCEPTED:  # its transaction is gone: as if rolled back
            self.redeliver(consumer.address, consumer.group, entry, delivery_failed=True)
        else:
            modified = codes.BY_NAME['MODIFIED']  # also what an unknown outcome counts as
            row = codes.BY_DESCRIPTOR.get(code, modified)
            fields = getattr(outcome, 'value', None) or []
            failed = bool(fields[0]) if code == modified.descriptor and fields else False
            self.apply(consumer, entry, Disposition(Outcome[row.name], delivery_failed=failed))

    def apply(
        self, consumer: ConsumerLink, entry: Entry, disposition: Disposition
    ) -> Awaitable[None] | None:
        if disposition.outcome is Outcome.ACCEPTED:  # decide()'s first rule, without the call
            self._accepted(consumer, [entry])
            return None
        sub = consumer.subscription
        attempts = sub.max_delivery_attempts if sub else self.routing.max_delivery_attempts
        decision = outcomes.decide(disposition, entry.delivery_count, attempts)
        if self.spans is not None:
            self.spans.settled([entry], disposition.outcome)
        self.counters.settled(consumer.address, consumer.group, disposition.outcome)
        if decision.action is Action.RETURN:
            if decision.exclude_consumer:
                consumer.excluded.add(entry.key)
            if sub is not None:
                sub.gave_back()
            return self.redeliver(
                consumer.address, consumer.group, entry, delivery_failed=decision.delivery_failed
            )
        self.dead_letter(consumer.address, consumer.group, entry, decision.reason)
        return None

    def settle_ahead(self, consumer: ConsumerLink, delivery: Ptr, disposition: Disposition) -> None:
        """A peer's outcome for a delivery sent ahead: applied once the store names its entry."""
        ahead = consumer.ahead.pop(delivery, None)
        if ahead is not None:
            ahead.settle = lambda entry: self.apply(consumer, entry, disposition)

    def returner(self, consumer: ConsumerLink) -> Callable[[Entry], object]:
        """Returns an entry of ``consumer``'s without counting an attempt (an operator's close)."""
        return lambda entry: self.release(
            consumer.address, consumer.group, entry, delivery_failed=False
        )

    # -- what subscriptions schedule -------------------------------------------------------------

    def schedule_recovery(self, sub: Fed, delay: float) -> None:
        """After a failed fetch: return entries Redis handed us but we never got, then fetch.
        One recovery per subscription at a time, the one scheduled first: a second, started
        while the first ran, took its snapshot of what the subscription holds before the fetch
        that the first one's end started, and returned what that fetch had just delivered (a
        failover's failed fetches each asked for one: a whole fetch delivered twice). The one
        scheduled covers the fetches failed meanwhile: it reads what is pending when it runs."""
        key = id(sub)
        if key in self._recoveries:
            return
        self._recoveries.add(key)
        self.turns.call_later(delay, lambda: self.turns.spawn(self._recover_once(sub, key)))

    async def _recover_once(self, sub: Fed, key: int) -> None:
        try:
            again = await self._recover(sub)
        finally:
            self._recoveries.discard(key)
        if again is not None:
            self.schedule_recovery(sub, again)

    async def _recover(self, sub: Fed) -> float | None:
        """Returns the delay before trying again, or None when done."""
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
            sub.retry_delay = next_retry_pause(sub.retry_delay)
            logger.warning('recovery of %s/%s postponed: %s', sub.address, sub.group, exc)
            return sub.retry_delay
        finally:
            sub.recovering = False
        if returned:
            logger.warning('%d entries of %s/%s recovered after a failed fetch',
                           returned, sub.address, sub.group)  # fmt: skip
        if (sub.address, sub.group) in self.nodes.subscriptions:
            sub.kick()
        return None

    def line(
        self, address: str, group: str, line: str, *, join: bool, hand_over: bool = True
    ) -> None:
        """Take or give up a consumer's place in an exclusive entity's line
        (``routing/exclusive.py``), queued now: ahead of a fetch that follows. Given up
        without ``hand_over``, what the consumer holds stays with it (the entity stops being
        exclusive)."""
        lines = self.store.lines
        if join:
            self.turns.spawn(_quietly(lines.join(address, group, line)))
        elif not hand_over:
            self.turns.spawn(_quietly(lines.leave(address, group, line, hand_over=False)))
        else:
            self.turns.spawn(self.leave_line(address, group, line, ()))

    async def leave_line(
        self, address: str, group: str, line: str, after: Sequence[Awaitable[None] | None]
    ) -> None:
        """Give up a consumer's place once ``after`` (the returns of its unsettled deliveries)
        are done: the next in line then finds them first."""
        await asyncio.gather(*(r for r in after if r is not None), return_exceptions=True)
        pause = 0.0
        for _ in range(LEAVE_ATTEMPTS):  # a place left behind would stop the line: try again
            try:
                if await self.store.lines.leave(address, group, line):
                    EXCLUSIVE_HANDOVERS.inc()
                return
            except BrokerError as exc:
                pause = next_retry_pause(pause)
                logger.warning('leaving the line of %s/%s failed (%s)', address, group, exc)
                await asyncio.sleep(pause)

    async def drop_groups(
        self, address: str, group: str, after: Sequence[Awaitable[None] | None]
    ) -> None:
        """Give up the message groups this replica owns in the subscription, its last consumer
        here gone,
        once ``after`` (the returns of that consumer's unsettled entries) are done: their next
        owner finds them first. Not if a consumer came back meanwhile."""
        await asyncio.gather(*(r for r in after if r is not None), return_exceptions=True)
        if (address, group) not in self.nodes.subscriptions:
            await _quietly(self.store.messages.drop_groups(address, group))

    def leave_sharing(self, address: str, group: str) -> None:
        """The subscription's last consumer here left: out of its sharing between replicas
        (queued now, so a consumer attaching right after registers again behind it)."""
        self.turns.spawn(_quietly(self.store.messages.leave_sharing(address, group)))


async def _quietly(done: Awaitable[object]) -> None:
    with contextlib.suppress(BrokerError):
        await done
