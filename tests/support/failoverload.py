"""The load the Redis failover chaos tests put through two broker replicas, and what they count
of it afterwards: which accepted bodies were lost, and which came twice with no reason a failover
explains. Shared so that every failover (Sentinel, Redis Cluster) is judged by the same rules."""

import collections
import dataclasses
from typing import Any

from loadclient import ChaosConsumer, ChaosProducer, ChaosRun

ROLLBACK_WINDOW = 1.0
"""Seconds before the kill within which a delivery may be undone by the failover (the last
fetches and acks a replica had not received)."""

REPLICATED = {'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '500'}
"""A broker's environment for ``replicated`` durability: a write counts once a replica has it."""


def crossed_load(
    a_url: str, b_url: str, queue: str, load: int, *, message_ids: bool = False
) -> ChaosRun:
    """Started: bodies ``0 .. load - 1`` sent to ``queue``, the even ones first through broker a
    and the odd ones first through b, and consumed by two consumers, one starting on each; every
    client moves to the other broker when its connection is lost. ``message_ids``: each body
    has a message-id of its own, the same when it is sent again."""
    return ChaosRun(
        [ChaosProducer([a_url, b_url], queue, range(0, load, 2), message_ids=message_ids),
         ChaosProducer([b_url, a_url], queue, range(1, load, 2), message_ids=message_ids)],
        [ChaosConsumer([a_url, b_url], queue, 'c0', credit=50),
         ChaosConsumer([b_url, a_url], queue, 'c1', credit=50)],
        timeout=100,
    ).start()  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Tally:
    """What a run delivered, by body."""

    lost: set[Any]
    """Accepted and never received."""
    duplicates: set[Any]
    """Received more than once."""
    redelivered: set[Any]
    """Received at least once with a delivery count above zero."""
    redeliveries: int
    """Receipts with a delivery count above zero."""
    rolled_back: set[Any]
    """Accepted duplicates neither released (sent again) nor counted as redelivered."""
    unexplained: set[Any]
    """Those of ``rolled_back`` first received before the rollback window: a failover cannot
    have undone their first delivery."""


def tally(run: ChaosRun, since: float) -> Tally:
    """Counts ``run``; ``since`` is when Redis was broken (``time.monotonic()``).

    An accepted body comes twice as a counted redelivery, because it was released (written, not
    confirmed by a replica in time) and sent again, or because its first delivery was among the
    last fetches and acks the replica had not received when the primary died (not WAITed for:
    the promoted replica delivers it again, delivery count and all, as new)."""
    by_body = collections.Counter(r.body for r in run.receipts)
    duplicates = {body for body, n in by_body.items() if n > 1}
    redelivered = {r.body for r in run.receipts if r.delivery_count > 0}
    first_at: dict[Any, float] = {}
    for r in run.receipts:
        first_at.setdefault(r.body, r.at)
    rolled_back = (duplicates & run.accepted) - redelivered - run.released_bodies
    return Tally(
        lost=run.accepted - run.received,
        duplicates=duplicates,
        redelivered=redelivered,
        redeliveries=sum(1 for r in run.receipts if r.delivery_count > 0),
        rolled_back=rolled_back,
        unexplained={b for b in rolled_back if first_at[b] < since - ROLLBACK_WINDOW},
    )
