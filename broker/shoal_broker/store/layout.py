"""
The global indexes kept outside the scripts, and the laying out of a Redis written by an older
version (docs/redis-modes.md, "Indexes outside the scripts").

On Redis Cluster a script may touch one hash slot only, so an address's record is its own
``{a:X}:meta`` and a subscription's its definition; ``keys.ADDRESSES`` and
``keys.SUBSCRIPTION_INDEX`` only list them. An index may list an entity that does not exist
(readers skip it), never the other way round: a creation writes its index entry first and again,
with the epoch its script answered, last; a deletion forgets the entry only while it still
holds the deleted epoch (``index_forget.lua``). The same layout runs on standalone and Sentinel,
so a deployment moves to Cluster with its keys already in place.

The broker's store and the operator's registry both go through these functions, each with its
own way of running a script (``Run``); replies may be bytes or text.
"""

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import redis.asyncio

from shoal_broker.store import bodies, keys

logger = logging.getLogger(__name__)

Run = Callable[[str, Sequence[str], Sequence[Any]], Awaitable[Any]]
"""Runs one of lua/'s scripts by name with its KEYS and ARGV."""

LOCK = f'{keys.PREFIX}:layout-lock'
"""STRING with a TTL: one replica is laying out keys written by an older version."""
LOCK_MS = 60_000
LOCK_WAIT_SECONDS = 30.0
"""How long a starting replica waits for another one's laying out before it starts anyway."""
LAYOUT_PAGE = 500
"""Addresses per ``HSCAN`` page and per pipeline of the look for what an older version wrote,
which every start makes over every address (``lay_out``)."""


def new_epoch() -> str:
    """A token new with each creation of an address or a named subscription."""
    return secrets.token_hex(8)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def address_entry(kind: str, epoch: str) -> str:
    """An address's value in ``keys.ADDRESSES``."""
    return f'{kind}:{epoch}'


def kind_of(entry: Any) -> str:
    """The kind of an ``keys.ADDRESSES`` value: ``<kind>:<epoch>``, or the bare kind an older
    version wrote."""
    return text(entry).partition(':')[0]


# -- addresses --------------------------------------------------------------------------------


async def create_address(
    client: 'redis.asyncio.Redis', run: Run, address: str, kind: str, group: str
) -> str:
    """Create the address (and a queue's group) unless it exists; its kind as it is now."""
    k = keys.AddressKeys.of(address)
    epoch = new_epoch()
    await client.hset(keys.ADDRESSES, address, address_entry(kind, epoch))
    reply = await run('create_address', (k.meta, *k.streams, k.groups), (kind, group, epoch))
    actual, actual_epoch = text(reply[0]), text(reply[1])
    await client.hset(keys.ADDRESSES, address, address_entry(actual, actual_epoch))
    return actual


async def address_kind(client: 'redis.asyncio.Redis', run: Run, address: str, group: str) -> str:
    """The address's kind from its own record; '' when it does not exist. An address an older
    replica created (no record, a bare kind in the index) is laid out here."""
    kind = await client.hget(keys.AddressKeys.of(address).meta, 'kind')
    if kind is not None:
        return text(kind)
    entry = await client.hget(keys.ADDRESSES, address)
    if entry is None or ':' in text(entry):
        return ''  # none, or an index entry left by a creation that never happened
    return await create_address(client, run, address, kind_of(entry), group)


def address_keys(address: str, groups: Iterable[Any]) -> list[str]:
    """Every key of an address but its meta record and its bodies' index, for
    ``delete_address.lua``."""
    k = keys.AddressKeys.of(address)
    doomed = [*k.streams, k.groups, k.scheduled, k.scheduled_messages, k.watchers]
    doomed += [k.levels, *k.two_bands]
    doomed.append(k.commit_markers)
    doomed.append(k.duplicates)
    doomed += [k.last_values, k.last_value_order]
    for raw in groups:
        group = text(raw)
        doomed += [k.returned(group), k.delivery_counts(group), k.shares(group),
                   k.delivered(group), k.line(group), k.group_owners(group),
                   k.group_parked(group), k.group_held(group)]  # fmt: skip
    return doomed


async def delete_address(client: 'redis.asyncio.Redis', run: Run, address: str) -> None:
    """Delete the address with all its keys, then forget it in the index (if still its entry)."""
    k = keys.AddressKeys.of(address)
    entry = await client.hget(keys.ADDRESSES, address)
    groups = await client.smembers(k.groups)
    await delete_bodies(client, k.body_index)
    doomed = (k.meta, k.body_index, *address_keys(address, groups))
    kind, epoch, *left = await run('delete_address', doomed, ())
    if left:  # published while the pages above were deleted (store/bodies.py)
        await client.unlink(*bodies.due_keys(k.body_index, left))
    if kind and epoch:
        forgotten = address_entry(text(kind), text(epoch))
    elif entry is not None and ':' not in text(entry):
        forgotten = text(entry)  # created by an older replica: its bare kind
    else:
        return
    await run('index_forget', (keys.ADDRESSES,), (address, forgotten))


async def delete_bodies(client: 'redis.asyncio.Redis', index: str) -> None:
    """Delete the bodies of big messages an index names (``store/bodies.py``), a page at a time,
    each page's bodies before its members. A message published after the last page is
    named by ``delete_address.lua``, which deletes the index."""
    for _ in range(MAX_BODY_PAGES):
        members = await client.zrange(index, 0, BODY_PAGE - 1)
        if not members:
            return
        await client.unlink(*bodies.due_keys(index, members))
        await client.zrem(index, *members)


BODY_PAGE = 1000
MAX_BODY_PAGES = 10_000
"""Bounds on ``delete_bodies``: 10 million bodies, more than any Redis holds."""


# -- named subscriptions ----------------------------------------------------------------------


async def subscription_created(client: 'redis.asyncio.Redis', subscription_id: str) -> str:
    """Before a script that may create the subscription: its index entry, with a new epoch
    (returned, for the script)."""
    epoch = new_epoch()
    await client.hset(keys.SUBSCRIPTION_INDEX, subscription_id, epoch)
    return epoch


async def subscription_settled(
    client: 'redis.asyncio.Redis', subscription_id: str, epoch: Any
) -> None:
    """After that script: the entry holds the epoch the definition has."""
    if epoch:
        await client.hset(keys.SUBSCRIPTION_INDEX, subscription_id, text(epoch))


async def subscription_deleted(run: Run, subscription_id: str, epoch: Any) -> None:
    """After a script deleted the subscription: forget its entry if it still names that epoch."""
    if epoch:
        await run('index_forget', (keys.SUBSCRIPTION_INDEX,), (subscription_id, text(epoch)))


async def subscription_ids(client: 'redis.asyncio.Redis') -> list[str]:
    """Every id the index lists (some may name nothing: readers check the definition)."""
    found = [text(field) async for field, _ in client.hscan_iter(keys.SUBSCRIPTION_INDEX)]
    return sorted(set(found))


# -- the older layout -------------------------------------------------------------------------


async def lay_out(
    client: 'redis.asyncio.Redis', run: Run, group: str, *, wait: bool = False
) -> bool:
    """Lay out what an older version wrote, under ``LOCK``; idempotent. False when another
    replica holds the lock (``wait``: after waiting for it to finish, up to LOCK_WAIT_SECONDS)."""
    token = new_epoch()
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while not await client.set(LOCK, token, nx=True, px=LOCK_MS):
        if not wait or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    try:
        await _lay_out_addresses(client, run, group)
        await _lay_out_subscriptions(client)
        await _lay_out_bands(client, run)
    finally:
        if text(await client.get(LOCK) or b'') == token:
            await client.delete(LOCK)
    return True


async def _lay_out_addresses(client: 'redis.asyncio.Redis', run: Run, group: str) -> None:
    older = [
        (text(address), text(entry))
        async for address, entry in client.hscan_iter(keys.ADDRESSES, count=LAYOUT_PAGE)
        if ':' not in text(entry)
    ]
    for address, kind in older:
        await create_address(client, run, address, kind, group)
    if older:
        logger.info('laid out %d addresses of the older layout', len(older))


async def _lay_out_bands(client: 'redis.asyncio.Redis', run: Run) -> None:
    """Each address still in the older two streams (priorities 0-4 and 5-9) moves into one
    stream per priority, with its groups' positions, pending and returned entries
    (``lua/relayout_bands.lua``): one script per address, which holds Redis for as long as it
    copies that address's backlog. Every start looks at every address, so the look goes
    ``LAYOUT_PAGE`` addresses to a pipeline: one ``EXISTS`` at a time made a store's start with
    10 000 addresses take ~2 s."""
    moved = 0
    page: list[str] = []
    async for raw, _ in client.hscan_iter(keys.ADDRESSES, count=LAYOUT_PAGE):
        page.append(text(raw))
        if len(page) == LAYOUT_PAGE:
            moved += await _lay_out_bands_of(client, run, page)
            page = []
    if page:
        moved += await _lay_out_bands_of(client, run, page)
    if moved:
        logger.info('laid out %d entries of the two-band layout, one stream per priority', moved)


async def _lay_out_bands_of(client: 'redis.asyncio.Redis', run: Run, page: list[str]) -> int:
    """``_lay_out_bands`` for the addresses of ``page``: the entries moved."""
    pipe = client.pipeline(transaction=False)
    for address in page:
        pipe.exists(*keys.AddressKeys.of(address).two_bands)
    moved = 0
    for address, older in zip(page, await pipe.execute(), strict=True):
        if not older:
            continue
        k = keys.AddressKeys.of(address)
        groups = sorted(text(g) for g in await client.smembers(k.groups))
        script_keys = [
            *k.two_bands,
            *k.streams,
            k.groups,
            k.levels,
            k.scheduled,
            k.scheduled_messages,
            k.last_values,
            k.last_value_order,
        ]
        for group in groups:
            script_keys += [k.returned(group), k.delivery_counts(group)]
        reply = int(await run('relayout_bands', script_keys, groups))
        if reply < 0:
            logger.error(
                'address %r: its two-band streams were not moved forward: its priority streams '
                'were written already (a replica of the older version wrote on meanwhile); its '
                'messages there stay undelivered until they are moved by hand',
                address,
            )
        moved += max(reply, 0)
    return moved


async def _lay_out_subscriptions(client: 'redis.asyncio.Redis') -> None:
    """Each id of the older SET gets an epoch and an index entry; the SET goes once no replica
    of an older version is left (every registered replica has its ``joined`` key)."""
    older = [text(member) async for member in client.sscan_iter(keys.SUBSCRIPTIONS)]
    for subscription_id in older:
        definition = keys.SubscriptionKeys.of(subscription_id).definition
        if not await client.exists(definition):
            continue
        await client.hsetnx(definition, 'epoch', new_epoch())
        epoch = await client.hget(definition, 'epoch')
        await client.hset(keys.SUBSCRIPTION_INDEX, subscription_id, text(epoch))
    if not older:
        return
    replicas = [text(r) async for r in client.sscan_iter(keys.REPLICAS)]
    joined = [await client.exists(keys.ReplicaKeys.of(r).joined) for r in replicas]
    if all(joined):
        await client.delete(keys.SUBSCRIPTIONS)
        logger.info('laid out %d subscriptions of the older layout', len(older))
