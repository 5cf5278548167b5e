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

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Protocol

from shoal_broker.amqp import recode
from shoal_broker.amqp.links import ConsumerLink, Identifiers
from shoal_broker.amqp.outlets import Outlet
from shoal_broker.metrics.registry import ACTIVE_GROUPS, GROUP_MOVES
from shoal_broker.routing.storage import Entry

IDLE_SECONDS = 60.0
"""A group with nothing unsettled at its consumer, nothing waiting here and no message for
between one and two such periods is let go, here and in Redis: state of finished groups does not
pile up (docs/architecture.md, "Message groups")."""

FIRST_FOR_CONSUMER = 'JMSXGroupFirstForConsumer'
"""The message annotation on a consumer's first entry of a group it was just given (Artemis and
ActiveMQ set a message property of this name)."""

PARK = 'park'
RETURN = 'return'


class Groups:
    """The group -> consumer table of one local subscription."""

    __slots__ = (
        '_first', '_held', '_moved', '_owner', '_parked', '_seen', '_swept', 'fetches',
        'rebalance', 'sweeping',
    )  # fmt: skip

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
        self._seen: dict[str, int] = {}
        """Group -> ``fetches`` when an entry of it last went out."""
        self._swept = 0
        """``fetches`` at the last look for idle groups."""
        self.sweeping = False
        self.rebalance = False
        """``delivery.groupRebalance``: a consumer joining here takes groups not in flight."""

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
        if owner is None:
            if not candidates:
                return PARK
            owner = min(candidates, key=lambda c: (self._held.get(c, 0), -_left(c, credit)))
            self._owner[group] = owner
            self._held[owner] = self._held.get(owner, 0) + 1
            self._first.add(group)
            ACTIVE_GROUPS.inc()
        elif not owner.alive or owner not in candidates:
            return PARK
        if fetch and self._parked.get(group):
            return PARK  # behind its parked entries
        if _left(owner, credit) <= 0:
            return PARK
        self._seen[group] = self.fetches
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
        self._let_go(groups, self.fetches + 1)  # and a fetch its leaving may start at once
        self._held.pop(consumer, None)
        GROUP_MOVES.inc(len(groups))
        return groups

    def _let_go(self, groups: set[str], barrier: int) -> None:
        """Forget ``groups`` here; entries of them that fetches up to ``barrier`` bring go
        back to Redis."""
        for group in groups:
            owner = self._owner.pop(group)
            self._held[owner] = self._held.get(owner, 1) - 1
            self._first.discard(group)
            self._seen.pop(group, None)
            self._moved[group] = max(self._moved.get(group, 0), barrier)
        ACTIVE_GROUPS.dec(len(groups))

    def hold_back(self, groups: set[str]) -> None:
        """Entries of ``groups`` that fetches started so far bring go back to Redis (where
        earlier ones of theirs are going)."""
        for group in groups:
            self._moved[group] = max(self._moved.get(group, 0), self.fetches)

    def idle(self, busy: set[str], *, everything: bool = False) -> set[str]:
        """Let go of the groups with nothing in ``busy`` (unsettled or parked) and, unless
        ``everything``, no entry out since the last look; returns them."""
        swept, self._swept = self._swept, self.fetches
        groups = {
            g for g in self._owner
            if g not in busy and g not in self._parked
            and (everything or self._seen.get(g, 0) <= swept)
        }  # fmt: skip
        self._let_go(groups, self.fetches)
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
    consumers: list[ConsumerLink]
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
    if not sub.groups.sweeping:  # idle groups are let go from now on
        sub.groups.sweeping = True
        sub.outlet.call_later(IDLE_SECONDS, lambda: let_go(sub))
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


def let_go(sub: Dealer, *, everything: bool = False) -> None:
    """Let go of the idle groups (``IDLE_SECONDS``), or with ``everything`` of all those not in
    flight (a consumer joined and ``rebalance`` is on), here and in Redis; and look again later
    while groups are held."""
    groups = sub.groups
    busy = {e.group for c in sub.consumers for e in c.unacked.values() if e.group}
    idle = groups.idle(busy, everything=everything) if sub.consumers else set()
    if idle:
        done = sub.outlet.store.messages.forget_groups(sub.address, sub.group, sorted(idle))
        _quiet(done)
    if not everything:
        groups.sweeping = False
    if len(groups) and not groups.sweeping:
        groups.sweeping = True
        sub.outlet.call_later(IDLE_SECONDS, lambda: let_go(sub))


def _quiet(done: Awaitable[None]) -> None:
    """A failed let-go leaves the groups owned here until this replica leaves or is reaped."""
    if isinstance(done, asyncio.Future):
        done.add_done_callback(lambda f: f.cancelled() or f.exception())


def with_groups(
    sub: Dealer, due: list[Entry], keep: list[tuple[float, Entry]]
) -> tuple[list[Entry], list[tuple[float, Entry]]]:
    """Parked entries going back to Redis take the later parked ones of their groups with them,
    and so does a fetch under way: none may go out here before them."""
    groups = {entry.group for entry in due if entry.group}
    if not groups:
        return due, keep
    sub.groups.hold_back(groups)
    return (
        [*due, *(entry for _, entry in keep if entry.group in groups)],
        [(deadline, entry) for deadline, entry in keep if entry.group not in groups],
    )
