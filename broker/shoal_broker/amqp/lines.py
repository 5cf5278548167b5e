"""
A local subscription's part in an exclusive entity's line (``routing/exclusive.py``): which of
its consumers it fetches for, and which may be dealt to.

The line in Redis (``store/lines.py``) says which consumer, cluster-wide, is first. A replica
fetches for one local consumer, its oldest until a fetch answers that another local consumer is
first (``first_elsewhere``); the fetch is granted only while that consumer is first in line,
and the entries it brings go to that consumer alone (``pool``).

Also the order through a consumer's failure, for exclusive and grouped subscriptions alike: a
fetch whose reply came in the same loop turn as a give-back, or went out before it, sends what
it brought back behind the failed entry (``gave_back``, ``_answered_later``).
"""

import itertools
from collections.abc import Callable

from shoal_broker.amqp.groups import Groups
from shoal_broker.amqp.links import ConsumerLink
from shoal_broker.amqp.outlets import Outlet
from shoal_broker.errors import BrokerError
from shoal_broker.routing.storage import Fetched

_LINE_SERIALS = itertools.count(1)

SUBSCRIPTION_SLOTS = (
    '_again', '_due_at', '_held_since', '_share_check', 'address', 'ahead_allowed',
    'consumers', 'dead_letter_address', 'filters_consume', 'groups', 'handover_allowed',
    'hold_seconds', 'intake', 'max_age_ms', 'max_delivery_attempts', 'outlet', 'paused',
    'private', 'retry_delay',
)  # fmt: skip
"""The attributes ``LocalSubscription.__init__`` sets, as its ``__slots__``: its bases (``Line``,
``dispatch.Lane``) keep their instance dict, which then holds Lane's attributes alone. Past 30
attributes CPython 3.11 gives up the compact shared-key instance dict, ~1.7 KiB more per
subscription (docs/performance.md, "Memory per connection"). Not ``Line``'s class defaults
(``exclusive``, ``_active_line``): a slot would hide them."""


class Line:
    """Mixed into ``subscriptions.LocalSubscription``, whose ``consumers`` it reads."""

    consumers: list[ConsumerLink]
    outlet: Outlet
    address: str
    group: str
    exclusive = False
    """One consumer receives at a time, cluster-wide (``routing/exclusive.py``)."""
    _active_line = ''
    """The local consumer (``ConsumerLink.line``) fetched for: found first in line, or (none
    found yet) the oldest here."""
    _given_back_while_fetching = False
    """A consumer of an exclusive or grouped subscription gave an entry back while a fetch was
    out: what that fetch brings goes back behind it (``_behind_given_back``)."""
    groups: Groups
    """The message groups this replica owns (``amqp/groups.py``): some, and order matters."""
    _fetching: bool
    _again: bool
    _fetched: Callable[[Fetched | None, BrokerError | None, int, int], None]

    def _active(self) -> ConsumerLink | None:
        """The local consumer an exclusive entity is fetched for (``_active_line``)."""
        for consumer in self.consumers:
            if consumer.line == self._active_line:
                return consumer
        if self.consumers:
            self._active_line = self.consumers[0].line
            return self.consumers[0]
        return None

    def _first_elsewhere(self, first: str) -> bool:
        """Whether ``first`` (first in line, when it is this replica's) is another local consumer
        than the one fetched for: it becomes the one fetched for. One that is no longer here
        (its leaving failed) is taken out of the line, which wakes the next."""
        if not first or first == self._active_line:
            return False
        if any(c.line == first for c in self.consumers):
            self._active_line = first
            return True
        self.outlet.line(self.address, self.group, first, join=False)
        return False

    def _pool(self) -> list[ConsumerLink]:
        """The consumers an entry may go to: an exclusive entity's active one alone."""
        if not self.exclusive:
            return self.consumers
        return [c for c in self.consumers if c.line == self._active_line]

    def _set_exclusive(self, exclusive: bool) -> bool:
        """Whether the entity turned exclusive or stopped being so: the consumers here take or
        give up their places (no hand-over: all compete, or the line forms anew)."""
        if exclusive == self.exclusive:
            return False
        self.exclusive = exclusive
        for consumer in self.consumers:
            line = consumer.line
            self.outlet.line(self.address, self.group, line, join=exclusive, hand_over=False)
        return True

    def _take_place(self, consumer: ConsumerLink) -> None:
        """Name a consumer attaching here in the line; an exclusive entity's line gets it last."""
        consumer.line = f'{consumer.conn.id}|{consumer.name}|{next(_LINE_SERIALS)}'
        if self.exclusive:
            self.outlet.line(self.address, self.group, consumer.line, join=True)

    def gave_back(self) -> None:
        """A consumer gave an entry back (failed, released) while a fetch was out or its
        answer waits (``_answered_later``): on an exclusive or grouped subscription, the fetch
        may have read messages stored after that outcome left the peer, which must not go out
        ahead of it."""
        if self._fetching and (self.exclusive or len(self.groups)):
            self._given_back_while_fetching = True

    def _answered_later(
        self, entries: Fetched | None, error: BrokerError | None, asked: int, fetch: int
    ) -> None:
        """An exclusive or grouped subscription's fetch answer, taken a loop turn after its
        store reply: the peer's input read in the same turn goes first. A peer that fails a
        message and then has the next one sent (through any replica) may have its outcome read
        behind the store reply that brings that next one; seen before the deal, the outcome
        sends the fetch's entries back behind the failed one (``_behind_given_back``)."""
        self.outlet.call_later(
            0, lambda: self._fetched(self._behind_given_back(entries), error, asked, fetch)
        )

    def _behind_given_back(self, entries: Fetched | None) -> Fetched | None:
        """What to deal of a fetch's entries: none when a give-back came in meanwhile; they go
        back behind it (``release_behind.lua``), uncounted, and the subscription fetches again,
        gated on the returned entry's delay."""
        if not self._given_back_while_fetching or entries is None:
            return entries
        self._given_back_while_fetching = False
        if not entries:
            return entries
        self.outlet.store.messages.release_behind(self.address, self.group, entries)
        self._again = True
        return Fetched((), entries.left, entries.wait_ms, entries.active)
