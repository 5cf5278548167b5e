"""
The lines of exclusive queues and subscriptions (``routing/exclusive.py``): a consumer's place
in one, taken and given up through the message path's cycles, so that a place is taken before
the fetch that follows the attach, and given up after the returns of the consumer's unsettled
deliveries that its replica queued first; and the fetch gated on the line (``fetch.lua``).
"""

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shoal_broker.routing.exclusive import STANDBY
from shoal_broker.routing.storage import Fetched
from shoal_broker.store import keys
from shoal_broker.store.calls import Scripts, as_text, call
from shoal_broker.store.cycles import Cycles
from shoal_broker.store.fetch_command import fetch_call

__all__ = ['STANDBY', 'Lines', 'gated_fetch', 'standby']

Script = Callable[[str, Sequence[str], Sequence[Any]], tuple[Any, ...]]


def gated_fetch(
    script: Script, address: str, group: str, replica: str, count: int, active: str
) -> tuple[Any, ...]:
    """The fetch of an exclusive entity for the local consumer ``active`` (``fetch.lua``'s
    KEYS[18] and ARGV[8]): granted only while it is first in line, with no sharing between
    replicas (ARGV[5] 0)."""
    member = f'{replica}|{active}'
    script_keys, args = fetch_call(address, group, replica, count, line_member=member)
    return script('fetch', script_keys, args)


def standby(reply: Sequence[Any], replica: str) -> Fetched:
    """A gated fetch refused: nothing, and the local consumer first in line, if one is."""
    first_replica, _, consumer = as_text(reply[2]).partition('|')
    return Fetched((), STANDBY, active=consumer if first_replica == replica else '')


def _flag(replies: list[Any]) -> bool:
    return bool(int(replies[0]))


class Lines:
    """Implements ``routing.storage.LinePort``."""

    def __init__(self, client: Any, scripts: Scripts, cycles: Cycles, replica_id: str) -> None:
        self._client = client
        self._script = scripts.command
        self._queue = cycles.queue
        self._replica_id = replica_id

    def member(self, consumer: str) -> str:
        """This replica's consumer ``consumer`` as a member of a line."""
        return f'{self._replica_id}|{consumer}'

    def join(self, address: str, group: str, consumer: str) -> Awaitable[bool]:
        """Take a place at the end of the line; resolves True when it is first (active)."""
        k = keys.AddressKeys.of(address)
        command = self._script('exclusive_join', (k.line(group),), (self.member(consumer),))
        return self._queue([command], _flag)

    def leave(
        self, address: str, group: str, consumer: str, *, hand_over: bool = True
    ) -> Awaitable[bool]:
        """Give up the place; resolves True when the next in line took over (a hand-over).
        Without ``hand_over`` (the entity stops being exclusive) only the place goes: what the
        consumer holds stays with it."""
        k = keys.AddressKeys.of(address)
        if not hand_over:
            return self._queue([('ZREM', k.line(group), self.member(consumer))], lambda r: False)
        script_keys = (k.line(group), *k.streams, k.returned(group))
        args = (self.member(consumer), group, self._replica_id, k.notify)
        return self._queue([self._script('exclusive_leave', script_keys, args)], _flag)

    async def line(self, address: str, group: str) -> list[str]:
        """The members in line, the active one first."""
        members = await call(self._client.zrange(keys.AddressKeys.of(address).line(group), 0, -1))
        return [as_text(m) for m in members]
