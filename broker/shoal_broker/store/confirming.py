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
"""

import asyncio
import logging
from collections.abc import Callable

from shoal_broker.errors import BrokerError, StoreUnavailable, StoreUnconfirmed
from shoal_broker.routing.storage import Fetched
from shoal_broker.store import keys
from shoal_broker.store.cycles import Cycles
from shoal_broker.store.ops import Op

logger = logging.getLogger(__name__)

FIRST_PAUSE_SECONDS = 0.05
MAX_PAUSE_SECONDS = 0.5
"""Pauses between probes: doubling from the first to the last."""

FetchCallback = Callable[[Fetched | None, BrokerError | None], None]


class Confirming:
    """Holds back the entries of fetches no replica confirmed until one does."""

    def __init__(self, cycles: Cycles) -> None:
        self._cycles = cycles
        self.confirm_seconds = 30.0
        """How long a fetch's entries wait for a replica before they are delivered unconfirmed
        (set from ``SHOAL_STORE_HOLD_SECONDS``)."""
        self.waiting = 0
        """Fetches waiting for a replica now (a measure for tests)."""
        self.unconfirmed = 0
        """Fetches delivered unconfirmed past ``confirm_seconds``."""

    def answer(self, op: Op, address: str, callback: FetchCallback) -> FetchCallback:
        """The callback of fetch ``op``: the fetch's entries go to ``callback`` once confirmed."""

        def answered(fetched: Fetched | None, error: BrokerError | None) -> None:
            if error is None and fetched and op.unconfirmed and self.confirm_seconds > 0:
                self.waiting += 1
                loop = self._cycles.loop or asyncio.get_running_loop()
                self._probe(address, fetched, callback, loop.time(), FIRST_PAUSE_SECONDS,
                            op.carrier)  # fmt: skip
            else:
                callback(fetched, error)

        return answered

    def _probe(
        self,
        address: str,
        fetched: Fetched,
        callback: FetchCallback,
        since: float,
        pause: float,
        carrier: int,
    ) -> None:
        def probed(_: object, error: BrokerError | None) -> None:
            loop = self._cycles.loop or asyncio.get_running_loop()
            waited = loop.time() - since
            if probe.carrier != carrier and not self._cycles.closed:
                # another socket answered: the one that claimed the entries is gone, and with
                # it, after a failover, maybe the claim; a replica of this primary confirms
                # nothing about it
                self.waiting -= 1
                callback(None, StoreUnavailable(
                    'the connection that fetched the entries was lost before a Redis replica '
                    'confirmed them'))  # fmt: skip
            elif error is None:
                self.waiting -= 1
                callback(fetched, None)
            elif not isinstance(error, StoreUnconfirmed) or self._cycles.closed:
                self.waiting -= 1
                callback(None, error)  # never delivered: the recovery returns what is pending
            elif waited >= self.confirm_seconds:
                self.waiting -= 1
                self.unconfirmed += 1
                logger.warning(
                    'a fetch of %d entries of %s unconfirmed by a Redis replica for %.1f s: '
                    'delivered all the same', len(fetched), address, waited,
                )  # fmt: skip
                callback(fetched, None)
            else:
                loop.call_later(pause, self._probe, address, fetched, callback, since,
                                min(MAX_PAUSE_SECONDS, pause * 2), carrier)  # fmt: skip

        groups = keys.AddressKeys.of(address).groups  # the address's slot: the fetch's node
        probe = Op([('EXISTS', groups)], _nothing, None, callback=probed)
        probe.durable = True  # its pipeline waits for a replica; unconfirmed, it fails
        self._cycles.queued.append(probe)
        self._cycles.wakeup.set()


def _nothing(replies: list[object]) -> None:
    return None
