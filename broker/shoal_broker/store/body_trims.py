"""
Big messages' bodies deleted as their messages are consumed, not at the next trim pass.

A consumed big message's body (``store/bodies.py``) stayed in Redis until the trim pass, every
``SHOAL_TRIM_INTERVAL_SECONDS``: at 400 messages of 1 MiB a second that is gigabytes held, and
every body written went into memory Redis had to fault in afresh. 1 500 bodies of 1 MiB cost
Redis 0.93 s of system CPU deleted 500 at a time, 0.32 s deleted as they went, and it held 500
MiB against 30 (docs/performance.md#bodies-freed-as-consumed).

So once a cycle's acks of an address whose big bodies this replica wrote or read
(``RecentBodies.addresses``) are answered, the acked band's stream is trimmed
(``Upkeep.trim_streams``: trim.lua, which removes only what every subscription has consumed,
then the bodies it names). One trim at a time per stream; acks answered meanwhile start one
more ``TRIM_GAP_SECONDS`` after it. Any replica may trim any stream: trim.lua is one atomic
step, and a body or index member named twice is deleted twice, harmlessly. A trim that fails
is left to the trim pass, which still deletes whatever this does not (addresses no replica
here consumes, a replica that died). An address found holding no body after its trim leaves
``RecentBodies.addresses`` until a big message passes this replica again, so an address that
once carried one does not trim after every ack from then on.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store import keys
from shoal_broker.store.bodies import RecentBodies
from shoal_broker.store.calls import REDIS_DOWN
from shoal_broker.store.upkeep import Upkeep

logger = logging.getLogger(__name__)

TRIM_GAP_SECONDS = 0.05
"""A stream acked again while it was trimmed is trimmed again this long after: acks come every
cycle, and a trim is two round trips and a few hundred µs of the broker's CPU, so at most ~20
trims a second a stream, each deleting what that time consumed."""


class BodyTrims:
    """``consumed`` for ``Acks``: the trims of streams whose big messages were acked."""

    def __init__(
        self,
        upkeep: Upkeep,
        recent: RecentBodies,
        background: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._upkeep = upkeep
        self._addresses = recent.addresses
        self._background = background
        self._trimming: set[str] = set()
        """Streams with a trim under way."""
        self._again: set[str] = set()
        """Of those, the ones acked since it began."""
        self.trims = 0
        """Trims run (a measure for tests)."""

    def consumed(self, address: str, band: int) -> None:
        """Acks of ``address``'s ``band`` were answered: trim that stream if the address's big
        bodies pass through this replica."""
        if address not in self._addresses:
            return
        k = keys.AddressKeys.of(address)
        stream = k.streams[band]
        if stream in self._trimming:
            self._again.add(stream)
            return
        self._trimming.add(stream)
        self._background(self._trim(address, k, band))

    async def _trim(self, address: str, k: keys.AddressKeys, band: int) -> None:
        keys_ = (k.streams[band], k.levels, k.body_index)
        stream = keys_[0]
        try:
            while True:
                self._again.discard(stream)
                self.trims += 1
                try:
                    await self._upkeep.trim_streams([keys_])
                    if not (await self._upkeep.indexed([k]))[0]:
                        # none left: its acks trim nothing until a big one passes here again
                        self._addresses.discard(address)
                except (StoreUnavailable, redis.exceptions.RedisError, *REDIS_DOWN) as exc:
                    logger.debug('trim of %s after its acks left to the trim pass: %s', stream, exc)
                    return
                if stream not in self._again:
                    return
                await asyncio.sleep(TRIM_GAP_SECONDS)
        finally:
            self._trimming.discard(stream)
            self._again.discard(stream)
