"""
A transaction's sends and acks, applied all or nothing (``Messages.commit``).

On one slot (standalone and Sentinel: always) the commit is one ``MULTI``/``EXEC``; in
``replicated`` durability a ``WAIT`` that no replica confirms leaves it applied on the primary
but not known to survive a failover: in doubt (``CommitInDoubt``), not rolled back. On Redis
Cluster, addresses on several slots go through the commit record of ``commits.py``
(``CommitLog``), which any live replica completes if the committer dies after deciding
(docs/redis-modes.md, "Transactions across shards").

A connection that fails after the ``EXEC`` went out but before its reply came back leaves the
commit applied or not, and "rolled back" would be false if it was (the client would do its work
again: its sends twice). So the ``MULTI`` also writes a **marker**, ``{a:X}:txn:<id>`` on the
first address's slot with a lifetime of ``MARKER_SECONDS``, and a commit whose reply is lost
reads it back (``PEXPIRE``, a write only when it is there, so that in ``replicated`` durability
a ``WAIT`` on the same connection confirms the ``EXEC`` before it): found, the commit is
applied and answered as such; not found, nothing of it ran and it is rolled back. While Redis
does not answer it asks again after the ``commits.SETTLE_PAUSES`` for up to ``settle_seconds``,
then raises ``CommitInDoubt`` and keeps asking in the background until the marker's lifetime
is nearly over; the exception's ``outcome`` says what it learnt. A commit applied but not yet
confirmed by a replica asks again for up to ``confirm_seconds`` (the broker's store hold: a
promoted primary gains a replica within seconds) before it is in doubt; a marker found gone
meanwhile means the commit went with the old primary: rolled back. The normal path pays one
``SET`` inside the ``MULTI``, no round trip; in ``replicated`` durability its ``WAIT`` follows
the marker's ``PEXPIRE`` on one connection, as after a lost reply (a ``WAIT`` alone, on whichever
pooled connection, would confirm that connection's own writes, not the ``EXEC``).
"""

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import CommitInDoubt, StoreUnavailable
from shoal_broker.metrics.registry import duplicates_dropped
from shoal_broker.routing.storage import Entry, OutgoingMessage, stored_origin
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.store import keys
from shoal_broker.store.calls import REDIS_DOWN, Scripts, reason
from shoal_broker.store.commit_nodes import NOTHING_RAN
from shoal_broker.store.commits import SETTLE_PAUSES, SETTLE_SECONDS, CommitLog, plan, spans_slots
from shoal_broker.store.duplicates import DuplicateWindows

logger = logging.getLogger(__name__)

MARKER_SECONDS = 120.0
"""How long a one-slot commit's marker stays in Redis: the time the broker has to learn whether
an ``EXEC`` whose reply was lost ran. One small key per commit for that long."""

APPLIED = b'1'
"""A marker's value written by its commit's ``EXEC``."""

FENCED = b'0'
"""A marker's value written by a read that found it missing: that commit never runs."""

MARKER_MARGIN_SECONDS = 10.0
"""Asking stops this long before the marker goes: a marker not found later may have expired."""

Sends = Sequence[tuple[str, AddressKind, OutgoingMessage]]
Acks = Sequence[tuple[str, str, Entry]]


class Transactions:
    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        scripts: Scripts,
        replica_id: str,
        announce: Callable[[str], Awaitable[None]],
        durability: Durability,
        replication_timeout_ms: int,
        commits: CommitLog | None = None,
        settle_seconds: float = SETTLE_SECONDS,
        duplicates: DuplicateWindows | None = None,
    ) -> None:
        """``commits``: on Redis Cluster, the replica's commit records. ``duplicates``: the
        addresses' duplicate detection, applied to a send as the commit applies it."""
        self._duplicates = duplicates or DuplicateWindows()
        self._client = client
        self._scripts = scripts
        self.replica_id = replica_id
        self._announce = announce
        self._durability = durability
        self._replication_timeout_ms = replication_timeout_ms
        self.commits = commits
        self._settle_seconds = settle_seconds
        self._learning: set[asyncio.Task[bool]] = set()
        """Commits whose reply was lost and whose marker Redis has not shown yet."""
        self.confirm_seconds = 0.0
        """``replicated``: how long an applied commit waits for a replica to confirm it
        (``SHOAL_STORE_HOLD_SECONDS``; 0: one ``WAIT``) before it is in doubt."""

    async def close(self) -> None:
        """Stop learning the outcomes in doubt: their acks stay pending in Redis, returned by this
        replica's reaper (or kept, for those the commit acknowledged)."""
        for task in self._learning:
            task.cancel()
        await asyncio.gather(*self._learning, return_exceptions=True)

    async def commit(self, sends: Sends, acks: Acks) -> None:
        if not sends and not acks:
            return
        client = self._client
        if self.commits is not None:
            parts = plan(sends, acks)
            if spans_slots(parts):
                windows = {
                    address: window
                    for address, _, message in sends
                    if message.duplicate_id is not None
                    and (window := self._duplicates.of(address)) is not None
                }
                await self.commits.commit(sends, acks, windows)  # wakes the watchers itself
                for address in {address for address, _, _ in sends}:
                    await self._announce(address)
                return
            client = self.commits.node_for(keys.AddressKeys.of(parts[0].address).tag)
        await self._multi(client, sends, acks)

    async def _multi(self, client: 'redis.asyncio.Redis', sends: Sends, acks: Acks) -> None:
        """The publish script is sent as text (EVAL), not by hash: inside MULTI a NOSCRIPT error
        would fail that one command while the others apply, half-applying the commit."""
        first = sends[0][0] if sends else acks[0][0]
        marker = keys.AddressKeys.of(first).transaction_marker(uuid.uuid4().hex)
        started = time.monotonic()
        pipe = await self._watching(client, marker)
        pipe.set(marker, APPLIED, px=int(MARKER_SECONDS * 1000))  # read back if the reply is lost
        for address, kind, message in sends:
            k = keys.AddressKeys.of(address)
            unique = message.duplicate_id
            window = None if unique is None else self._duplicates.of(address)
            if unique is not None and window is not None:  # checked as the EXEC applies it
                pipe.eval(
                    self._scripts.source['publish_unique'], 5 + len(k.streams),
                    k.streams[message.band], k.groups, k.watchers, k.duplicates, *k.streams,
                    k.levels, kind.value, '', self.replica_id,
                    window.count, window.seconds * 1000, 0, '', message.header, message.rest,
                    str(message.expiry_ms), stored_origin(message), unique,
                )  # fmt: skip
                continue
            pipe.eval(
                self._scripts.source['publish'], 4, k.streams[message.band], k.groups, k.watchers,
                k.levels, kind.value, '', self.replica_id,  # announced below, once committed
                message.header, message.rest, str(message.expiry_ms), stored_origin(message),
            )  # fmt: skip
        for address, group, entry in acks:
            k = keys.AddressKeys.of(address)
            pipe.xack(k.streams[entry.band], group, entry.id)
            if entry.delivery_count:
                pipe.hdel(k.delivery_counts(group), keys.entry_field(entry.band, entry.id))
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (*REDIS_DOWN, redis.exceptions.WatchError) as exc:  # lost while watching
            await self._after_lost_reply(client, marker, started, sends, exc)
            return
        except (*NOTHING_RAN, redis.exceptions.ExecAbortError) as exc:  # a failover: discarded
            await self._refresh_nodes()
            raise StoreUnavailable(f'the commit was rolled back: Redis refused it ({exc})') from exc
        errors = [r for r in replies if isinstance(r, Exception)]
        if errors:
            raise StoreUnavailable(f'Redis refused part of a commit: {errors[0]}')
        for (address, _, _), reply in zip(sends, replies[1:], strict=False):
            if isinstance(reply, list):  # publish_unique.lua's: {added, duplicates dropped}
                duplicates_dropped(address, int(reply[1]))
        if self._durability is Durability.REPLICATED:
            await self._replicated(client, marker, sends)
        await self._announce_all(sends)

    async def _watching(self, client: 'redis.asyncio.Redis', marker: str) -> Any:
        """A transaction pipeline that has ``WATCH``ed the commit's marker, answered before the
        ``EXEC`` goes: a later read that finds the marker missing fences it (``_marker_found``).
        One round trip more per commit (docs/redis-modes.md, "A lost EXEC reply")."""
        pipe = client.pipeline(transaction=True)
        try:
            await pipe.watch(marker)
        except REDIS_DOWN as exc:
            await pipe.reset()  # type: ignore[no-untyped-call]
            raise StoreUnavailable(
                f'the commit was not applied: Redis unreachable ({reason(exc)})'
            ) from exc
        except NOTHING_RAN as exc:
            await pipe.reset()  # type: ignore[no-untyped-call]
            await self._refresh_nodes()
            raise StoreUnavailable(f'the commit was not applied: Redis refused it ({exc})') from exc
        pipe.multi()  # type: ignore[no-untyped-call]
        return pipe

    async def _replicated(self, client: 'redis.asyncio.Redis', marker: str, sends: Sends) -> None:
        """In ``replicated`` mode, a commit EXEC applied counts once a replica has its marker."""
        # the WAIT follows a write on its own connection (the marker's PEXPIRE): on another
        # pooled connection than the EXEC's it would confirm only that one's older writes
        unconfirmed: BaseException | str = 'WAIT'
        try:
            found, confirmed = await self._marker_found(client, marker)
        except REDIS_DOWN as exc:
            found, confirmed, unconfirmed = True, False, exc  # applied: the EXEC answered
        if found and not confirmed and self.confirm_seconds > 0:
            found, confirmed, unconfirmed = await self._confirm(client, marker, unconfirmed)
        if not found:  # gone with a primary that failed over before a replica had it
            raise StoreUnavailable('the commit was lost in a failover before a replica had it')
        if not confirmed:
            # applied on the primary, and lost only if a failover comes first: "rolled
            # back" would be false (the client would do again what its sends already did)
            await self._announce_all(sends)
            raise CommitInDoubt(
                f'no Redis replica confirmed the commit in time: {unconfirmed}',
                outcome=_known(True),
            )

    async def _confirm(
        self, client: 'redis.asyncio.Redis', marker: str, why: BaseException | str
    ) -> tuple[bool, bool, BaseException | str]:
        """Ask again, for up to ``confirm_seconds``, whether a replica has an applied commit:
        (found, confirmed, why not). Found gone, it was lost in a failover."""
        deadline = time.monotonic() + self.confirm_seconds
        pause = 0.05
        found, confirmed = True, False
        while time.monotonic() + pause < deadline:
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)
            try:
                found, confirmed = await self._marker_found(client, marker)
            except REDIS_DOWN as exc:
                why = exc
                continue
            if confirmed or not found:
                break
        return found, confirmed, why

    async def _after_lost_reply(
        self,
        client: 'redis.asyncio.Redis',
        marker: str,
        started: float,
        sends: Sends,
        cause: BaseException,
    ) -> None:
        """The connection failed between ``MULTI`` and the ``EXEC``'s reply: returns when the
        marker shows the commit applied (and confirmed); raises ``StoreUnavailable`` when it
        shows nothing ran, ``CommitInDoubt`` when Redis does not say in time."""
        deadline = time.monotonic() + self._settle_seconds
        found: tuple[bool, bool] | None = None
        for pause in itertools.chain(SETTLE_PAUSES, itertools.repeat(SETTLE_PAUSES[-1])):
            try:
                found = await self._marker_found(client, marker)
                break
            except REDIS_DOWN as exc:
                logger.warning('the outcome of a commit whose reply was lost is unknown: %s', exc)
            if time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
        if found is None:
            task = asyncio.get_running_loop().create_task(
                self._learn(client, marker, started, sends), name=f'commit-in-doubt-{marker}'
            )
            self._learning.add(task)
            task.add_done_callback(self._learning.discard)
            raise CommitInDoubt(f'a commit is in doubt: {cause}', outcome=task)
        applied, confirmed = found
        if not applied:
            raise StoreUnavailable(f'the commit was rolled back: its EXEC never ran ({cause})')
        logger.warning('a commit whose reply was lost is found applied (%s)', marker)
        await self._announce_all(sends)
        if not confirmed:
            raise CommitInDoubt(
                f'no Redis replica confirmed a commit whose reply was lost: {cause}',
                outcome=_known(True),
            )

    async def _learn(
        self, client: 'redis.asyncio.Redis', marker: str, started: float, sends: Sends
    ) -> bool:
        """Ask for the marker until Redis answers (True: the commit is applied). Once the marker
        may have expired nothing more can be learnt: the outcome stays unknown, and the
        transaction's acks stay held, until this replica stops."""
        until = started + MARKER_SECONDS - MARKER_MARGIN_SECONDS
        while time.monotonic() < until:
            await asyncio.sleep(min(SETTLE_PAUSES[-1], max(0.0, until - time.monotonic())))
            try:
                applied, _ = await self._marker_found(client, marker)
            except REDIS_DOWN as exc:
                logger.warning('the outcome of a commit is still unknown: %s', exc)
                continue
            if applied:
                logger.warning('a commit in doubt is applied after all (%s)', marker)
                await self._announce_all(sends)
            else:
                logger.warning('a commit in doubt is found not applied (%s)', marker)
            return applied
        logger.error('the outcome of a commit could not be learnt before its marker expired (%s)',
                     marker)  # fmt: skip
        forever: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        return await forever

    async def _marker_found(self, client: 'redis.asyncio.Redis', marker: str) -> tuple[bool, bool]:
        """Whether the marker is there (its ``EXEC`` ran), and whether a replica confirmed it.
        Not there, it is written as ``FENCED``: the commit's ``WATCH`` of it then aborts an
        ``EXEC`` that Redis has not read yet (its connection closed by the broker, which a
        ``+switch-master`` or a ``socket_timeout`` does, with the bytes still unread on a live
        server), so "never ran" stays true; without it that ``EXEC`` ran after the answer and
        the commit tried again was applied twice. ``PEXPIRE`` then writes in either case, and a
        ``WAIT`` after it on the same connection confirms everything the primary applied
        before, the ``EXEC`` too."""
        if self.commits is not None:  # the slot's primary now: a failover may have moved it
            client = self.commits.node_for(marker)
        pipe = client.pipeline(transaction=False)
        pipe.set(marker, FENCED, px=int(MARKER_SECONDS * 1000), nx=True, get=True)
        pipe.pexpire(marker, int(MARKER_SECONDS * 1000))
        if self._durability is Durability.REPLICATED:
            pipe.execute_command('WAIT', 1, self._replication_timeout_ms)
        try:
            replies: list[Any] = await pipe.execute()
        except NOTHING_RAN as exc:  # no answer from this node: its slot's new primary next time
            await self._refresh_nodes()
            raise redis.exceptions.ConnectionError(f'the slot is served elsewhere: {exc}') from exc
        except REDIS_DOWN:  # a node gone: the slot map may name its successor by the next time
            await self._refresh_nodes()
            raise
        applied = replies[0] == APPLIED
        confirmed = self._durability is not Durability.REPLICATED or (
            isinstance(replies[2], int) and replies[2] >= 1
        )
        return applied, confirmed

    async def _refresh_nodes(self) -> None:
        if self.commits is not None:
            await self.commits.refresh_nodes()

    async def _announce_all(self, sends: Sends) -> None:
        """Wake the addresses' consumers. The commit is applied by now: a failed wake-up must
        not make it look rolled back (it would be committed again, its sends twice); a
        notification channel that was lost lets every watched address be fetched once anyway."""
        for address in {address for address, _, _ in sends}:
            try:
                await self._announce(address)
            except StoreUnavailable as exc:
                logger.warning('a committed transaction could not wake %r: %s', address, exc)


def _known(applied: bool) -> 'asyncio.Future[bool]':
    outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    outcome.set_result(applied)
    return outcome
