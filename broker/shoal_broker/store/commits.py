"""
Transactions over several hash slots of a Redis Cluster, all or nothing across a crash.

``MULTI``/``EXEC`` cannot span slots, so a commit whose addresses live on several slots is
decided by a **commit record** written on one slot before anything is applied, and applied to
each address once, by whoever finds it (docs/redis-modes.md, "Transactions across shards"):

1. ``commit_record.lua`` writes the record (every address's sends and acks) and lists it in the
   replica's bucket, ``{r:<replica>:<b>}``; with ``replicated`` durability a ``WAIT`` on the same
   connection confirms it. From then on the transaction is committed.
2. ``commit_apply.lua`` applies each address's part in one script on the address's slot and
   marks it applied there (``{a:X}:txns``), so doing it again changes nothing.
3. ``commit_forget.lua`` deletes the record (confirmed like the record). The markers stay for
   ``MARKER_GRACE_SECONDS`` more (``sweep_markers``, from the trimmer): an apply still on its way
   from a committer that was reaped meanwhile finds its marker and changes nothing.

A committer that dies after step 1 leaves the record in its buckets; its reaper calls
``complete`` before returning its pending entries, so the acks of a committed transaction land
before the messages they acknowledge could be delivered again. A live committer whose step 2 or 3
could not finish within ``settle_seconds`` (a shard failing over) still answers "committed" (the
decision is durable) and completes the record on its next ``complete`` of its own id.

A committer that cannot tell whether step 1 happened (the reply was lost) deletes the record,
written or not, and reports the transaction rolled back; if even that cannot be done within
``settle_seconds`` the outcome is in doubt (``CommitInDoubt``): whatever Redis holds is all of
it or nothing. The committer then keeps asking until it learns which (``_settle``): a record it
finds is completed (all), one it does not find is confirmed gone (nothing), and the exception's
``outcome`` says which, so that the transaction's acknowledged entries are returned only when
nothing of it is applied.

Redis refusals that mean nothing ran (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``: a slot
moving, a failover) are retried on a fresh slot map until ``settle_seconds``. This module works
on one plain connection per node (``commit_nodes.NodeClients``); on a standalone Redis
``SingleNode`` is that one server, where the store keeps its single ``MULTI`` instead.
"""

import asyncio
import dataclasses
import itertools
import logging
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.crc import key_slot

from shoal_broker.errors import CommitInDoubt, StoreUnavailable
from shoal_broker.metrics.registry import duplicates_dropped
from shoal_broker.routing.storage import DuplicateWindow, Entry, OutgoingMessage, stored_origin
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, scripts
from shoal_broker.store.calls import reason
from shoal_broker.store.commit_nodes import NOTHING_RAN, Batch, ClusterNodes, NodeClients
from shoal_broker.store.lane import CONNECTION_ERRORS

R = TypeVar('R')

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 5.0
"""How long a step retries refusals that mean nothing ran, and lost connections where a retry
is harmless, before it gives up."""

RETRY_PAUSE_SECONDS = 0.05

SETTLE_PAUSES = (0.5, 1.0, 2.0, 5.0)
"""Pauses between attempts to learn a commit's outcome in doubt (the last one repeated)."""

MARKER_GRACE_SECONDS = 600.0
"""How long an address remembers a commit applied to it after the commit's record is gone."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One address's share of a transaction: applied atomically, in one script."""

    address: str
    kind: AddressKind
    sends: tuple[OutgoingMessage, ...]
    acks: tuple[tuple[str, Entry], ...]
    """(group, entry) pairs."""
    window: DuplicateWindow | None = None
    """The address's duplicate detection, when on: its sends are checked as they are applied."""


def plan(
    sends: Sequence[tuple[str, AddressKind, OutgoingMessage]],
    acks: Sequence[tuple[str, str, Entry]],
    windows: Mapping[str, DuplicateWindow] = MappingProxyType({}),
) -> list[Part]:
    """The parts of a transaction, one per address, in the order the addresses first appear;
    ``windows``: the duplicate detection of addresses that have it."""
    kinds: dict[str, AddressKind] = {}
    sent: dict[str, list[OutgoingMessage]] = {}
    acked: dict[str, list[tuple[str, Entry]]] = {}
    for address, kind, message in sends:
        kinds.setdefault(address, kind)
        sent.setdefault(address, []).append(message)
        acked.setdefault(address, [])
    for address, group, entry in acks:
        kinds.setdefault(address, AddressKind.QUEUE)  # no send: the kind decides nothing
        sent.setdefault(address, [])
        acked.setdefault(address, []).append((group, entry))
    return [
        Part(
            address,
            kinds[address],
            tuple(sent[address]),
            tuple(acked[address]),
            windows.get(address),
        )
        for address in sent
    ]


def spans_slots(parts: Sequence[Part]) -> bool:
    """Whether the parts live on more than one hash slot (one slot: a plain MULTI does)."""
    return len({key_slot(keys.AddressKeys.of(p.address).tag.encode()) for p in parts}) > 1


def apply_arguments(part: Part) -> list[bytes]:
    """``commit_apply.lua``'s ARGV after the record key: kind, channel, replica placeholder
    (filled in by whoever applies), the counts, the groups, the sends and the acks."""
    groups = list(dict.fromkeys(group for group, _ in part.acks))
    number = {group: i + 1 for i, group in enumerate(groups)}
    window = part.window
    sends = str(len(part.sends))
    if window is not None:  # sends <n>:<window>:<ms> (an older record says <n>): sextuples
        sends += f':{window.count}:{window.seconds * 1000}'
    args: list[bytes] = [
        part.kind.value.encode(),
        keys.AddressKeys.of(part.address).notify.encode(),
        sends.encode(),
        str(len(groups)).encode(),
        *(g.encode() for g in groups),
    ]
    for m in part.sends:
        args += [str(m.band).encode(), m.header, m.rest, str(m.expiry_ms).encode(),
                 stored_origin(m).encode()]  # fmt: skip
        if window is not None:
            args.append(m.duplicate_id or b'')
    for group, entry in part.acks:
        args += [str(number[group]).encode(), str(entry.band).encode(), entry.id.encode()]
    return args


def pack(items: Sequence[bytes]) -> bytes:
    """Length-prefixed items, as one record field."""
    return b''.join(len(item).to_bytes(4, 'big') + item for item in items)


def unpack(blob: bytes) -> list[bytes]:
    items, pos = [], 0
    while pos < len(blob):
        size = int.from_bytes(blob[pos : pos + 4], 'big')
        items.append(blob[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return items


def bucket_of(commit_id: str) -> int:
    return zlib.crc32(commit_id.encode()) % keys.COMMIT_BUCKETS


class CommitLog:
    """The commit records of one replica, and the completion of a dead one's."""

    def __init__(
        self,
        nodes: NodeClients,
        replica_id: str,
        *,
        replicated: bool = False,
        replication_timeout_ms: int = 1000,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        self._nodes = nodes
        self._replica_id = replica_id
        self._replicated = replicated
        self._replication_timeout_ms = replication_timeout_ms
        self._settle_seconds = settle_seconds
        self._source = {
            name: scripts.source(name)
            for name in ('commit_record', 'commit_apply', 'commit_forget')
        }
        self._in_flight: set[str] = set()
        """Records this process is writing, applying or settling: its own ``complete`` leaves
        them alone."""
        self._settling: set[asyncio.Task[bool]] = set()

    async def close(self) -> None:
        """Stop learning the outcomes in doubt (a record left is completed by this replica's
        next start or its reaper) and close the per-node clients (a cluster's)."""
        for task in self._settling:
            task.cancel()
        await asyncio.gather(*self._settling, return_exceptions=True)
        if isinstance(self._nodes, ClusterNodes):
            await self._nodes.aclose()

    def node_for(self, key: str) -> 'redis.asyncio.Redis':
        """A plain client of the primary serving ``key``'s slot (a one-slot MULTI)."""
        return self._nodes.for_key(key)

    async def commit(
        self,
        sends: Sequence[tuple[str, AddressKind, OutgoingMessage]],
        acks: Sequence[tuple[str, str, Entry]],
        windows: Mapping[str, DuplicateWindow] = MappingProxyType({}),
    ) -> None:
        """Commit a transaction over any addresses: returns once every address has it; raises
        StoreUnavailable when it was rolled back (nothing of it applied anywhere), and
        CommitInDoubt when that could not be learnt. ``windows`` as ``plan``'s."""
        parts = plan(sends, acks, windows)
        if not parts:
            return
        commit_id = uuid.uuid4().hex
        record = await self.record(commit_id, parts)  # raises: rolled back, or in doubt
        try:
            outcomes = await asyncio.gather(
                *(self.apply(record, part) for part in parts), return_exceptions=True
            )
            failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failed is not None:
                raise failed
            await self.forget(record)
        except StoreUnavailable as exc:  # committed all the same: completed later
            logger.warning('a commit is not applied everywhere yet (%s); completed later', exc)
        finally:
            self._in_flight.discard(record)

    # -- the steps, public so that a test can stop between them where a crash would -------------

    async def record(self, commit_id: str, parts: Sequence[Part]) -> str:
        """Step 1: write the record; returns its key once it is durable (the decision). The key
        stays among those this process is applying (``commit`` ends that)."""
        bucket = bucket_of(commit_id)
        key = keys.commit_record(self._replica_id, bucket, commit_id)
        index = keys.commit_index(self._replica_id, bucket)
        fields: list[bytes | str] = [
            'replica', self._replica_id, 'created_ms', str(int(time.time() * 1000)),
            'n', str(len(parts)),
        ]  # fmt: skip
        for i, part in enumerate(parts):
            fields += [f'a:{i}', part.address, f'p:{i}', pack(apply_arguments(part))]
        # before it is written: this replica's own ``complete`` (a trimming pass) must not
        # apply a record whose writing is in doubt while the commit rolls it back
        self._in_flight.add(key)
        try:
            _, confirmed = await self._on_slot(
                key, lambda c: self._run(c, 'commit_record', (key, index), fields)
            )
        except (*CONNECTION_ERRORS, *NOTHING_RAN) as exc:
            await self._roll_back(key, index, parts, exc)
            raise StoreUnavailable(f'the commit was rolled back: {exc}') from exc
        except BaseException:
            self._in_flight.discard(key)
            raise
        if not confirmed:
            await self._roll_back(key, index, parts, None)
            raise StoreUnavailable('no Redis replica confirmed the commit in time; rolled back')
        return key

    async def apply(self, record: str, part: Part) -> bool:
        """Step 2 for one address: True when applied now, False when it already was."""
        return await self._apply_arguments(record, part.address, apply_arguments(part))

    async def forget(self, record: str) -> None:
        """Step 3: the record goes (confirmed); its markers stay for the grace period."""
        index = self._index_of(record)

        async def delete(client: 'redis.asyncio.Redis') -> tuple[Any, bool]:
            return await self._run(client, 'commit_forget', (record, index), ())

        _, confirmed = await self._retrying(record, delete)
        if not confirmed:
            raise StoreUnavailable('no Redis replica confirmed the end of a commit in time')

    async def complete(self, replica_id: str, touched: set[str] | None = None) -> int:
        """Complete every commit record ``replica_id`` left (its reaper's call, or its own,
        periodically and at start): apply each address's part not applied yet, then forget the
        record. Returns the number of records completed; adds their addresses to ``touched``
        (the script wakes other replicas' watchers; the caller wakes its own)."""
        done = 0
        for bucket in range(keys.COMMIT_BUCKETS):
            index = keys.commit_index(replica_id, bucket)
            members = await self._retrying(index, lambda c, i=index: c.smembers(i))  # type: ignore[misc]
            for raw in sorted(members):
                record = raw.decode() if isinstance(raw, bytes) else str(raw)
                if record in self._in_flight:
                    continue
                fields = await self._retrying(record, lambda c, r=record: c.hgetall(r))  # type: ignore[misc]
                for i in range(int(fields.get(b'n', 0))):
                    address = fields[f'a:{i}'.encode()].decode()
                    if touched is not None:
                        touched.add(address)
                    await self._apply_arguments(record, address, unpack(fields[f'p:{i}'.encode()]))
                await self.forget(record)
                done += 1
        return done

    async def sweep_markers(self, addresses: Sequence[str], now_ms: int | None = None) -> int:
        """Remove the addresses' commit markers older than the grace period whose record is
        gone (the trimmer's call, a page of addresses at a time); returns how many went.

        Each step (read the markers, ask whether their records exist, delete the stale ones) is
        a ``commit_nodes.Batch``: pipelines per node of ``SWEEP_PIPELINE_COMMANDS`` commands, at
        most ``CLUSTER_CALLS_IN_FLIGHT`` at once, so 10 000 addresses cost a few round trips per
        node, not 10 000 in a row."""
        if not addresses:
            return 0
        markers = [keys.AddressKeys.of(address).commit_markers for address in addresses]
        held = await self._batched([(m, ('HGETALL', m)) for m in markers])
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        old: list[tuple[str, bytes | str, str]] = []  # (markers, field, record) past the grace
        for key, fields in zip(markers, held, strict=True):
            for raw, applied_ms in fields.items():
                if now_ms - int(applied_ms) >= MARKER_GRACE_SECONDS * 1000:
                    old.append((key, raw, raw.decode() if isinstance(raw, bytes) else str(raw)))
        if not old:
            return 0
        exists = await self._batched([(r, ('EXISTS', r)) for _, _, r in old])
        # a record not completed yet: its markers are what keep it from applying twice
        stale: dict[str, list[bytes | str]] = {}
        for (key, raw, _), found in zip(old, exists, strict=True):
            if not found:
                stale.setdefault(key, []).append(raw)
        deleted = await self._batched([(k, ('HDEL', k, *f)) for k, f in stale.items()])
        return sum(int(n) for n in deleted)

    # -- Redis, retried where nothing ran --------------------------------------------------------

    async def _batched(self, commands: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """The replies of ``(key, command)`` pairs, each command on its key's slot and harmless
        to run twice (``commit_nodes.Batch``). What Redis refused before running it, and what a lost
        connection left unanswered, goes again on a fresh slot map until ``settle_seconds``;
        any other error reply fails the call."""
        batch = Batch(self._nodes, commands)
        todo = list(range(len(commands)))
        deadline = time.monotonic() + self._settle_seconds
        while True:
            todo = await batch.send(todo)
            if batch.failures:
                raise StoreUnavailable(f'Redis refused a command of the sweep: {batch.failures[0]}')
            if not todo:
                return batch.replies
            if time.monotonic() >= deadline:
                raise StoreUnavailable(f'Redis unreachable: {reason(batch.refusals[-1])}')
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            await self._refresh()

    async def _apply_arguments(self, record: str, address: str, args: Sequence[bytes]) -> bool:
        k = keys.AddressKeys.of(address)
        groups = [g.decode() for g in args[4 : 4 + int(args[3])]]
        script_keys = (
            k.commit_markers, *k.streams, k.groups, k.watchers,
            *(k.delivery_counts(g) for g in groups), k.duplicates, k.levels,
        )  # fmt: skip
        argv = (record, args[0], args[1], self._replica_id, *args[2:])

        async def run(client: 'redis.asyncio.Redis') -> tuple[Any, bool]:
            return await self._run(client, 'commit_apply', script_keys, argv)

        outcome, confirmed = await self._retrying(k.commit_markers, run)
        if not confirmed:  # committed, but not safe to forget yet: completed again later
            raise CommitInDoubt(f'no Redis replica confirmed a commit on {address!r} in time')
        if outcome[0] == b'applied' and len(outcome) > 3:
            duplicates_dropped(address, int(outcome[3]))
        return bool(outcome[0] == b'applied')

    async def _run(
        self, client: 'redis.asyncio.Redis', name: str, keys_: Sequence[str], args: Sequence[Any]
    ) -> tuple[Any, bool]:
        """One script, with a WAIT on the same connection when replicas must confirm it (a
        primary's replication is one ordered stream, so it confirms the earlier writes too):
        its reply, and whether it was confirmed."""
        pipe = client.pipeline(transaction=False)
        pipe.eval(self._source[name], len(keys_), *keys_, *args)
        if self._replicated:
            pipe.execute_command('WAIT', 1, self._replication_timeout_ms)
        replies = await pipe.execute()
        confirmed = not self._replicated or (isinstance(replies[1], int) and replies[1] >= 1)
        return replies[0], confirmed

    async def _on_slot(self, key: str, call: Callable[['redis.asyncio.Redis'], Awaitable[R]]) -> R:
        """``call`` with the client of ``key``'s primary, again on a fresh slot map while Redis
        refuses it before running it."""
        deadline = time.monotonic() + self._settle_seconds
        while True:
            try:
                return await call(self._nodes.for_key(key))
            except NOTHING_RAN:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            await self._refresh()

    async def _retrying(self, key: str, call: Callable[['redis.asyncio.Redis'], Awaitable[R]]) -> R:
        """``_on_slot``, also through lost connections: for steps that may run twice."""
        deadline = time.monotonic() + self._settle_seconds
        while True:
            try:
                return await self._on_slot(key, call)
            except (*CONNECTION_ERRORS, *NOTHING_RAN) as exc:
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(f'Redis unreachable: {reason(exc)}') from exc
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            await self._refresh()

    async def refresh_nodes(self) -> None:
        """Ask for the slot map again (a one-slot commit found its node no longer serving)."""
        await self._refresh()

    async def _refresh(self) -> None:
        try:
            await self._nodes.refresh()
        except (*CONNECTION_ERRORS, redis.exceptions.RedisClusterException):
            pass  # the next attempt finds out

    async def _roll_back(
        self, record: str, index: str, parts: Sequence[Part], cause: BaseException | None
    ) -> None:
        """Delete a record whose writing is in doubt (nothing was applied from it); when that
        cannot be confirmed either, raise ``CommitInDoubt`` with the outcome learnt later."""
        try:
            if await self._deleted(record, index):
                self._in_flight.discard(record)
                return
            detail = cause or 'no replica confirmed it'
        except StoreUnavailable as exc:
            detail = cause or exc
        except BaseException:
            self._in_flight.discard(record)
            raise
        task = asyncio.get_running_loop().create_task(
            self._settle(record, index, parts), name=f'commit-in-doubt-{record}'
        )
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        raise CommitInDoubt(f'a commit is in doubt: {detail}', outcome=task)

    async def _deleted(self, record: str, index: str) -> bool:
        """Delete the record (there or not) and its index entry, leaving a tombstone that a
        write of it still on its way cannot replace: whether that is confirmed."""
        tombstone_ms = str(int(MARKER_GRACE_SECONDS * 1000))

        async def delete(client: 'redis.asyncio.Redis') -> tuple[Any, bool]:
            return await self._run(client, 'commit_forget', (record, index), (tombstone_ms,))

        _, confirmed = await self._retrying(record, delete)
        return confirmed

    async def _settle(self, record: str, index: str, parts: Sequence[Part]) -> bool:
        """Learn the outcome of a commit in doubt, asking until Redis answers: a record found is
        completed (True: applied), a record not found is confirmed gone (False: none of it is
        applied, nor ever will be: its tombstone turns away a write of it still on its way)."""
        try:
            for attempt in itertools.count():
                try:
                    fields = await self._retrying(record, lambda c: c.hgetall(record))
                    if b'n' in fields:  # not a tombstone of an earlier attempt
                        for part in parts:
                            await self.apply(record, part)
                        await self.forget(record)
                        logger.warning('a commit in doubt is applied after all (%s)', record)
                        return True
                    if await self._deleted(record, index):
                        logger.warning('a commit in doubt is found not applied (%s)', record)
                        return False
                except StoreUnavailable as exc:  # CommitInDoubt too: an apply not confirmed
                    logger.warning('the outcome of a commit is still unknown: %s', exc)
                await asyncio.sleep(SETTLE_PAUSES[min(attempt, len(SETTLE_PAUSES) - 1)])
            raise AssertionError('unreachable')
        finally:
            self._in_flight.discard(record)

    @staticmethod
    def _index_of(record: str) -> str:
        tag, _, _ = record.partition('}:commit:')
        return f'{tag}}}:commits'
