"""
Acknowledgements of what consumers accepted (``ack_nowait``), and in ``replicated`` durability
their confirmation by a Redis replica.

An ack is queued for the next pipeline, merged with the others of its subscription and band into
one ``XACK``: no round trip of its own. Redis replicates it asynchronously, so a failover can
undo an ack the replica had not received: the promoted replica still has the entry pending on
the broker replica that delivered it, whose next recovery returns it (``stranded.py``), and the
application gets again, as a redelivery, a message it has processed. In ``replicated`` durability
an ack is therefore *settling* until a replica confirms it:

- its pipeline ends with ``WAIT 1`` (the one its publishes and fetches already have, or one of
  its own): one ``WAIT`` covers every ack of the pipeline, so the batch grows with the load and
  the cost per message stays that of a few list appends (docs/performance.md#durable-acks);
- while it settles its entries count as held: a recovery leaves them pending, so an ack in
  flight across a failover is not turned into a redelivery (an ack in any durability is held
  until its pipeline answers: queued, it waits for the next one);
- a pipeline that failed (Redis unreachable, failing over) or whose ``WAIT`` timed out sends the
  ack again with a growing pause, for up to ``confirm_seconds`` (``SHOAL_STORE_HOLD_SECONDS``).
  ``XACK`` and ``HDEL`` are idempotent: on a promoted replica that lost the first one they apply
  it, on the same primary they change nothing and the ``WAIT`` after them confirms it.

The consumer sees nothing of this: it settled its accept when it sent it (as Qpid JMS does) and
the broker answers nothing to an accept. Past the bound (no replica confirmed anything for that
long) the ack is given up, applied on the primary only: a failover then may undo it, and the
entry comes back with one more attempt (delivery-count >= 1, JMSRedelivered true), never as new.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from shoal_broker.errors import BrokerError
from shoal_broker.routing.storage import Entry
from shoal_broker.store import keys
from shoal_broker.store.cycles import Cycles
from shoal_broker.store.ops import Op, no_result

logger = logging.getLogger(__name__)

FIRST_PAUSE_SECONDS = 0.05
MAX_PAUSE_SECONDS = 1.0
"""Pauses between attempts of an unconfirmed ack: doubling from the first to the last."""


class Acks:
    """``ack_nowait`` of ``routing.storage.MessagePort``, durable when ``durable``."""

    def __init__(self, cycles: Cycles, *, durable: bool) -> None:
        self._cycles = cycles
        # the cycles' queue and open batches, held here: reached once per accepted message
        self._open_acks = cycles.open_acks
        self._enqueue = cycles.queued.append
        self._wake_lazily = cycles.wake_lazily
        self.durable = durable
        """Each pipeline with acks waits for a replica, and an unconfirmed ack goes again."""
        self.confirm_seconds = 30.0
        """How long an ack is sent again while no replica confirms it (set from
        ``SHOAL_STORE_HOLD_SECONDS``)."""
        self._settling: dict[tuple[str, str], dict[int, Op]] = {}
        """Ack ops not answered yet (durable ones: not confirmed yet), by (address, group), by
        ``id(op)``."""
        self.given_up = 0
        """Acks given up unconfirmed past ``confirm_seconds`` (a measure for tests)."""
        self.consumed: Callable[[str, int], None] | None = None
        """Told (address, band) once acks of them are answered (``body_trims.py``)."""

    def ack_nowait(self, address: str, group: str, entries: Iterable[Entry]) -> None:
        """Queue an ack of ``entries`` in this cycle's op of their address, band and group."""
        open_acks = self._open_acks
        band: int | None = None
        args: list[Any] = []
        for entry in entries:
            if entry.band != band:  # this cycle's op for the address, band and group takes it
                band = entry.band
                key = ('ack', address, band, group)
                batched = open_acks.get(key)
                if batched is None:
                    batched = open_acks[key] = self._op(key, [])
                    self._enqueue(batched)
                    self._wake_lazily()  # as Cycles.queue's lazy ops: ride with the next pipeline
                args = batched.batch_args  # type: ignore[assignment]
            if entry.delivery_count:
                args += (entry.id, keys.entry_field(band, entry.id))
            else:
                args += (entry.id, None)

    def held(self, address: str, group: str) -> set[tuple[int, str]]:
        """(band, id) of the entries of a subscription whose acks are settling: pending in
        Redis, and not to be returned by a recovery."""
        ops = self._settling.get((address, group))
        if not ops:
            return set()
        return {(op.batch[2], i) for op in ops.values() if op.batch for i in op.batch_args[::2]}

    def _op(self, key: tuple[Any, ...], args: list[Any], started: float | None = None) -> Op:
        op = Op([], no_result, None, None, False, key, args)
        # held until its pipeline answers, durable or not: a queued ack rides with the next
        # pipeline, and a recovery reading the pending list meanwhile would otherwise return
        # an entry its consumer has accepted, to be delivered again
        self._settling.setdefault((key[1], key[3]), {})[id(op)] = op
        if not self.durable:
            op.callback = lambda _, error: self._done((key[1], key[3]), op, error)
            return op
        loop = self._cycles.loop or asyncio.get_running_loop()
        first = loop.time() if started is None else started
        op.durable = True
        op.callback = lambda _, error: self._answered(op, error, first)
        return op

    def _answered(self, op: Op, error: BrokerError | None, started: float) -> None:
        """A durable ack's pipeline answered: confirmed, done; else sent again after a pause,
        within ``confirm_seconds`` of its first attempt."""
        assert op.batch is not None
        subscription = (op.batch[1], op.batch[3])
        if error is None:
            self._done(subscription, op, None)
            return
        loop = self._cycles.loop or asyncio.get_running_loop()
        waited = loop.time() - started
        if self._cycles.closed:  # stopping: pending on a replica that stops, as after a crash
            self._forget(subscription, op)
            return
        if waited >= self.confirm_seconds:
            self._forget(subscription, op)
            self.given_up += 1
            logger.warning(
                'acknowledgement of %d entries of %s/%s not confirmed by a Redis replica within '
                '%.1f s (%s): applied on the primary only, a failover may deliver them again '
                '(with delivery-count >= 1)',
                len(op.batch_args) // 2, *subscription, waited, error,
            )  # fmt: skip
            return
        pause = min(MAX_PAUSE_SECONDS, max(FIRST_PAUSE_SECONDS, waited))
        loop.call_later(pause, self._again, op, started)

    def _again(self, op: Op, started: float) -> None:
        """Send ``op``'s acks again, as a new op (held meanwhile: the old one leaves only now)."""
        assert op.batch is not None
        subscription = (op.batch[1], op.batch[3])
        self._forget(subscription, op)
        if self._cycles.closed:
            return
        self._enqueue(self._op(op.batch, list(op.batch_args), started))
        self._cycles.wakeup.set()

    def _done(self, subscription: tuple[str, str], op: Op, error: BrokerError | None) -> None:
        """An ack op answered: forgotten, and its band told of when it applied."""
        band = op.batch[2] if op.batch else None
        self._forget(subscription, op)
        if error is None and self.consumed is not None and band is not None:
            self.consumed(subscription[0], band)

    def _forget(self, subscription: tuple[str, str], op: Op) -> None:
        # the op's callback closes over the op: a cycle that reference counting cannot free,
        # one per ack batch, left to the cyclic collector, whose young collections it made
        # 10-40 ms stalls every few seconds over 1 000 queues (docs/performance.md#ack-cycles)
        op.callback = None
        ops = self._settling.get(subscription)
        if ops is not None:
            ops.pop(id(op), None)
            if not ops:
                del self._settling[subscription]
