"""
Upkeep: the background work every replica shares, and the limits it keeps.

Trimming the streams below what their subscriptions still need (Redis cannot trim by
acknowledgement), moving due scheduled messages into their streams, appending metric records,
reading Redis's memory, and the backlog limits of addresses (docs/security.md).
"""

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import StoreCommandDenied, StoreUnavailable
from shoal_broker.metrics.registry import PRIVATE_LABEL
from shoal_broker.routing.storage import NORMAL_BAND
from shoal_broker.settings import AddressKind
from shoal_broker.store import bodies, keys
from shoal_broker.store.backlogs import BacklogLimits
from shoal_broker.store.calls import Scripts, as_text, call, on_every_primary, reason
from shoal_broker.store.commit_nodes import NOTHING_RAN, NodeClients, SingleNode
from shoal_broker.store.lane import CONNECTION_ERRORS
from shoal_broker.store.slices import in_slices

TRIM_STEP_ENTRIES = 1000
"""Entries one trim.lua call may remove (whole stream nodes): ~0.25 ms of Redis for 1 KiB
messages, where one exact trim of a 100 000-entry backlog held it for 25 ms."""

MAX_TRIM_STEPS = 1000
"""Steps per stream and trim pass; what is left waits for the next pass."""

APPEND_ATTEMPTS = 3
"""Times a metric record's calls are sent while a slot on the move refuses them."""


class Upkeep:
    """Implements ``routing.storage.UpkeepPort``."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        scripts: Scripts,
        backlogs: BacklogLimits,
        *,
        address_kind: Callable[[str], Awaitable[AddressKind | None]],
        announce: Callable[[str], Awaitable[None]],
        nodes: NodeClients | None = None,
    ) -> None:
        """``nodes``: the primaries' plain clients on a cluster (the one server otherwise)."""
        self._client = client
        self._nodes = nodes or SingleNode(client)
        self._scripts = scripts
        self._backlogs = backlogs
        self._address_kind = address_kind
        self._announce = announce

    async def trim(self, skip: Set[str] = frozenset()) -> int:
        """Trim every address's streams below what its subscriptions still need, in steps of at
        most TRIM_STEP_ENTRIES entries per script call (trim.lua), so that no call holds Redis
        for long; a stream is trimmed again while its last step stopped at that limit. ``skip``:
        streams known to hold nothing to trim (an idle cluster's are most of them), unless their
        address holds big messages' bodies (``store/bodies.py``): an entry deleted inside a
        stream (a move) leaves its body for the trim, even when that empties the stream. An
        address whose tag (``keys.address_tag``) is in ``skip`` was found empty, bodies
        included: it is passed over before its keys are made (past ``ADDRESS_KEYS_CACHED``
        addresses, making every address's keys each pass evicted the ones the messages use).
        Of the other bands than the default one, only those in the address's levels SET can hold
        entries (a band joins it when written and leaves it only once trimmed empty): where
        ``skip`` does not already pass them over (no walk yet, on a replica that just started or
        took the pass over), the SET is read with the body index, and the bands outside it are
        not trimmed (docs/performance.md#trimming)."""
        removed = 0
        cursor: int = 0
        while True:
            cursor, batch = await call(self._client.hscan(keys.ADDRESSES, cursor, count=200))
            found = [
                keys.AddressKeys.of(address)
                for address in map(as_text, batch)
                if keys.address_tag(address) not in skip
            ]
            unskipped = [[b for b, s in enumerate(k.streams) if s not in skip] for k in found]
            indexed, levels = await self._held(found, unskipped)
            for i, written in levels.items():
                unskipped[i] = [b for b in unskipped[i] if b == NORMAL_BAND or b in written]
            streams: list[tuple[str, ...]] = [
                (k.streams[b], k.levels, k.body_index)  # the index: store/bodies.py
                for k, bodies_held, bands in zip(found, indexed, unskipped, strict=True)
                for b in (range(len(k.streams)) if bodies_held else bands)
            ]
            for _ in range(MAX_TRIM_STEPS):  # a stream consumed as fast as it grows: next pass
                if not streams:
                    break
                replies = await self._trim_step(streams)
                await self._bodies_deleted(streams, replies)
                removed += sum(int(r[0]) for r in replies)
                streams = [s for s, r in zip(streams, replies, strict=True) if int(r[1])]
            if not cursor:
                return removed

    async def _held(
        self, found: list[keys.AddressKeys], unskipped: list[list[int]]
    ) -> tuple[list[bool], dict[int, frozenset[int]]]:
        """Whether each address holds big messages' bodies (``EXISTS`` of its index), and, by
        position, the bands of the levels SET (``SMEMBERS``) of each address whose ``unskipped``
        bands (those the trim would not skip) include another one than the default band and
        whose SET was read, in slices per primary. One whose primary does not answer counts as
        holding bodies: its trims then fail the pass, once the other primaries' streams are
        trimmed (``_trim_step``)."""
        asked = [i for i, bands in enumerate(unskipped) if len(bands) > (NORMAL_BAND in bands)]
        calls = [(k.body_index, ('EXISTS', k.body_index)) for k in found]
        calls += [(found[i].levels, ('SMEMBERS', found[i].levels)) for i in asked]
        replies = await in_slices(self._nodes, calls)
        indexed = [isinstance(r, Exception) or bool(r) for r in replies[: len(found)]]
        levels = {
            i: frozenset(int(as_text(band)) for band in listed)
            for i, listed in zip(asked, replies[len(found) :], strict=True)
            if not isinstance(listed, Exception)
        }
        return indexed, levels

    async def _bodies_deleted(self, streams: list[tuple[str, ...]], replies: list[Any]) -> None:
        """Delete the bodies of the big messages trim.lua calls named, then their index members
        (``store/bodies.py``), in slices per primary (``slices.in_slices``):
        the trim names members again until they are gone, so a call refused leaves both for the
        next step or pass, and a primary lost fails the pass (``StoreUnavailable``) once the
        others' are deleted. Each pair goes to one node's pipelines in order, so a member never
        leaves before its body."""
        calls: list[tuple[str, tuple[Any, ...]]] = []
        for stream, reply in zip(streams, replies, strict=True):
            if len(reply) > 2:
                index, members = stream[2], reply[2:]
                calls.append((index, ('UNLINK', *bodies.due_keys(index, members))))
                calls.append((index, ('ZREM', index, *members)))
        answered = await in_slices(self._nodes, calls) if calls else []
        lost = next((r for r in answered if isinstance(r, CONNECTION_ERRORS)), None)
        if lost is not None:
            raise StoreUnavailable(f'Redis unreachable: {reason(lost)}') from lost

    async def _trim_step(self, streams: list[tuple[str, ...]]) -> list[Any]:
        """One trim.lua call per stream, in slices (``slices.in_slices``: pipelines of at most
        ``CALLS_PER_PIPELINE`` calls, one at a time per primary). A call Redis refused before
        running it (a slot on the move, a forgotten script) removed nothing: its stream waits
        for the next pass, on a fresh slot map and with the scripts loaded again. A primary
        lost fails the pass (``StoreUnavailable``) once the others are done, the map asked
        again for the next one. Each reply is trim.lua's (a count, whether the step limit
        stopped it, then the index members of big messages' bodies to delete:
        ``_bodies_deleted``); ``[0, 0]`` for a call that did not run."""
        calls = [
            (stream[0], self._scripts.command('trim', stream, (TRIM_STEP_ENTRIES,)))
            for stream in streams
        ]
        replies = await in_slices(self._nodes, calls)
        lost = next((r for r in replies if isinstance(r, CONNECTION_ERRORS)), None)
        moved = lost is not None or any(isinstance(r, NOTHING_RAN) for r in replies)
        if moved:
            with contextlib.suppress(*CONNECTION_ERRORS, redis.exceptions.RedisClusterException):
                await self._nodes.refresh()
        if lost is not None:
            raise StoreUnavailable(f'Redis unreachable: {reason(lost)}') from lost
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            await call(self._scripts.load())
        answered: list[Any] = []
        for reply in replies:
            if isinstance(reply, (*NOTHING_RAN, redis.exceptions.NoScriptError)):
                answered.append([0, 0])
            elif isinstance(reply, Exception):
                raise reply
            else:
                answered.append(reply)
        return answered

    async def scripts_in_slices(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Script ``name`` once per (keys, arguments) of ``calls``, in slices per primary
        (``slices.in_slices``): each reply in its place, an error (a refusal, a forgotten
        script, a lost connection) as its exception object, for the caller to make that call
        again alone."""
        commands = [(k[0], self._scripts.command(name, k, args)) for k, args in calls]
        return await in_slices(self._nodes, commands) if commands else []

    async def release_due(self, now_ms: int, limit: int = 500) -> int:
        """Move every due scheduled message into its address's streams; returns how many."""
        moved_total = 0
        for raw in await call(self._client.smembers(keys.SCHEDULED)):
            address = as_text(raw)
            kind = await self._address_kind(address) or AddressKind.QUEUE
            k = keys.AddressKeys.of(address)
            script_keys = (k.scheduled, k.scheduled_messages, *k.streams, k.groups, k.levels)
            args = (now_ms, limit, kind.value)
            moved = int(await self._scripts.evalsha('release_due', script_keys, args))
            if moved:
                moved_total += moved
                await self._announce(address)
        return moved_total

    async def append_records(self, records: Sequence[Mapping[str, str]], max_length: int) -> None:
        """Append metric records to the metrics stream, trimmed to about ``max_length``, and add
        each queue's and named subscription's deliveries to its per-replica total
        (``AddressKeys.delivered``), in one pipeline per node (``slices.in_slices``): the caller
        hands them in slices (``reporting.RECORDS_PER_SLICE``, ``running/reporting.py``). Calls
        a slot on the move refused go again on a fresh slot map, at most ``APPEND_ATTEMPTS``
        times in all; a lost connection, or refusals past that, fail with StoreUnavailable."""
        calls: list[tuple[str, tuple[Any, ...]]] = []
        for fields in records:
            entry = [part for field in fields.items() for part in field]
            calls.append(
                (keys.METRICS, ('XADD', keys.METRICS, 'MAXLEN', '~', max_length, '*', *entry))
            )
            delivered = int(fields.get('delivered') or 0)
            group = fields.get('subscription', '')
            if delivered and group and group != PRIVATE_LABEL:
                totals = keys.AddressKeys.of(fields['address']).delivered(group)
                calls.append((totals, ('HINCRBY', totals, fields['replica'], delivered)))
        for _ in range(APPEND_ATTEMPTS):
            replies = await in_slices(self._nodes, calls)
            lost = next((r for r in replies if isinstance(r, CONNECTION_ERRORS)), None)
            if lost is not None:
                raise StoreUnavailable(f'Redis unreachable: {reason(lost)}') from lost
            for reply in replies:
                if isinstance(reply, Exception) and not isinstance(reply, NOTHING_RAN):
                    raise reply
            calls = [c for c, r in zip(calls, replies, strict=True) if isinstance(r, NOTHING_RAN)]
            if not calls:
                return
            with contextlib.suppress(*CONNECTION_ERRORS, redis.exceptions.RedisClusterException):
                await self._nodes.refresh()
        raise StoreUnavailable(f'Redis Cluster refused {len(calls)} metric record calls')

    async def share_backlogs(self, snapshot: str, ttl_ms: int) -> None:
        """Leave the backlog snapshot one replica read for all (``keys.BACKLOGS``); it expires
        after ``ttl_ms``, so a gone reader's figures are never taken for current ones."""
        await call(self._client.set(keys.BACKLOGS, snapshot, px=max(1, ttl_ms)))

    async def shared_backlogs(self) -> str | None:
        """The backlog snapshot another replica shared; None when there is none (or it expired)."""
        found = await call(self._client.get(keys.BACKLOGS))
        return None if found is None else as_text(found)

    async def memory(self) -> tuple[int, int]:
        """Redis's ``used_memory`` and ``maxmemory`` (0: no limit), in bytes; on a cluster,
        those of the fullest primary (the first to refuse writes)."""
        try:
            infos = await on_every_primary(self._client, lambda c, **to: c.info('memory', **to))
        except redis.exceptions.NoPermissionError as exc:
            raise StoreCommandDenied('INFO', str(exc)) from exc
        found = [(int(i.get('used_memory', 0)), int(i.get('maxmemory', 0))) for i in infos]
        return max(found, key=lambda m: m[0] / m[1] if m[1] else 0.0)

    def limit_backlog(self, limit: int, overflow: str) -> None:
        """Cap what every address holds: at ``limit`` entries a publish is refused
        (``reject-publish``) or the oldest entries are dropped (``drop-oldest``). 0 = no cap."""
        self._backlogs.set_everywhere(limit, overflow)

    def backlog_limit(self, address: str) -> int:
        """The address's backlog limit in entries, as publishes apply it; 0 when it has none."""
        return self._backlogs.limit(address)

    def limit_address_backlogs(self, limits: Mapping[str, tuple[int, str]]) -> None:
        """Replace the per-address caps (address -> (limit, overflow)) that override
        ``limit_backlog`` for those addresses: declared queues' ``retention.maxMessages``."""
        self._backlogs.set_per_address(limits)
