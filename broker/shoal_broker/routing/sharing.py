"""
How the replicas serving one queue or shared subscription share its messages.

Each replica reads for its own consumers, so without a rule whichever replica reads first takes
everything there is (up to its consumers' credit): the producer's replica, which reads right
after its own publish. The rule: every replica with consumers of the subscription keeps a record
in Redis (its consumers and their free credit as of its last fetch), and each fetch hands the
fetching replica only its share of what is available:

- entries nobody has a claim on yet (``available`` minus what is already *reserved*) are shared
  out among the replicas with consumers and free credit, in proportion to that credit: each gets
  ``floor(unreserved * credit / total credit)``, and what rounding leaves over goes one entry at a
  time by smooth weighted round robin (each replica's ``current`` grows by its credit, the largest
  takes the entry and gives back the total), so at a trickle successive messages alternate in
  proportion;
- the fetching replica takes its reservation, as far as its credit goes, and gives up the rest;
  the others' reservations wait for them (they are woken by the same notification);
- a reservation nobody collects lapses: when both it and its replica's last fetch are older than
  ``LAPSE_MS``, it goes back to everyone and the replica counts as having no free credit until
  its next fetch, so a hung or dead replica holds nothing for long.

Free credit counts each consumer's prefetch, so more consumers, or consumers with more room, get
more; a consumer that holds everything it was given (slow to settle) has no free credit and gets
nothing more until it settles. A replica alone with consumers is not limited at all, which keeps
the single-consumer paths (hand-over, sending ahead, reading in bulk) as they were, and writes
its record only once: the store checks whether anyone else keeps one, and nothing more.

Pure: plain numbers in, decisions out. ``store/lua/fetch.lua`` is the same rule in Lua, on the
record Redis keeps (``store/keys.py``, ``AddressKeys.shares``); ``tests/unit/test_sharing.py``
holds the two equal on the same inputs.
"""

import dataclasses

LAPSE_MS = 1000
"""How long a reservation waits for its replica, counted from whichever is later: the
reservation or the replica's last fetch."""


@dataclasses.dataclass(slots=True)
class Share:
    """One replica's record for one subscription."""

    consumers: int = 0
    credit: int = 0
    """Free credit of its consumers after its last fetch: its weight in the sharing."""
    reserved: int = 0
    """Entries set aside for it by other replicas' fetches, not collected yet."""
    current: int = 0
    """Its smooth weighted round robin counter."""
    fetched_ms: int = 0
    reserved_ms: int = 0
    """When its reservation last grew from nothing."""


def others_present(shares: dict[str, Share], me: str) -> bool:
    """Whether another replica has consumers of the subscription."""
    return any(share.consumers > 0 for replica, share in shares.items() if replica != me)


def others_idle(shares: dict[str, Share], me: str) -> bool:
    """Whether every other replica has nothing reserved and no free credit (or no consumers).
    ``grant`` then gives ``me`` ``min(credit, available)`` and changes no other record, so a
    fetch may skip counting what is available and rewrite only its own record
    (``store/lua/fetch.lua``'s fast path, ``share_others_idle`` in ``share.lua``)."""
    return all(
        share.reserved == 0 and (share.consumers == 0 or share.credit == 0)
        for replica, share in shares.items()
        if replica != me
    )


def grant(
    shares: dict[str, Share], me: str, consumers: int, credit: int, available: int, now_ms: int
) -> int:
    """How many of the ``available`` entries replica ``me`` (with ``consumers`` consumers and
    ``credit`` free credit) may take now; updates ``shares`` (adding ``me`` if missing) as the
    fetch leaves them. Alone, a replica may take as many as its credit, whatever is available
    (the store need not count what is available then)."""
    if not others_present(shares, me):  # alone: nothing to share; a first record, once
        shares.setdefault(me, Share(consumers, credit, fetched_ms=now_ms))
        return credit
    mine = shares.setdefault(me, Share())
    mine.consumers, mine.credit, mine.fetched_ms = consumers, credit, now_ms
    ordered = sorted(shares)
    for replica in ordered:
        share = shares[replica]
        if (
            replica != me
            and share.reserved > 0
            and now_ms - share.reserved_ms > LAPSE_MS
            and now_ms - share.fetched_ms > LAPSE_MS
        ):
            # lapsed: its replica did not come for it, so it is away until it fetches again
            share.reserved = share.credit = 0
    left = max(available, 0)
    for replica in [me, *(r for r in ordered if r != me)]:  # more reserved than there is
        share = shares[replica]
        share.reserved = min(share.reserved, left)
        left -= share.reserved
    _share_out(shares, ordered, left, now_ms)
    granted = min(credit, mine.reserved)
    mine.reserved = 0  # what its credit could not take goes back to everyone
    mine.credit = credit - granted
    return granted


def _share_out(shares: dict[str, Share], ordered: list[str], unreserved: int, now_ms: int) -> None:
    """Reserve ``unreserved`` entries among the replicas with consumers and free credit."""
    weighted = [r for r in ordered if shares[r].consumers > 0 and shares[r].credit > 0]
    total = sum(shares[r].credit for r in weighted)
    if unreserved <= 0 or total <= 0:
        return
    given = 0
    for replica in weighted:
        share = shares[replica]
        part = unreserved * share.credit // total
        _reserve(share, part, now_ms)
        given += part
    for _ in range(unreserved - given):  # fewer than len(weighted)
        for replica in weighted:
            shares[replica].current += shares[replica].credit
        chosen = max(weighted, key=lambda r: shares[r].current)  # the first of equals
        shares[chosen].current -= total
        _reserve(shares[chosen], 1, now_ms)


def _reserve(share: Share, count: int, now_ms: int) -> None:
    if count <= 0:
        return
    if share.reserved == 0:
        share.reserved_ms = now_ms
    share.reserved += count
