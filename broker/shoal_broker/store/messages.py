"""
Messages: publish, fetch, ack, release, browse, claim, schedule and commit.

The per-message calls (``publish_then``, ``claim_then``, ``fetch_then``, ``ack_nowait``) only
queue an op for the next cycle (``cycles.py``); one pipeline carries a cycle's ops and one
callback answers each batch, so no message costs a round trip of its own. A transaction's commit
and the return of stranded entries are direct calls: rare, and atomic on their own.
"""

import asyncio
import dataclasses
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio

from shoal_broker.errors import AddressNotFound, BrokerError, StoreFull
from shoal_broker.routing.storage import (
    NORMAL_BAND,
    BrowseCursor,
    ClaimCallback,
    DuplicateWindow,
    Entry,
    Fetched,
    OutgoingMessage,
    PublishCallback,
    T,
    stored_origin,
)
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.store import bodies as big_bodies
from shoal_broker.store import keys
from shoal_broker.store.acks import Acks
from shoal_broker.store.backlogs import BacklogLimits
from shoal_broker.store.bulk_fetches import BulkFetches
from shoal_broker.store.calls import Scripts
from shoal_broker.store.commits import CommitLog
from shoal_broker.store.confirming import Confirming
from shoal_broker.store.cycles import Cycles
from shoal_broker.store.duplicates import DuplicateWindows
from shoal_broker.store.fetch_command import fetch_args, fetch_command
from shoal_broker.store.groups import drop_command, forget_command
from shoal_broker.store.lane import BULK_HEADS, CRLF, READ_ENTRIES, encode
from shoal_broker.store.last_values import LastValues, count_checked, last_op
from shoal_broker.store.lines import STANDBY, gated_fetch, standby
from shoal_broker.store.ops import Op, Tokens, no_result
from shoal_broker.store.releasing import Releasing
from shoal_broker.store.replies import browse_page, entries_of, new_entries, replica_is_ready
from shoal_broker.store.stranded import return_stranded
from shoal_broker.store.transactions import Transactions

logger = logging.getLogger(__name__)

MAX_CACHED_TAILS = 4096
"""Encoded (no expiry, origin) pairs kept (``Messages._encoded``): one per producing
connection, so the cache is cleared when it fills rather than grown."""

Announce = Callable[[str], Awaitable[None]]


class Messages(Releasing):
    """Implements ``routing.storage.MessagePort``."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        scripts: Scripts,
        cycles: Cycles,
        replica_id: str,
        *,
        kinds: dict[str, AddressKind],
        backlogs: BacklogLimits,
        announce: Announce,
        durability: Durability = Durability.MEMORY,
        replication_timeout_ms: int = 1000,
        commits: CommitLog | None = None,
        duplicates: DuplicateWindows | None = None,
        big_body_bytes: int = 0,
    ) -> None:
        self._client = client
        self.big_body_bytes = big_body_bytes or sys.maxsize
        """Rests this long or longer are stored beside the publish script (``bodies.py``)."""
        self.recent_bodies = big_bodies.RecentBodies()
        self.duplicates = duplicates or DuplicateWindows()
        self.last_values = LastValues()
        self.transactions = Transactions(
            client, scripts, replica_id, announce, durability, replication_timeout_ms, commits,
            duplicates=self.duplicates,
        )  # fmt: skip
        self._scripts = scripts
        self._cycles = cycles
        self._replica_id = replica_id
        self._kinds = kinds
        """Address kinds known (shared with the registry): a publish to a deleted address
        forgets it."""
        self._backlogs = backlogs
        self._announce = announce
        self._durability = durability
        self._replication_timeout_ms = replication_timeout_ms
        # the cycles' queue, open batches and wake-up, held here: the per-message calls reach
        # them with one lookup each
        self._enqueue = cycles.queued.append
        self._open_publishes = cycles.open_publishes
        self._wake = cycles.wakeup.set
        self._queue = cycles.queue
        self._script = scripts.command
        self._tails: dict[str, bytes] = {}
        """The encoded expiry and origin of messages without an expiry, by origin."""
        self._bulk_fetches = BulkFetches()
        self.acks = Acks(cycles, durable=durability is Durability.REPLICATED)
        self.ack_nowait = self.acks.ack_nowait
        self.confirming = Confirming(cycles)
        if durability is Durability.REPLICATED:
            cycles.defer_writes = self.confirming.defer_writes

    def publish(self, address: str, kind: AddressKind, message: OutgoingMessage) -> Awaitable[bool]:
        future: asyncio.Future[bool] = (
            self._cycles.loop or asyncio.get_running_loop()
        ).create_future()
        queue = self._queue_publish if message.duplicate_id is None else self._queue_unique
        queue(address, kind, message, future, None)
        return future

    def duplicate_window(self, address: str) -> DuplicateWindow | None:
        return self.duplicates.of(address)

    @property
    def last_value_key(self) -> Callable[[str], str | None]:
        return self.last_values.of

    def _encoded(self, message: OutgoingMessage) -> tuple[bytes, ...]:
        """A message's four script arguments (header, rest, expiry, origin) as the
        PARTS_PER_MESSAGE parts of an ``Encoded``. The last two are the same for every message
        of a producing connection that sets no expiry, so those are encoded once."""
        header, rest, expiry_ms, origin = (
            message.header, message.rest, message.expiry_ms, message.origin
        )  # fmt: skip
        if message.group:
            tail = encode(b'%d' % expiry_ms, stored_origin(message).encode())
        elif expiry_ms:
            tail = encode(b'%d' % expiry_ms, origin.encode())
        else:
            known = self._tails.get(origin)
            if known is None:
                if len(self._tails) >= MAX_CACHED_TAILS:
                    self._tails.clear()
                known = self._tails[origin] = encode(b'0', origin.encode())
            tail = known
        return (BULK_HEADS[len(header)], header, CRLF, BULK_HEADS[len(rest)], rest, CRLF, tail)

    def publish_then(
        self,
        address: str,
        kind: AddressKind,
        message: OutgoingMessage,
        callback: PublishCallback[T],
        token: T,
    ) -> None:
        if message.duplicate_id is not None:  # its address checks for duplicates
            self._queue_unique(address, kind, message, None, callback, token)
            return
        batched = self._open_publishes.get(('publish', address, message.band, kind))
        # this cycle's op for the address and band takes the message, if it answers the same
        # callback (written out here: this runs once per message)
        if batched is not None and batched.callback is callback:
            if len(message.rest) >= self.big_body_bytes:  # its body beside the script (bodies.py)
                message = self._stubbed(address, message, batched.commands)
            batched.args += self._encoded(message)
            batched.tokens.append(token)
            return
        self._queue_publish(address, kind, message, None, callback, token)

    def _stubbed(
        self, address: str, message: OutgoingMessage, commands: list[tuple[Any, ...]]
    ) -> OutgoingMessage:
        """``message`` with a stub for its rest, whose body ``commands`` gain (``bodies.py``)."""
        stub, stub_id = big_bodies.new_stub()
        commands.append(big_bodies.body_command(address, stub_id, message.rest))
        self.recent_bodies.keep(stub_id, message.rest, address)
        return dataclasses.replace(message, rest=stub)

    def _queue_publish(
        self,
        address: str,
        kind: AddressKind,
        message: OutgoingMessage,
        future: asyncio.Future[bool] | None,
        callback: PublishCallback[Any] | None,
        token: Any = None,
    ) -> None:
        """A new publish op; one with a ``callback`` stays open for the cycle (``publish_then``)."""
        key = ('publish', address, message.band, kind)  # kind: a StrEnum, a str
        bodies: list[tuple[Any, ...]] = []
        if len(message.rest) >= self.big_body_bytes:
            message = self._stubbed(address, message, bodies)
        args = list(self._encoded(message))
        if callback is None:  # a later message for the same key must not overtake this one
            self._open_publishes.pop(key, None)

        def finish(replies: list[Any]) -> bool:
            reply = big_bodies.script_replies(replies)[0]
            self._refused(address, reply)
            return bool(reply)

        self._open_op(key, args, finish, future, callback, token, bodies)

    def _open_op(
        self,
        key: tuple[Any, ...],
        args: list[Any],
        finish: Callable[[list[Any]], bool],
        future: asyncio.Future[bool] | None,
        callback: PublishCallback[Any] | None,
        token: Any,
        bodies: list[tuple[Any, ...]] | None = None,
    ) -> None:
        """Queues a publish op (batched by ``key``); one with a ``callback`` stays open for the
        cycle, its arguments growing with the cycle's later messages (``publish_then``), its
        commands with their bodies (``bodies.py``)."""
        answer = None
        commands = bodies or []
        if callback is not None:
            answer = self._open_publishes[key] = Tokens(callback, token, args)
            answer.commands = commands
        # notify None: the publishing scripts wake other replicas themselves
        self._enqueue(Op(commands, finish, future, None, False, key, args, answer))
        self._wake()

    def _refused(self, address: str, reply: Any) -> None:  # a publish script's -1 or -2
        if reply == -1:
            self._kinds.pop(address, None)
            raise AddressNotFound(f'{address!r} no longer exists')
        if reply == -2:
            limit = self._backlogs.limit(address)
            raise StoreFull(f'{address!r} holds its limit of {limit} messages', 'address_limit')

    def _queue_unique(
        self,
        address: str,
        kind: AddressKind,
        message: OutgoingMessage,
        future: asyncio.Future[bool] | None,
        callback: PublishCallback[Any] | None,
        token: Any = None,
    ) -> None:
        """``_queue_publish`` with duplicate detection (publish_unique.lua) or to a last-value
        queue (publish_last.lua): every message of such an address comes here, none overtakes."""
        if message.last_value is not None:
            key, parts = last_op(address, kind, message, self.duplicates, self._encoded(message))
        else:
            window = self.duplicates.of(address) or DuplicateWindow(1, 1)  # turned off meanwhile
            key = ('unique', address, message.band, kind, window.count, window.seconds)
            parts = (*self._encoded(message), encode(message.duplicate_id or b''))
        opened = self._open_publishes
        batched = opened.get(key) if callback is not None else opened.pop(key, None)
        if batched is not None and batched.callback is callback:
            batched.args += parts
            batched.tokens.append(token)
            return
        args = list(parts)

        def finish(replies: list[Any]) -> bool:
            self._refused(address, replies[0])
            if not isinstance(replies[0], list):  # a topic nobody subscribes to
                return False
            count_checked(address, replies[0])
            return True  # duplicates too: answered accepted, or the producer sends them again

        self._open_op(key, args, finish, future, callback, token)

    def leave_sharing(self, address: str, group: str) -> Awaitable[None]:
        shares = keys.AddressKeys.of(address).shares(group)
        return self._queue([('HDEL', shares, self._replica_id)], no_result)

    def drop_groups(self, address: str, group: str) -> Awaitable[None]:
        """See ``store/groups.py``: this replica's last consumer of the subscription left."""
        command = drop_command(self._script, self._replica_id, address, group)
        return self._queue([command], no_result)

    def forget_groups(self, address: str, group: str, groups: Sequence[str]) -> Awaitable[None]:
        command = forget_command(self._script, self._replica_id, address, group, groups)
        return self._queue([command], no_result)

    def replica_ready(self, address: str) -> Awaitable[bool]:
        """``WAIT 0 0`` and ``ROLE`` in the message path's pipeline, on the node of
        ``address`` (the ``EXISTS`` only routes it there), answered at once. Asked before held
        messages a replica did not confirm are written again (``amqp/holding.py``): each
        attempt while none is back would be one more copy."""
        groups = keys.AddressKeys.of(address).groups
        return self._queue([('EXISTS', groups), ('WAIT', 0, 0), ('ROLE',)], replica_is_ready)

    def can_claim(self, address: str) -> bool:
        """Whether ``claim_then`` may take a message to ``address``: not when the address has a
        backlog limit, which could refuse it after a consumer has it."""
        return self._backlogs.of(address) is None

    def claim_then(
        self,
        address: str,
        group: str,
        message: OutgoingMessage,
        callback: ClaimCallback[T],
        token: T,
    ) -> None:
        """Publish a message a consumer on this replica already has, and claim it for this replica
        in the same script (publish_claim.lua), with whatever of the group is unread ahead of it.
        The callback gets (ids of the messages in token order, entries read ahead of them)."""
        # the callback in the key: ops never share a script unless one Tokens answers them all
        key = ('claim', address, message.band, group, callback)
        batched = self._open_publishes.get(key)
        bodies = batched.commands if batched is not None else []
        if len(message.rest) >= self.big_body_bytes:
            message = self._stubbed(address, message, bodies)
        if batched is not None:
            batched.args += self._encoded(message)
            batched.tokens.append(token)
            return
        args = list(self._encoded(message))

        def finish(replies: list[Any]) -> tuple[list[str], list[Entry]]:
            head = big_bodies.script_replies(replies)[0]
            if head == -1:
                self._kinds.pop(address, None)
                raise AddressNotFound(f'{address!r} no longer exists')
            count = int(head[0])
            return [raw.decode() for raw in head[1 : count + 1]], entries_of(head, count + 1)

        answer = self._open_publishes[key] = Tokens(callback, token, args)
        answer.commands = bodies
        callback_ = big_bodies.resolving(  # the entries read ahead may be big ones' stubs
            address, self._queue, answer, lambda result: result and result[1], self.recent_bodies
        )
        self._enqueue(Op(bodies, finish, None, None, False, key, args, callback_))
        self._wake()

    def schedule(self, address: str, message: OutgoingMessage, due_ms: int) -> Awaitable[bool]:
        """Hold a message until ``due_ms``; any replica moves it into the stream then."""
        k = keys.AddressKeys.of(address)
        member = f'{due_ms}-{uuid.uuid4().hex}'
        args = (due_ms, member, message.band, message.header, message.rest,
                str(message.expiry_ms), stored_origin(message))  # fmt: skip
        script = self._script('schedule', (k.scheduled, k.scheduled_messages), args)
        listing = ('SADD', keys.SCHEDULED, address)
        if self._cycles.lanes is None:
            return self._queue([script, listing], lambda r: True)
        # on a cluster two slots: accepted once both are done. The set only grows, so a message
        # whose listing failed (released, not accepted) is found by the next one scheduled there
        both = asyncio.gather(
            self._queue([script], lambda r: True), self._queue([listing], lambda r: True)
        )
        return asyncio.ensure_future(_true_when_done(both))

    def fetch(
        self, address: str, group: str, count: int, consumers: int = 0, credit: int = 0
    ) -> Awaitable[Fetched]:
        fetch = self._fetch_op(address, group, count, consumers, credit or count)
        found = big_bodies.fetched_with_bodies(
            address, self._queue, self._queue(*fetch), self.recent_bodies
        )
        return asyncio.ensure_future(found)

    def fetch_then(
        self,
        address: str,
        group: str,
        count: int,
        callback: Callable[[Fetched | None, BrokerError | None], None],
        consumers: int = 0,
        credit: int = 0,
        active: str = '',
    ) -> None:
        commands, finish = self._fetch_op(address, group, count, consumers, credit or count, active)
        op = Op(commands, finish, None, confirmed=True, fetches=(address, group))
        durable = self.acks.durable  # replicated: delivered once a replica has the claims
        # big ones' bodies, those this replica holds checked only (bodies.py)
        callback = big_bodies.resolving(address, self._queue, callback, recent=self.recent_bodies)
        op.callback = self.confirming.answer(op, address, callback) if durable else callback
        self._cycles.enqueue_fetch(op)

    def _fetch_op(
        self, address: str, group: str, count: int, consumers: int, credit: int, active: str = ''
    ) -> tuple[list[tuple[Any, ...]], Callable[[list[Any]], Fetched]]:
        """The commands of one fetch and what makes entries of their replies. A subscription
        fetching in bulk has its priority-4 band read by a plain XREADGROUP beside the script:
        handed back through Lua, an entry costs Redis ~3 µs more, and the script alone answers
        such a fetch from a few reads (docs/performance.md#bulk-fetch); ``BulkFetches`` decides
        when."""
        k = keys.AddressKeys.of(address)
        subscription = (address, group)
        bulk = self._bulk_fetches.in_bulk(subscription)
        if active:  # exclusive: fetch.lua gates it on the line (routing/exclusive.py)
            commands = [gated_fetch(self._script, address, group, self._replica_id, count, active)]
        elif bulk and not self._cycles.reloading:  # reloading: one call, sent again after
            # fetch.lua takes returned entries and other bands; the default one is read directly.
            # By hash: by source its 27 KB cost Redis ~73 µs a fetch. Refused NOSCRIPT, the fetch
            # fails and its recovery returns what the read claimed (cycles._settle_units).
            args = fetch_args(group, self._replica_id, count, consumers=consumers, credit=credit,
                              notify=k.notify, read_default=False)  # fmt: skip
            commands = [
                fetch_command(('EVALSHA', self._scripts.sha['fetch']), address, group, args),
                (READ_ENTRIES, 'GROUP', group, self._replica_id, 'COUNT', count,
                 'STREAMS', k.streams[NORMAL_BAND], '>'),
            ]  # fmt: skip
        else:
            head = ('EVALSHA', self._scripts.sha['fetch'])
            args = fetch_args(group, self._replica_id, count, consumers=consumers, credit=credit,
                              notify=k.notify)  # fmt: skip
            commands = [fetch_command(head, address, group, args)]

        def finish(replies: list[Any]) -> Fetched:
            head = replies[0]
            if active and int(head[1]) == STANDBY:  # another consumer is first in line
                return standby(head, self._replica_id)
            entries = Fetched(entries_of(head, 3), int(head[1]), int(head[2]))
            if len(replies) > 1:
                new = new_entries(replies[1])
                if not head[0] and not any(entry.group for entry in new):
                    entries += new
                elif new:  # more returned entries may wait, or a message group's owner has a say:
                    # the new ones must not overtake them
                    # their releases are queued now, before any fetch the caller's callback
                    # starts: queued from the background task, they went after it, and that
                    # fetch handed out newer entries first
                    releases = [self.release(address, group, e, delivery_failed=False) for e in new]
                    self._cycles.background(self._give_back(address, group, new, releases))
            other = bool(head[0]) or entries.shared  # a shared one: only the script knows
            self._bulk_fetches.judge(subscription, other, len(entries), count, bulk)
            return entries

        return commands, finish

    def ack(self, address: str, group: str, entry: Entry) -> Awaitable[None]:
        counted = keys.entry_field(entry.band, entry.id) if entry.delivery_count else None
        return self._queue(
            [],
            no_result,
            batch=('ack', address, entry.band, group),
            batch_args=(entry.id, counted),
            lazy=True,
        )

    def browse(
        self, address: str, group: str, cursor: BrowseCursor, count: int
    ) -> Awaitable[tuple[Sequence[Entry], BrowseCursor]]:
        k = keys.AddressKeys.of(address)
        commands = [
            self._script('browse', (k.streams[band],), (group, position, count))
            for band, position in cursor.positions
        ]

        def finish(replies: list[Any]) -> tuple[Sequence[Entry], BrowseCursor]:
            return browse_page(cursor, replies, count)

        return asyncio.ensure_future(
            big_bodies.page_with_bodies(address, self._queue, self._queue(commands, finish))
        )

    async def commit(
        self,
        sends: Sequence[tuple[str, AddressKind, OutgoingMessage]],
        acks: Sequence[tuple[str, str, Entry]],
    ) -> None:
        """Apply a transaction's sends and acks atomically, across any addresses."""
        await self.transactions.commit(sends, acks)

    async def return_stranded(self, address: str, group: str, held: set[tuple[int, str]]) -> int:
        """See ``stranded.return_stranded``; entries whose acks settle (``acks.py``) are held."""
        held = held | self.acks.held(address, group)
        return await return_stranded(self._client, self._replica_id, address, group, held,
                                     self._announce)  # fmt: skip


async def _true_when_done(future: Awaitable[Any]) -> bool:
    await future
    return True
