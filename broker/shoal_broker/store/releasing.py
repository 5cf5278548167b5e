"""
Returning entries to their subscription: a release (released, failed, or later), and the
release of new entries a fetch in bulk read beside returned ones (``Messages._fetch_op``).
A part of ``Messages`` kept apart to keep each module short.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shoal_broker.errors import BrokerError, next_retry_pause
from shoal_broker.routing.storage import Entry
from shoal_broker.store import keys
from shoal_broker.store.cycles import Cycles
from shoal_broker.store.ops import no_result

logger = logging.getLogger(__name__)


class Releasing:
    """``Messages``' releases (``routing.storage.MessagePort``)."""

    _cycles: Cycles
    _queue: Callable[..., asyncio.Future[Any]]
    _script: Callable[..., tuple[Any, ...]]

    async def _give_back(
        self, address: str, group: str, entries: list[Entry], releases: list[Awaitable[None]]
    ) -> None:
        """See that the releases ``_fetch_op`` queued for new entries a fetch in bulk read beside
        returned or other bands' ones are done (``_returned``)."""

        def again() -> Awaitable[Any]:  # in one cycle, in order; one already done is done again
            return asyncio.gather(
                *(self.release(address, group, e, delivery_failed=False) for e in entries)
            )

        await self._returned(address, group, len(entries), asyncio.gather(*releases), again)

    def release(
        self,
        address: str,
        group: str,
        entry: Entry,
        *,
        delivery_failed: bool,
        delay_ms: int = 0,
        ahead_of_fetch: bool = False,
    ) -> Awaitable[None]:
        k = keys.AddressKeys.of(address)
        member = keys.entry_member(entry.band, entry.id)
        field = keys.entry_field(entry.band, entry.id)
        commands: list[tuple[Any, ...]] = []
        if delay_ms:  # due on Redis's clock, which fetch.lua reads (release_later.lua)
            script_keys = (k.returned(group), k.delivery_counts(group))
            args = (member, field, int(delivery_failed), delay_ms)
            commands.append(self._script('release_later', script_keys, args))
        else:
            if delivery_failed:
                # count first: a replica fetching between the two commands must see the new count
                commands.append(('HINCRBY', k.delivery_counts(group), field, 1))
            commands.append(('ZADD', k.returned(group), 0, member))
        released = self._queue(commands, no_result, notify=address, notify_local=True)
        if ahead_of_fetch:
            self._ahead_of_fetch((address, group))
        return released

    def _ahead_of_fetch(self, subscription: tuple[str, str]) -> None:
        """Move the op just queued (a consumer's give-back) ahead of the subscription's fetch
        still waiting for its cycle, if one is: the fetch was asked for before the outcome was
        read, but it reaches Redis after it, and must find the entry returned (or waiting out
        its delay) rather than hand out newer ones past it. A peer that fails a message and
        then has the next one sent (through any replica) gets the failed one first on an
        exclusive or grouped subscription, whatever this replica read first: the store's reply
        that asked for the fetch, or the outcome."""
        fetch = self._cycles.queued_fetches.get(subscription)
        if fetch is None:  # the common case, and a plain queue's: no walk of the queue
            return
        queued = self._cycles.queued
        # by identity, in C: a consumer leaving with a thousand unsettled gives them all back in
        # one loop turn, and a walk in Python per give-back went quadratic
        queued.insert(queued.index(fetch), queued.pop())

    def release_behind(self, address: str, group: str, entries: Sequence[Entry]) -> None:
        """Return entries behind every returned one (``release_behind.lua``), uncounted, queued
        now: ahead of any fetch asked for next; tried again while Redis refuses (``_returned``)."""
        k = keys.AddressKeys.of(address)
        members = [keys.entry_member(entry.band, entry.id) for entry in entries]
        command = self._script('release_behind', (k.returned(group),), members)

        def again() -> Awaitable[None]:
            return self._queue([command], no_result, notify=address, notify_local=True)

        self._cycles.background(self._returned(address, group, len(members), again(), again))

    async def _returned(
        self,
        address: str,
        group: str,
        count: int,
        released: Awaitable[Any],
        again: Callable[[], Awaitable[Any]],
    ) -> None:
        """Await ``released``; a refusal is tried again (``again``) with a growing pause, as
        ``Broker.release`` does: the entries are pending on this replica, and nothing else would
        return them while it lives."""
        pause = 0.0
        while True:
            try:
                await released
                return
            except BrokerError as exc:
                if self._cycles.closed:  # pending on a replica that stops: reclaimed like a crash's
                    return
                pause = next_retry_pause(pause)
                logger.warning('returning %d entries to %s/%s failed (%s); again in %.2f s',
                               count, address, group, exc, pause)  # fmt: skip
                await asyncio.sleep(pause)
                released = again()
