"""
The return of entries a replica has claimed in Redis but does not hold (``Messages.
return_stranded``, called by a subscription's recovery after a failed fetch).

Two things leave them: a fetch whose reply was lost (claimed, never delivered) and an
acknowledgement lost with the connection (delivered, the consumer done with it, the entry still
pending). The replica cannot tell them apart, and the second is a message the application may
already have processed: so each returned entry counts one failed delivery attempt, and its next
delivery carries delivery-count >= 1 (JMSRedelivered true). JMS allows that flag on a message
that may not have been delivered before (the first case); it forbids nothing else here, while a
count of 0 on the second case would tell the application the message is new.
"""

from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store import keys
from shoal_broker.store.calls import as_text, call


async def return_stranded(
    client: 'redis.asyncio.Redis',
    replica_id: str,
    address: str,
    group: str,
    held: set[tuple[int, str]],
    announce: Callable[[str], Awaitable[None]],
) -> int:
    """Return this replica's pending entries of a subscription that are not in ``held``, each
    with one more failed attempt; returns how many."""
    k = keys.AddressKeys.of(address)
    returned = 0
    # entries parked for this replica's message groups are claimed for it, and not stranded:
    # its next fetch takes them (fetch.lua)
    prefix = f'{replica_id}|'
    low, high = f'[{prefix}', f'[{prefix}\xff'.encode('latin-1')
    found = await call(client.zrangebylex(k.group_parked(group), low, high))
    parked = {as_text(member)[len(prefix) :] for member in found}
    for band, stream in enumerate(k.streams):
        try:
            pending = await call(client.xpending_range(stream, group, '-', '+', 10_000, replica_id))
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith('NOGROUP'):
                raise StoreUnavailable(f'Redis refused: {exc}') from exc
            continue  # the subscription was deleted, or never read this band: nothing pending
        ids = [
            i for p in pending
            if (band, i := as_text(p['message_id'])) not in held
            and keys.entry_member(band, i) not in parked
        ]  # fmt: skip
        if not ids:
            continue
        # counted first: a replica fetching between the two steps must see the new count; a
        # failure between them counts again at the next recovery (a higher count, never 0)
        pipe: Any = client.pipeline(transaction=False)
        for entry_id in ids:
            pipe.hincrby(k.delivery_counts(group), keys.entry_field(band, entry_id), 1)
        await call(pipe.execute())
        members = dict.fromkeys((keys.entry_member(band, i) for i in ids), 0)
        await call(client.zadd(k.returned(group), members, nx=True))  # a delay stays
        returned += len(ids)
    if returned:
        await announce(address)
    return returned
