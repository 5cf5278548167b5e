"""
Which local consumer holds each message group of one subscription on this replica.

Redis decides which replica owns a group (``lua/fetch.lua``: whichever replica's fetch meets it
first while nobody owns it); this replica only ever receives entries of the groups it owns.
Here each such group is pinned to one local consumer: at first sight, the one with the fewest
groups, then the most credit. It stays there while that consumer lives; a newer consumer
takes none from it. The first entry a consumer gets of a group it was just given carries the
message annotation ``JMSXGroupFirstForConsumer`` (true).

A group's entries go out in order: one whose consumer has no credit left is parked here, and so is
every later entry of its group until the parked ones go. When a consumer leaves, its groups move
(``moved``): its unsettled entries are being returned to Redis, where a fetch finds them ahead of
later ones, so an entry of a moved group that an earlier fetch brought, or that is parked here,
goes back too rather than overtaking them (docs/architecture.md, "Message groups").
"""

from collections.abc import Sequence
from typing import Protocol

from shoal_broker.amqp import recode
from shoal_broker.amqp.links import ConsumerLink, Identifiers
from shoal_broker.amqp.outlets import Outlet
from shoal_broker.routing.storage import Entry

FIRST_FOR_CONSUMER = 'JMSXGroupFirstForConsumer'
"""The message annotation on a consumer's first entry of a group it was just given (Artemis and
ActiveMQ set a message property of this name)."""

PARK = 'park'
RETURN = 'return'


class Groups:
    """The group -> consumer table of one local subscription."""

    __slots__ = ('_first', '_held', '_moved', '_owner', '_parked', 'fetches')

    def __init__(self) -> None:
        self._owner: dict[str, ConsumerLink] = {}
        self._held: dict[ConsumerLink, int] = {}
        """Groups per consumer."""
        self._first: set[str] = set()
        """Groups whose next entry is the first their consumer gets."""
        self._parked: dict[str, int] = {}
        """Entries parked here per group."""
        self._moved: dict[str, int] = {}
        """Group -> the last fetch started before it moved: entries such fetches brought go back."""
        self.fetches = 0
        """Fetches started so far (the subscription counts them)."""

    def __len__(self) -> int:
        return len(self._owner)

    def pick(
        self,
        entry: Entry,
        fetch: int,
        candidates: Sequence[ConsumerLink],
        credit: dict[ConsumerLink, int],
    ) -> ConsumerLink | str:
        """The consumer for ``entry`` (of a group), or PARK (it must wait here) or RETURN (it
        must go back to Redis). ``fetch``: the fetch that brought it (0: parked here; -1: a claim).
        The caller counts the credit it takes."""
        group = entry.group
        if fetch < 0:  # read by a claim, past its owner's say
            return RETURN
        moved = self._moved.get(group)
        if moved is not None:
            if fetch and fetch <= moved:
                return RETURN
            if fetch > moved:
                del self._moved[group]
        owner = self._owner.get(group)
        if owner is None or not owner.alive:
            if not candidates:
                return PARK
            owner = min(candidates, key=lambda c: (self._held.get(c, 0), -_left(c, credit)))
            self._owner[group] = owner
            self._held[owner] = self._held.get(owner, 0) + 1
            self._first.add(group)
        elif owner not in candidates:
            return PARK
        if fetch and self._parked.get(group):
            return PARK  # behind its parked entries
        if _left(owner, credit) <= 0:
            return PARK
        if group in self._first:
            self._first.discard(group)
            entry.rest = recode.with_flag(entry.rest, FIRST_FOR_CONSUMER)
        return owner

    def parked(self, entry: Entry) -> None:
        self._parked[entry.group] = self._parked.get(entry.group, 0) + 1

    def unparked(self, entry: Entry) -> None:
        left = self._parked.get(entry.group, 0) - 1
        if left > 0:
            self._parked[entry.group] = left
        else:
            self._parked.pop(entry.group, None)

    def moved_off(self, consumer: ConsumerLink) -> set[str]:
        """``consumer`` left: its groups go to other consumers, once what it held is back."""
        groups = {g for g, owner in self._owner.items() if owner is consumer}
        for group in groups:
            del self._owner[group]
            self._first.discard(group)
            self._moved[group] = self.fetches + 1  # and one its leaving may start at once
        self._held.pop(consumer, None)
        return groups

    def moving(self, entry: Entry) -> bool:
        """Whether a parked entry's group moved (it goes back to Redis)."""
        return entry.group in self._moved


def _left(consumer: ConsumerLink, credit: dict[ConsumerLink, int]) -> int:
    left = credit.get(consumer)
    if left is None:
        left = credit[consumer] = consumer.credit()
    return left


class Dealer(Protocol):
    """What ``grouped`` needs of a local subscription (``subscriptions.LocalSubscription``)."""

    groups: Groups
    address: str
    group: str
    outlet: Outlet
    _parked: list[tuple[float, Entry]]

    def _park(self, entry: Entry) -> None: ...

    def _wanting(self, entry: Entry, identifiers: Identifiers) -> list[ConsumerLink]: ...

    def _pick(
        self, entry: Entry, candidates: list[ConsumerLink], credit: dict[ConsumerLink, int]
    ) -> ConsumerLink | None: ...


def grouped(
    sub: Dealer,
    entry: Entry,
    candidates: Sequence[ConsumerLink],
    credit: dict[ConsumerLink, int],
    fetch: int,
) -> ConsumerLink | None:
    """The consumer an entry of a group goes to; None when it was parked or given back."""
    verdict = sub.groups.pick(entry, fetch, candidates, credit)
    if verdict is PARK:
        sub._park(entry)
        sub.groups.parked(entry)
        return None
    if verdict is RETURN:
        sub.outlet.release(sub.address, sub.group, entry, delivery_failed=False)
        return None
    return verdict  # type: ignore[return-value]


def deliver_parked(sub: Dealer) -> None:
    """Deal what is parked at a subscription, in order, as credit allows; the rest stays."""
    parked, sub._parked = sub._parked, []
    identifiers = Identifiers()
    credit: dict[ConsumerLink, int] = {}
    for deadline, entry in parked:
        wanting = sub._wanting(entry, identifiers)
        if entry.group:
            sub.groups.unparked(entry)
            if (consumer := grouped(sub, entry, wanting, credit, 0)) is None:
                continue
        else:
            consumer = sub._pick(entry, wanting, credit)
        if consumer is not None:
            credit[consumer] -= 1
            consumer.send((entry,))
            sub.outlet.sent(consumer, [entry])
        else:
            sub._parked.append((deadline, entry))


def move_off(sub: Dealer, consumer: ConsumerLink) -> None:
    """``consumer`` left: its groups move, and their entries parked here go back to Redis, where
    its unsettled ones are going too (a fetch hands them out in order)."""
    moved = sub.groups.moved_off(consumer)
    if not moved:
        return
    keep = []
    for deadline, entry in sub._parked:
        if entry.group in moved:
            sub.groups.unparked(entry)
            sub.outlet.release(sub.address, sub.group, entry, delivery_failed=False)
        else:
            keep.append((deadline, entry))
    sub._parked = keep


def any_grouped(entries: Sequence[Entry]) -> bool:
    return any(entry.group for entry in entries)
