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
(``HoldExpired``), not released: Qpid JMS then throws a ``ResourceAllocationException`` that
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
from shoal_broker.errors import BrokerError, ResourceLimitExceeded
from shoal_broker.metrics.registry import HELD_SENDS_GIVEN_UP

logger = logging.getLogger(__name__)

PAUSES = (0.05, 0.1, 0.2, 0.25)
"""Pauses between attempts while they fail (the last one repeated)."""

PROBE_SECONDS = 2.0
"""How long the question whether a replica is back may go unanswered before it is asked again."""


class HoldExpired(ResourceLimitExceeded):
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
        self._replica_ready = replica_ready
        self._unconfirmed: str | None = None
        """An address a write was not confirmed on: nothing is written until a replica is."""
        self._probing = False

    # -- what producing tells the hold -----------------------------------------------------------

    def hold(self, send: HeldSend, *, unconfirmed: bool = False) -> None:
        """A message enters the hold: never sent (``sent`` False), its first write just failed,
        or the hold's own write of it did (``writing``); ``unconfirmed``: Redis has it, no
        replica confirmed it."""
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
        flight; give up what waited too long."""
        self._timer = None
        deadline = self.turns.loop.time() - self.hold_seconds
        if self._unconfirmed is not None and not self._probing:
            self._probing = True
            self.turns.spawn(self._probe(self._unconfirmed))
        for producer, queue in list(self._queues.items()):
            while queue and queue[0].since <= deadline:
                send = queue.popleft()
                self.bytes -= send.size
                self._expire(send, 'time')
            if self._unconfirmed is not None:
                if not queue:
                    del self._queues[producer]
                continue  # written again once a replica is back
            if queue and producer.in_store <= len(queue):  # none of its writes in flight
                del self._queues[producer]
                for send in queue:
                    send.sent = send.writing = True
                    self._writing.add(send)
                    send.write(send)
            elif not queue:
                del self._queues[producer]
        if not self._queues and not self._writing:
            self._stop()
        elif self._queues and self._timer is None:  # look again: expiries, writes answered
            pause = PAUSES[min(max(self._failures, 1), len(PAUSES)) - 1]
            self._timer = self.turns.loop.call_later(pause, self._pump)

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
        send.give_up(send, HoldExpired(text, reason))

    def _stop(self) -> None:
        """Nothing held any more: credit flows again."""
        if not self.active:
            return
        self.active = False
        self.turns.holding = False
        self._failures = 0
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
