"""
Exclusive (single active) consumers: one consumer of a queue or shared subscription receives at a
time, cluster-wide, and the others stand by in attach order (Artemis's exclusive queue,
RabbitMQ's single active consumer).

The rule, whose state is all in Redis on the address's slot (``store/keys.py``,
``AddressKeys.line``): every consumer of an exclusive entity takes a place in its *line*, a
sorted set ordered by attach time on Redis's clock. The first in line is the active consumer.
Only its replica fetches, only for it (``store/lua/fetch.lua`` answers any other replica with
``STANDBY``, without touching the sharing between replicas), and that replica deals to it
alone. A consumer leaves the line when it detaches or its connection goes; a replica leaves it
with its consumers when it stops, or is reaped once its lease has expired
(``store/replicas.py``): the line's places follow the replica leases, so a dead replica's
consumer is active until its lease expires and a reaper sees it, lease + about 1 s.

Hand-over keeps order: when the active consumer leaves, its unsettled deliveries are returned
first (delivery-count + 1, AMQP's rule for an unsettled delivery whose link is gone), then
everything its replica still holds of the entity (``exclusive_leave.lua``), and only then does
the next in line take over; a fetch serves returned entries first, oldest first, so the next
consumer starts where the last one stopped. A reaper returns a dead replica's entries
(``reclaim.lua``) before it takes that replica out of the line (``exclusive_reap.lua``).

An entity is exclusive when its Queue or SharedSubscription says so (``delivery.exclusive``),
or, when it says nothing, when its address matches one of ``SHOAL_EXCLUSIVE_ADDRESSES``. AMQP
1.0 and Qpid JMS have no exclusive-consumer capability; a receiver may assert it with the source
capability ``exclusive`` (``CAPABILITY``): on an entity that is not exclusive the attach is
refused with ``amqp:precondition-failed``, so a client that relies on the order never gets
competing delivery, and an exclusive entity's attach answer carries the capability.

Exclusive entities go through the store for every message: no hand-over and no sending ahead
(``routing/dispatch.py``), whose shortcuts pick a local consumer without asking the line.
"""

import fnmatch
from collections.abc import Sequence

STANDBY = -2
"""``Fetched.left`` of a fetch refused because this replica's consumer is not first in line."""

CAPABILITY = 'exclusive'
"""Source capability a receiver sets to require an exclusive entity (a Shoal extension)."""


def is_exclusive(declared: bool | None, address: str, patterns: Sequence[str]) -> bool:
    """Whether an entity is exclusive: its declaration, or the broker-wide address patterns
    (shell-style, ``fnmatch``) when it declares nothing."""
    if declared is not None:
        return declared
    return any(fnmatch.fnmatchcase(address, pattern) for pattern in patterns)


def consumer_of(member: str) -> tuple[str, str]:
    """(replica, consumer) of a line member ``<replica>|<connection>|<link>|<serial>``: the
    consumer as ``<connection>|<link>``, for people to read."""
    replica, _, rest = member.partition('|')
    consumer, _, _serial = rest.rpartition('|')
    return replica, consumer or rest
