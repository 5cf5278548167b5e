"""
Big messages' bodies deleted as their messages are consumed, not at the next trim pass.

A consumed big message's body (``store/bodies.py``) stayed in Redis until the trim pass, every
``SHOAL_TRIM_INTERVAL_SECONDS``: at 400 messages of 1 MiB a second that is gigabytes held, and
every body written went into memory Redis had to fault in afresh. 1 500 bodies of 1 MiB cost
Redis 0.93 s of system CPU deleted 500 at a time, 0.32 s deleted as they went, and it held 500
MiB against 30 (docs/performance.md#bodies-freed-as-consumed).

So once a cycle's acks of an address whose big bodies this replica wrote or read
(``RecentBodies.addresses``) are answered, the acked band's stream is trimmed: trim.lua, which
removes only what every subscription has consumed, rides the next cycle's pipeline, and the
bodies it names and their index members ride the one after, ahead of the next call (as the
trim pass deletes them, ``Upkeep._bodies_deleted``: a member never leaves before its body).
One trim at a time per stream; acks answered meanwhile start one more ``TRIM_GAP_SECONDS``
after it. Any replica may trim any stream: trim.lua is one atomic step, and a body or index
member named twice is deleted twice, harmlessly. A trim that fails is left to the trim pass,
which still deletes whatever this does not (addresses no replica here consumes, a replica
that died). An address found holding no body after its trim leaves
``RecentBodies.addresses`` until a big message passes this replica again, so an address that
once carried one does not trim after every ack from then on.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from shoal_broker.errors import BrokerError
from shoal_broker.store import bodies, keys
from shoal_broker.store.bodies import RecentBodies
from shoal_broker.store.calls import REDIS_DOWN
from shoal_broker.store.upkeep import MAX_TRIM_STEPS, TRIM_STEP_ENTRIES

logger = logging.getLogger(__name__)

TRIM_GAP_SECONDS = 0.05
"""A stream acked again while it was trimmed is trimmed again this long after: acks come every
cycle, so at most ~20 trims start on a stream a second, each going on while its calls remove
something."""


class BodyTrims:
    """``consumed`` for ``Acks``: the trims of streams whose big messages were acked."""

    def __init__(
        self,
        queue: Callable[..., Awaitable[Any]],
        command: Callable[[str, Sequence[str], Sequence[Any]], tuple[Any, ...]],
        recent: RecentBodies,
        background: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        """``queue``: ``Cycles.queue``; ``command``: ``Scripts.command``."""
        self._queue = queue
        self._command = command
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
        stream = k.streams[band]
        try:
            while True:
                self._again.discard(stream)
                self.trims += 1
                try:
                    await self._trim_once(address, k, stream)
                except (BrokerError, *REDIS_DOWN) as exc:
                    logger.debug('trim of %s after its acks left to the trim pass: %s', stream, exc)
                    return
                if stream not in self._again:
                    return
                await asyncio.sleep(TRIM_GAP_SECONDS)
        finally:
            self._trimming.discard(stream)
            self._again.discard(stream)

    async def _trim_once(self, address: str, k: keys.AddressKeys, stream: str) -> None:
        """trim.lua until the stream is trimmed (a call removes whole stream nodes up to its
        limit, then the rest exactly), each call after the first carrying the deletion of the
        bodies and index members the one before named; the index's ``EXISTS`` last in each."""
        trim = self._command('trim', (stream, k.levels, k.body_index), (TRIM_STEP_ENTRIES,))
        exists = ('EXISTS', k.body_index)
        commands: list[tuple[Any, ...]] = [trim, exists]
        held = 1
        for _ in range(MAX_TRIM_STEPS):
            replies = await self._queue(commands, _all)
            reply, held = replies[-2], replies[-1]
            members = reply[2:]
            if not members:  # no body due: done unless the limit stopped the call
                if not int(reply[1]):
                    break
                commands = [trim, exists]
                continue
            commands = [
                ('UNLINK', *bodies.due_keys(k.body_index, members)),
                ('ZREM', k.body_index, *members),
                trim,
                exists,
            ]
        if not held:  # none left: its acks trim nothing until a big one passes here again
            self._addresses.discard(address)


def _all(replies: list[Any]) -> list[Any]:
    return replies
