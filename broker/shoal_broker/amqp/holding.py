"""
Sends held through a store outage, instead of released: a failover stays invisible to producers.

Qpid JMS turns a ``released`` answer to a send into a JMSException on ``send()`` and does not
send again (jms-amqp-facts §5.1), so a routine 2 to 3 s Redis promotion threw in every producing
thread. Instead, a message whose write the store did not confirm for a transient reason (Redis
unreachable, a connection lost, READONLY, CLUSTERDOWN, TRYAGAIN or MOVED past the lanes' own
retries, a ``WAIT`` no replica confirmed: ``StoreUnavailable``) is *held*: it stays unsettled,
and the broker writes it again once the store answers, then answers ``accepted``. While
anything is held:

- no producer is granted new credit (``Turns.holding``), so what is held stays bounded by the
  credit already out;
- every new unsettled message goes into the hold behind those already there instead of to the
  store, so a producer's messages are written in the order it sent them: a producer's held
  messages are written again only once none of its writes is in flight, those that failed ahead
  of those that never went (``_queues``);
- consumers keep their links; they simply get nothing new until the store answers.

A message held longer than ``hold_seconds``, or one that would take the held bytes past
``max_bytes``, is rejected with ``amqp:resource-limit-exceeded`` and a description
(``HoldExpired``), not released, whether it waits for its next attempt or its last attempt is
still unanswered: a write the store never answers (a bug, a wedged connection) must not hold its
producer for ever, so a held message has a deadline of its own (``_give_up_overdue``). Such a
write answered after all is no one's to answer any more (``HeldSend.given_up``): stored, it is
a message its producer was told was not accepted, as for any write whose reply was lost.
Rejected, not released: Qpid JMS then throws a ``ResourceAllocationException`` that
says why, where ``released`` gives "Delivery failed: released by receiver" and invites an
immediate resend, the retry storm this exists to end. A message written but not confirmed (a
lost reply, a ``WAIT`` timeout) may be in Redis already: writing it again is a second copy,
which the duplicate detection of the publish script drops when it is on.

Attempts are spaced by ``PAUSES`` while they fail; one success writes whatever else is held at
once. The longest pause is what a held message may wait past the store's return, so it stays
short (an attempt against a store still down costs a refused connect). A write that Redis made
but no replica confirmed waits for one in the store, on the socket that wrote it
(``store/confirming.py``), and comes here only when that socket is lost first
(``StoreUnavailable``) or past the bound (``StoreUnconfirmed``: a promoted primary without a
replica yet); then it is not written again until a replica is back
(``MessagePort.replica_ready``, ``WAIT 0 0`` and ``ROLE``): every attempt before would only add
a copy in Redis. The moment a probe finds one,
what is held is written, not after the pause already running (with a longest pause of 1 s,
that pause alone kept a held send up to a second past the store's return; docs/redis-modes.md,
"Sends held through a failover"). The hold costs the hot path one attribute test per message
(``Holding.active``).
"""

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from shoal_broker.amqp.links import ProducerLink
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError, SendGivenUp
from shoal_broker.metrics.registry import HELD_SENDS_GIVEN_UP

logger = logging.getLogger(__name__)

PAUSES = (0.05, 0.1, 0.2, 0.25)
"""Pauses between attempts while they fail (the last one repeated)."""

PROBE_SECONDS = 2.0
"""How long the question whether a replica is back may go unanswered before it is asked again."""


class HoldExpired(SendGivenUp):
    """A held message could not be stored within the hold's bounds: it is not accepted (it may
    be sent again once the store is back)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        """For the metrics: ``time`` or ``memory``."""


@dataclasses.dataclass(eq=False, slots=True)
class HeldSend:
    """One held message: what writes it again and what gives it up."""

    producer: ProducerLink
    size: int
    write: Callable[['HeldSend'], None]
    give_up: Callable[['HeldSend', 'HoldExpired'], None]
    token: Any
    """The writer's own (the producing side's token of the message)."""
    sent: bool
    """Written at least once: held again after a failure, it goes ahead of those never sent."""
    since: float = 0.0
    """Loop time it was first held."""
    writing: bool = False
    """Written again by the hold and not answered yet."""
    address: str = ''
    given_up: bool = False
    """Answered by the hold (past its bound) while its last write was unanswered: what the
    store says of that write later is for no producer."""


class Holding:
    def __init__(
        self,
        turns: Turns,
        hold_seconds: float,
        max_bytes: int,
        producers: Callable[[], Iterable[ProducerLink]],
        replica_ready: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.turns = turns
        self.hold_seconds = hold_seconds
        self.enabled = hold_seconds > 0
        """Off (0 s): a store failure releases the message at once, as without a hold."""
        self.max_bytes = max_bytes
        self._producers = producers
        self.active = False
        """True while anything is held or being written again: new messages join the hold."""
        self._queues: dict[ProducerLink, collections.deque[HeldSend]] = {}
        """Each producer's held messages not in flight, in the order they are to be written."""
        self._writing: set[HeldSend] = set()
        """Held messages written again and not answered yet."""
        self.bytes = 0
        self._failures = 0
        """Attempts that failed in a row (the pause grows with it)."""
        self._timer: Any = None
        self._deadline: asyncio.TimerHandle | None = None
        """Armed while writes are unanswered: the oldest one's bound (``_give_up_overdue``)."""
        self._replica_ready = replica_ready
        self._unconfirmed: str | None = None
        """An address a write was not confirmed on: nothing is written until a replica is."""
        self._probing = False

    # -- what producing tells the hold -----------------------------------------------------------

    def hold(self, send: HeldSend, *, unconfirmed: bool = False) -> None:
        """A message enters the hold: never sent (``sent`` False), its first write just failed,
        or the hold's own write of it did (``writing``); ``unconfirmed``: Redis has it, no
        replica confirmed it."""
        if send.given_up:  # its write failed after the hold answered it: nothing to do
            return
        if unconfirmed:
            self._unconfirmed = send.address
        if send.writing:
            send.writing = False
            self._writing.discard(send)
            self._failures += 1
        else:
            if not self.active:
                self._start()
            if self.bytes + send.size > self.max_bytes:
                self._expire(send, 'memory')
                self._schedule()  # ends the hold if nothing else is in it
                return
            self.bytes += send.size
            send.since = self.turns.loop.time()
            if send.sent:
                self._failures += 1
        queue = self._queues.get(send.producer)
        if queue is None:
            queue = self._queues[send.producer] = collections.deque()
        if send.sent:  # ahead of any that never went: it was sent before them
            position = next((i for i, held in enumerate(queue) if not held.sent), len(queue))
            queue.insert(position, send)
        else:
            queue.append(send)
        self._schedule()

    def written(self, send: HeldSend) -> None:
        """A held message is stored (or refused for good): it leaves the hold."""
        if send.given_up:  # left it when given up
            return
        send.writing = False
        self._writing.discard(send)
        self.bytes -= send.size
        self._failures = 0
        self._schedule()

    def drop(self, send: HeldSend) -> None:
        """Its producer is gone and nothing else needs it written: it leaves unanswered."""
        self.written(send)

    # -- attempts --------------------------------------------------------------------------------

    def _start(self) -> None:
        self.active = True
        self.turns.holding = True
        logger.warning('the store does not answer: sends are held, producers get no new credit')

    def _schedule(self) -> None:
        """The next attempt: at once while writes succeed, after a growing pause while they
        fail."""
        if self._timer is not None:
            return
        if self._failures:
            pause = PAUSES[min(self._failures, len(PAUSES)) - 1]
            self._timer = self.turns.loop.call_later(pause, self._pump)
        else:
            self._timer = self.turns.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Write again what is held, each producer's in order once none of its writes is in
        flight; give up what waited too long. Whatever fails in a write or an answer, the
        next look is scheduled: a pump that stopped would hold what is left for ever."""
        self._timer = None
        deadline = self.turns.loop.time() - self.hold_seconds
        try:
            if self._unconfirmed is not None and not self._probing:
                self._probing = True
                self.turns.spawn(self._probe(self._unconfirmed))
            self._give_up_overdue(deadline)
            for producer, queue in list(self._queues.items()):
                self._pump_one(producer, queue, deadline)
        finally:
            self._next_look()

    def _pump_one(
        self, producer: ProducerLink, queue: collections.deque[HeldSend], deadline: float
    ) -> None:
        while queue and queue[0].since <= deadline:
            send = queue.popleft()
            self.bytes -= send.size
            self._expire(send, 'time')
        if self._unconfirmed is not None:
            if not queue:
                del self._queues[producer]
            return  # written again once a replica is back
        if queue and producer.in_store <= len(queue):  # none of its writes in flight
            del self._queues[producer]
            for send in queue:
                send.sent = send.writing = True
                self._writing.add(send)
                try:
                    send.write(send)
                except Exception:  # a bug: the send stays in ``_writing``, given up in time
                    logger.exception('writing a held message again failed')
        elif not queue:
            del self._queues[producer]

    def _give_up_overdue(self, deadline: float) -> None:
        """Answer the held messages whose write is still unanswered past the hold's bound."""
        overdue = [send for send in self._writing if send.since <= deadline]
        if not overdue:
            return
        logger.warning(
            'the store has not answered %d held writes within %g s: their messages are not '
            'accepted', len(overdue), self.hold_seconds,
        )  # fmt: skip
        for send in overdue:
            self._writing.discard(send)
            send.writing = False
            send.given_up = True
            self.bytes -= send.size
            self._expire(send, 'time')

    def _next_look(self) -> None:
        """End the hold once nothing is in it; otherwise look again after a pause while
        messages wait (expiries, writes answered), and at the oldest write's deadline."""
        if not self._queues and not self._writing:
            self._stop()
            return
        if self._queues and self._timer is None:
            pause = PAUSES[min(max(self._failures, 1), len(PAUSES)) - 1]
            self._timer = self.turns.loop.call_later(pause, self._pump)
        if self._writing and self._deadline is None:
            oldest = min(send.since for send in self._writing)
            due = max(oldest + self.hold_seconds - self.turns.loop.time(), 0.0) + PAUSES[0]
            self._deadline = self.turns.loop.call_later(due, self._on_deadline)

    def _on_deadline(self) -> None:
        """The oldest write's deadline: give up what is overdue, then go on as after an
        answer (its producer's next messages may go now)."""
        self._deadline = None
        try:
            self._give_up_overdue(self.turns.loop.time() - self.hold_seconds)
        finally:
            self._schedule()

    async def _probe(self, address: str) -> None:
        """Ask whether a replica is back; if so, writing resumes."""
        try:
            ready = await asyncio.wait_for(self._replica_ready(address), PROBE_SECONDS)
        except (BrokerError, TimeoutError):
            ready = False
        except Exception:  # a bug must not stop the probes: messages would wait out the bound
            logger.exception('asking whether a Redis replica is back failed')
            ready = False
        finally:
            self._probing = False
        if ready:
            self._unconfirmed = None
            self._failures = 0
            if self._timer is not None:  # write now, not after the pause running
                self._timer.cancel()
                self._timer = None
        else:
            self._failures += 1
        self._schedule()

    def _expire(self, send: HeldSend, reason: str) -> None:
        HELD_SENDS_GIVEN_UP.labels(reason).inc()
        if reason == 'time':
            text = (
                f'the message store did not answer for {self.hold_seconds:g} s: the message was '
                'not accepted (send it again once the store is back)'
            )
        else:
            text = (
                f'the message store does not answer and {self.max_bytes} bytes of messages are '
                'held already: the message was not accepted (send it again once the store is '
                'back)'
            )
        try:
            send.give_up(send, HoldExpired(text, reason))
        except Exception:  # a bug answering one must not keep the others held
            logger.exception('answering a held message given up failed')

    def _stop(self) -> None:
        """Nothing held any more: credit flows again."""
        if not self.active:
            return
        self.active = False
        self.turns.holding = False
        self._failures = 0
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._unconfirmed = None
        logger.warning('the store answers again: held sends are written, producers get credit')
        for producer in list(self._producers()):
            if producer.alive:
                self.turns.top_up(producer)

    # -- what the metrics and /readyz read -------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._writing) + sum(len(queue) for queue in self._queues.values())

    def oldest_seconds(self) -> float:
        """Age of the oldest message held (0 when none is)."""
        heads = [queue[0].since for queue in self._queues.values() if queue]
        oldest = min([*heads, *(send.since for send in self._writing)], default=None)
        return 0.0 if oldest is None else max(0.0, self.turns.loop.time() - oldest)
