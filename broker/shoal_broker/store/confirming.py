"""
Fetches a Redis replica has not confirmed, in ``replicated`` durability: delivered only once one
does.

A fetch claims entries on the primary; its pipeline ends with ``WAIT 1`` so that what a consumer
gets is claimed on a replica too (docs/performance.md#durable-fetches). When that ``WAIT`` times
out (the primary has no replica, or it lags), delivering the entries anyway lets a failover undo
the claim, and with it possibly the very write of a message whose own ``WAIT`` timed out: the
message is then delivered again with delivery-count 0, or written again by the hold as a second
copy its duplicate window no longer knows. So such a fetch's entries wait here: a probe (a read
on the address's slot, in a pipeline that ends with its own ``WAIT``, on the same connection as
the fetch) asks again, with a growing pause, until a replica confirms, and only then are the
entries delivered. Meanwhile the subscription does not fetch again (its fetch is unanswered),
and producers are held for the same reason, so consumers only miss what was stored before.

A probe whose connection failed answers the fetch ``StoreUnavailable``: the entries were never
delivered, and the subscription's recovery returns those still pending (``stranded.py``). So does
a probe that another socket answered (``Op.carrier``): the fetch's was lost between two probes,
and the next one went to whatever primary the pool found, a new one after a failover, which may
never have had the claim; its replica confirming would deliver entries that the new primary
still hands out as unread. Past
``confirm_seconds`` (``SHOAL_STORE_HOLD_SECONDS``) with no replica, the entries are delivered
unconfirmed, as before: consumers do not stall for longer than producers are held.

Messages whose ``WAIT`` timed out wait the same way (``defer_writes``): they are in the stream
on that primary, so a replica confirming on the same socket confirms them, and they are answered
as stored. Written again instead (the hold, ``amqp/holding.py``), each would be stored twice once
a replica joined, a copy no consumer can tell from the first: every message sent while a
promoted primary had no replica came twice (2 000 of the 6 000 in the Sentinel chaos test). Only
when their socket is lost first (``StoreUnavailable``: the primary may have changed, and the
writes with it) does the hold write them again, a copy then only if the first write outlived
the failover, which duplicate detection drops. Past ``confirm_seconds`` they are rejected
(``UnconfirmedPastHold``), not held again: a producer waits no longer than the hold's bound.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from shoal_broker.errors import (
    BrokerError,
    StoreUnavailable,
    StoreUnconfirmed,
    UnconfirmedPastHold,
)
from shoal_broker.routing.storage import Fetched
from shoal_broker.store import keys
from shoal_broker.store.cycles import Cycles
from shoal_broker.store.ops import Op, fail

logger = logging.getLogger(__name__)

FIRST_PAUSE_SECONDS = 0.05
MAX_PAUSE_SECONDS = 0.5
"""Pauses between probes: doubling from the first to the last."""

FetchCallback = Callable[[Fetched | None, BrokerError | None], None]


Settle = Callable[[BrokerError | None, bool], None]
"""How a wait for a replica ends: (None, False) once one confirmed; (``StoreUnavailable``, False)
when the socket of the writes was lost or another one answered; (``StoreUnconfirmed``, True)
past ``confirm_seconds``; (the error, False) for any other failure."""


class Confirming:
    """Holds back the entries of fetches, and the answers to writes, no replica confirmed until
    one does."""

    def __init__(self, cycles: Cycles) -> None:
        self._cycles = cycles
        self.confirm_seconds = 30.0
        """How long a fetch's entries, or a write's answer, wait for a replica (set from
        ``SHOAL_STORE_HOLD_SECONDS``)."""
        self.waiting = 0
        """Fetches waiting for a replica now (a measure for tests)."""
        self.unconfirmed = 0
        """Fetches delivered unconfirmed past ``confirm_seconds``."""
        self.writes_waiting = 0
        """Write ops (one per message, or per batch of one producer link's messages) waiting
        for a replica now."""

    def answer(self, op: Op, address: str, callback: FetchCallback) -> FetchCallback:
        """The callback of fetch ``op``: the fetch's entries go to ``callback`` once confirmed."""

        def answered(fetched: Fetched | None, error: BrokerError | None) -> None:
            op.callback = None  # the op and this closure refer to each other: a cycle that only
            # the cyclic collector would free (docs/performance.md#ack-cycles)
            if error is None and fetched and op.unconfirmed and self.confirm_seconds > 0:
                self.waiting += 1
                self._wait(address, op.carrier, self._fetch_settled(address, fetched, callback),
                           'fetched the entries')  # fmt: skip
            else:
                callback(fetched, error)

        return answered

    def _fetch_settled(self, address: str, fetched: Fetched, callback: FetchCallback) -> Settle:
        def settled(error: BrokerError | None, past_bound: bool) -> None:
            self.waiting -= 1
            if error is None:
                callback(fetched, None)
            elif past_bound:
                self.unconfirmed += 1
                logger.warning(
                    'a fetch of %d entries of %s unconfirmed by a Redis replica for %.0f s: '
                    'delivered all the same', len(fetched), address, self.confirm_seconds,
                )  # fmt: skip
                callback(fetched, None)
            else:
                callback(None, error)  # never delivered: the recovery returns what is pending

        return settled

    def defer_writes(self, ops: list[Op]) -> None:
        """Write ops of one pipeline whose ``WAIT`` timed out, about to be settled with their
        replies: each is answered as the replies say once a replica confirms on their socket
        (``Op.carrier``), or fails as ``Settle`` says. Their callbacks or futures are set
        aside meanwhile and the replies kept."""
        if self.confirm_seconds <= 0:
            for op in ops:
                fail(op, StoreUnconfirmed('no Redis replica confirmed the write in time'))
            return
        kept: list[tuple[Op, Any, Any]] = []
        replies: dict[int, tuple[Any, BrokerError | None]] = {}
        for op in ops:
            kept.append((op, op.callback, op.future))
            op.future = None
            op.callback = _keeper(replies, id(op))
        self.writes_waiting += len(ops)

        def settled(error: BrokerError | None, past_bound: bool) -> None:
            self.writes_waiting -= len(ops)
            if past_bound:
                logger.warning('%d writes unconfirmed by a Redis replica for %.0f s: not accepted',
                               len(ops), self.confirm_seconds)  # fmt: skip
            for op, callback, future in kept:
                op.callback, op.future, op.answered = callback, future, False
                value, own_error = replies.get(id(op), (None, StoreUnavailable('no reply')))
                failure = own_error or (_past_hold(self.confirm_seconds, op) if past_bound
                                        else error)  # fmt: skip
                if failure is None:
                    op.resolve(value)
                else:
                    fail(op, failure)

        first = ops[0]
        address = first.batch[1] if first.batch is not None else ''
        self._wait(address, first.carrier, settled, 'wrote the messages')

    def _wait(self, address: str, carrier: int, settle: Settle, what: str) -> None:
        """Probe until a replica confirms on socket ``carrier``; then ``settle``."""
        loop = self._cycles.loop or asyncio.get_running_loop()
        self._probe(address, settle, what, loop.time(), FIRST_PAUSE_SECONDS, carrier)

    def _probe(
        self, address: str, settle: Settle, what: str, since: float, pause: float, carrier: int
    ) -> None:
        def probed(_: object, error: BrokerError | None) -> None:
            loop = self._cycles.loop or asyncio.get_running_loop()
            waited = loop.time() - since
            if probe.carrier != carrier and not self._cycles.closed:
                # another socket answered: the one that made the writes is gone, and with it,
                # after a failover, maybe the writes; a replica of this primary confirms
                # nothing about them
                settle(StoreUnavailable(
                    f'the connection that {what} was lost before a Redis replica confirmed '
                    'them'), False)  # fmt: skip
            elif error is None:
                settle(None, False)
            elif not isinstance(error, StoreUnconfirmed) or self._cycles.closed:
                settle(error, False)
            elif waited >= self.confirm_seconds:
                settle(StoreUnconfirmed(
                    f'no Redis replica confirmed the write for {waited:.1f} s'), True)  # fmt: skip
            else:
                loop.call_later(pause, self._probe, address, settle, what, since,
                                min(MAX_PAUSE_SECONDS, pause * 2), carrier)  # fmt: skip

        groups = keys.AddressKeys.of(address).groups  # the address's slot: the writes' node
        probe = Op([('EXISTS', groups)], _nothing, None, callback=probed)
        probe.durable = True  # its pipeline waits for a replica; unconfirmed, it fails
        self._cycles.queued.append(probe)
        self._cycles.wakeup.set()


def _past_hold(seconds: float, op: Op) -> BrokerError:
    """What a write no replica confirmed within the hold's bound fails with: rejected, not held
    again, so that its producer waits no longer than the bound; a message sent ahead is held
    all the same, as its consumer has it (the hold claims it again)."""
    if op.batch is not None and op.batch[0] == 'claim':
        return StoreUnconfirmed(f'no Redis replica confirmed the write for {seconds:.0f} s')
    return UnconfirmedPastHold(
        f'no Redis replica confirmed the message within {seconds:g} s: it was not accepted (it '
        'may be stored: with duplicate detection on, sending it again stores no second copy)'
    )


def _keeper(
    replies: dict[int, tuple[Any, BrokerError | None]], key: int
) -> Callable[[Any, BrokerError | None], None]:
    def keep(value: Any, error: BrokerError | None) -> None:
        replies[key] = (value, error)

    return keep


def _nothing(replies: list[object]) -> None:
    return None
