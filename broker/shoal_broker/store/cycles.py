"""
The per-message path's machinery: ops queued, sent as one pipeline per cycle, settled from the
replies.

While pipelines are in flight, the next one fills up, so the batch grows with load and there is
never one round trip per message (DESIGN.md §3). Up to ``PIPELINES_IN_FLIGHT`` pipelines are in
flight at a time, all on one connection (``lane.py``): Redis applies them in the order they were
written, which keeps one producer's messages in order, and nothing is accepted before its
pipeline's reply. A cycle that returned entries announces them to other replicas (``notify.lua``)
and wakes this replica's own consumers; a publish script announces its own.

On Redis Cluster (``lanes`` given) a cycle's units go to one lane per primary, each unit to the
primary serving its address's slot (``lanes.py``), and the units of each node's pipeline are
settled together as it answers (one by one only those Redis refused and that were sent again);
in ``replicated`` mode each node's pipeline ends with its own ``WAIT``.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import redis.asyncio

from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.registry import REDIS_ROUND_TRIP
from shoal_broker.routing.storage import Notify
from shoal_broker.settings import Durability
from shoal_broker.stopping import cancel_and_wait
from shoal_broker.store import keys
from shoal_broker.store.backlogs import BacklogLimits
from shoal_broker.store.bodies import with_bodies
from shoal_broker.store.calls import REDIS_DOWN, Scripts
from shoal_broker.store.lane import Lane
from shoal_broker.store.lanes import ClusterLanes, slot_of, unit_slot
from shoal_broker.store.lanes import Unit as LaneUnit
from shoal_broker.store.last_values import publish_last_command
from shoal_broker.store.ops import (
    WRITES,
    Op,
    Tokens,
    Unit,
    carried,
    fail,
    is_noscript,
    quadruples,
    quintuples,
    refusal,
    settle,
    unconfirmed,
    unreachable,
)

logger = logging.getLogger(__name__)

PIPELINES_IN_FLIGHT = 4
"""Per-message pipelines sent but not yet answered. One left the broker idle for every round
trip (73 % CPU at saturation); more than a few only shrinks the batches
(docs/performance.md#store-lane)."""

ACK_COALESCE_SECONDS = 0.002
"""How long an ack waits for a pipeline to ride along with. Under load every cycle carries acks
anyway; at a trickle (1 000 msg/s) each ack otherwise paid a pipeline and two wake-ups of its own
(docs/performance.md#ack-coalescing), while the next publish comes within a millisecond. An ack
still queued when the replica dies only means a redelivery, which at-least-once allows."""

UNCONFIRMED_WARNING_SECONDS = 10.0
"""At most one warning this often while no Redis replica confirms writes (``replicated``)."""


class Cycles:
    """Sends the queued ops, a pipeline per cycle, and settles them in the order they were sent."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        scripts: Scripts,
        replica_id: str,
        backlogs: BacklogLimits,
        notify_local: Notify,
        durability: Durability = Durability.MEMORY,
        replication_timeout_ms: int = 1000,
        lanes: ClusterLanes | None = None,
    ) -> None:
        self._scripts = scripts
        self._replica_id = replica_id
        self._backlogs = backlogs
        self._notify_local = notify_local
        self._durability = durability
        self._replication_timeout_ms = replication_timeout_ms
        self.lanes = lanes
        """On Redis Cluster: the lane of each primary (``lane`` is not used)."""
        pool: Any = client.connection_pool if lanes is None else _NoPool()
        self.lane = Lane(pool, PIPELINES_IN_FLIGHT)
        self.queued: list[Op] = []
        """Ops for the next cycle. Always this list (emptied, never replaced): the message
        operations hold it (and the two dicts below) to append without a lookup."""
        self.open_publishes: dict[tuple[Any, ...], Tokens] = {}
        """The open publish op of each (address, band, kind), which later messages join."""
        self.open_acks: dict[tuple[Any, ...], Op] = {}
        """The same for ``ack_nowait``: its (address, band, group)'s queued op."""
        self.queued_fetches: dict[tuple[str, str], Op] = {}
        """The first queued fetch of each (address, group) (``enqueue_fetch``)."""
        self.wakeup = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._in_flight: dict[int, list[Op]] = {}
        """Ops of each pipeline sent and not yet answered, by cycle number."""
        self._cycle_number = 0
        self._retry: list[Op] = []
        """Ops to send again, in order, once the scripts are loaded (Redis had forgotten them)."""
        self.reloading = False
        """The scripts are being loaded again: a fetch goes as one script call meanwhile, not in
        bulk (``Messages._fetch_op``), so that a NOSCRIPT sends it again after the load."""
        self._sending: list[Op] = []
        """Ops taken from the queue whose pipeline is being written."""
        self._lazy_wakeup: asyncio.TimerHandle | None = None
        """Armed while only acks are queued (ACK_COALESCE_SECONDS)."""
        self._task: asyncio.Task[None] | None = None
        self._pending_tasks: set[asyncio.Future[None]] = set()
        self._unconfirmed_warned_at = -UNCONFIRMED_WARNING_SECONDS
        self.defer_writes: Callable[[list[Op]], None] | None = None
        """Where writes no replica confirmed in time wait for one (``Confirming.defer_writes``)."""
        self.pipelines = 0
        """Pipelines sent so far (a batching measure for benchmarks and tests)."""
        self.commands = 0

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name='store-cycles')

    async def close(self) -> None:
        """Stop sending, and the background work (a reload of the scripts, whose client would
        otherwise open connections again after it closed); fail every op not answered yet."""
        self.closed = True
        if self._lazy_wakeup is not None:
            self._lazy_wakeup.cancel()
        await cancel_and_wait([*([self._task] if self._task else []), *self._pending_tasks])
        await self.lane.close()
        if self.lanes is not None:
            await self.lanes.close()
        for op in (*self.queued, *self._sending, *self._retry, *self._in_flight_ops()):
            if not op.done():
                fail(op, StoreUnavailable('broker shutting down'))

    async def flush(self) -> None:
        """Wait until everything queued or in flight has been sent and answered."""
        while self.queued or self._sending or self._in_flight or self._retry:
            ops = (*self.queued, *self._sending, *self._retry, *self._in_flight_ops())
            futures = [op.future for op in ops if op.future is not None]
            if futures:
                await asyncio.gather(*futures, return_exceptions=True)
            else:  # only callback ops left: they are answered with their pipeline
                await asyncio.sleep(0.01)

    def _in_flight_ops(self) -> list[Op]:
        return [op for ops in self._in_flight.values() for op in ops]

    def queue(
        self,
        commands: list[tuple[Any, ...]],
        finish: Callable[[list[Any]], Any],
        notify: str | None = None,
        *,
        notify_local: bool = False,
        batch: tuple[Any, ...] | None = None,
        batch_args: Sequence[Any] = (),
        lazy: bool = False,
    ) -> asyncio.Future[Any]:
        """Queue commands for the next cycle; a ``lazy`` op waits up to ACK_COALESCE_SECONDS
        for another op to start that cycle."""
        loop = self.loop or asyncio.get_running_loop()  # cached: this runs once per message
        future: asyncio.Future[Any] = loop.create_future()
        self.queued.append(Op(commands, finish, future, notify, notify_local, batch, batch_args))
        if lazy:
            self.wake_lazily()
        else:
            self.wakeup.set()
        return future

    def enqueue_fetch(self, op: Op) -> None:
        """Queue a fetch (``Op.fetches`` set) and start a cycle; a give-back of its subscription
        finds it here rather than by a walk of the queue (``Releasing._ahead_of_fetch``)."""
        assert op.fetches is not None
        self.queued_fetches.setdefault(op.fetches, op)
        self.queued.append(op)
        self.wakeup.set()

    def wake_lazily(self) -> None:
        """Start a cycle within ACK_COALESCE_SECONDS, unless another op starts one first."""
        if self._lazy_wakeup is None:
            loop = self.loop or asyncio.get_running_loop()
            self._lazy_wakeup = loop.call_later(ACK_COALESCE_SECONDS, self.wakeup.set)

    def background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending_tasks.add(task)
        task.add_done_callback(self._pending_tasks.discard)

    async def _run(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            if not self.queued:
                continue
            if self.lanes is None:  # ClusterLanes.send waits for room on each node's lane
                await self.lane.wait_for_room()  # meanwhile the batch grows
            ops = self.queued.copy()
            self.queued.clear()
            self.open_publishes.clear()  # what is published from now on goes in the next cycle
            self.open_acks.clear()
            self.queued_fetches.clear()
            if self._lazy_wakeup is not None:  # the acks waiting for a ride go in this one
                self._lazy_wakeup.cancel()
                self._lazy_wakeup = None
            self._sending = ops
            try:
                await self._send_cycle(ops)
            except Exception as exc:  # a bug must not stop every later store operation
                logger.exception('store cycle failed')
                for op in ops:
                    if not op.done():
                        fail(op, StoreUnavailable(f'store cycle failed: {exc}'))
            finally:
                self._sending = []

    async def _send_cycle(self, ops: list[Op]) -> None:
        units = self._units(ops)
        commands = [command for unit_commands, _ in units for command in unit_commands]
        announced = {op.notify for op in ops if op.notify}  # a publish announces in its script
        notify = self._scripts.source['notify']
        for address in announced:  # by source, like publish: a lost script must not lose it
            k = keys.AddressKeys.of(address)
            commands.append(('EVAL', notify, 1, k.watchers, k.notify, self._replica_id))
        waits = self._durability is Durability.REPLICATED and _writes(ops)
        if waits:  # accepted only once a Redis replica has it
            commands.append(('WAIT', 1, self._replication_timeout_ms))
        self.pipelines += 1
        self.commands += len(commands)
        started = time.perf_counter()
        number = self._cycle_number = self._cycle_number + 1
        if self.lanes is not None:
            await self._send_to_nodes(number, ops, units, announced, waits)
            return

        def answered(replies: list[Any] | None, error: BaseException | None) -> None:
            self._in_flight.pop(number, None)
            if waits:  # the socket these replies came on (Lane.serial)
                carried(ops, self.lane.serial)
            self._answered(ops, units, replies, error, waits=waits, started=started)

        self._in_flight[number] = ops
        try:
            await self.lane.send_then(commands, answered)
        except BaseException as exc:  # not sent: nothing will answer it
            self._in_flight.pop(number, None)
            if not isinstance(exc, REDIS_DOWN):
                raise
            unreachable(ops, exc)

    async def _send_to_nodes(
        self, number: int, ops: list[Op], units: list[Unit], announced: set[str], waits: bool
    ) -> None:
        """The cycle on Redis Cluster: each unit to its slot's primary; the units of one node's
        pipeline are settled together as it answers (one by one those Redis refused)."""
        assert self.lanes is not None
        lane_units: list[LaneUnit] = []
        left = [len(units)]

        def answered(
            answered_units: list[LaneUnit], replies: list[Any] | None, error: BaseException | None
        ) -> None:
            settling: list[Unit] = [unit.context for unit in answered_units]
            try:
                self._nodes_answered(answered_units, settling, replies, error)
            finally:
                left[0] -= sum(1 for _, members in settling if members)  # not the wake-ups
                if left[0] <= 0:
                    self._in_flight.pop(number, None)

        for unit in units:
            confirm = waits and _writes(unit[1])
            lane_units.append(
                LaneUnit(
                    unit_slot(unit[0]), unit[0], confirm=confirm, answer=answered, context=unit
                )
            )
        notify = self._scripts.source['notify']
        for address in announced:  # answered with the rest: a lost one only delays a consumer
            k = keys.AddressKeys.of(address)
            command = ('EVAL', notify, 1, k.watchers, k.notify, self._replica_id)
            wakeup: Unit = ([command], [])
            lane_units.append(
                LaneUnit(slot_of(k.watchers), wakeup[0], answer=answered, context=wakeup)
            )
        self._in_flight[number] = ops
        if not units:
            self._in_flight.pop(number, None)
        try:
            await self.lanes.send(lane_units)
        except BaseException as exc:  # not sent: nothing will answer it
            self._in_flight.pop(number, None)
            if not isinstance(exc, REDIS_DOWN):
                raise
            unreachable(ops, exc)

    def _nodes_answered(
        self,
        lane_units: list[LaneUnit],
        settling: list[Unit],
        replies: list[Any] | None,
        error: BaseException | None,
    ) -> None:
        """Settle units of one node's pipeline: ``replies`` are theirs one after the other,
        then the WAIT's when one of them is to confirm."""
        members = [op for _, ops in settling for op in ops]
        if error is not None or replies is None:
            if members:
                unreachable(members, error or StoreUnavailable('no replies'))
            return
        if any(unit.confirm for unit in lane_units):
            confirmed, replies = replies[-1], replies[:-1]
            waited = [op for unit in lane_units if unit.confirm for op in unit.context[1]]
            carried(waited, lane_units[0].carrier)  # one pipeline's units: one socket
            if not (isinstance(confirmed, int) and confirmed >= 1):
                self._warn_unconfirmed()
                unconfirmed(waited, self.defer_writes)
        self._settle_units(settling, replies)
        for address in {op.notify for op in members if op.notify and op.notify_local}:
            self._notify_local(address)

    def _answered(
        self,
        ops: list[Op],
        units: list[Unit],
        replies: list[Any] | None,
        error: BaseException | None,
        *,
        waits: bool,
        started: float,
    ) -> None:
        """Settle a cycle's ops from its replies (called in the order the cycles were sent)."""
        if error is not None or replies is None:
            unreachable(ops, error or StoreUnavailable('no replies'))
            return
        REDIS_ROUND_TRIP.observe(time.perf_counter() - started)
        if waits and not (isinstance(replies[-1], int) and replies[-1] >= 1):
            self._warn_unconfirmed()
            unconfirmed(ops, self.defer_writes)
        self._settle_units(units, replies)
        for address in {op.notify for op in ops if op.notify and op.notify_local}:
            self._notify_local(address)

    def _warn_unconfirmed(self) -> None:
        """Say why no message is accepted while the primary has no replica (after a Sentinel
        failover, until one joins), once per UNCONFIRMED_WARNING_SECONDS."""
        now = time.monotonic()
        if now - self._unconfirmed_warned_at >= UNCONFIRMED_WARNING_SECONDS:
            self._unconfirmed_warned_at = now
            logger.warning(
                'no Redis replica confirmed writes within %d ms: messages are not accepted '
                '(held up to SHOAL_STORE_HOLD_SECONDS; SHOAL_DURABILITY=replicated needs a '
                'replica of the Redis primary)',
                self._replication_timeout_ms,
            )

    def _settle_units(self, units: list[Unit], replies: list[Any]) -> None:
        retry: list[Op] = []
        reload = False
        pos = 0
        for commands, members in units:
            mine = replies[pos : pos + len(commands)]
            pos += len(commands)
            # a merged command's replies belong to each of its members: looked at once per unit
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if error is None:
                for op in members:
                    settle(op, mine)
                continue
            forgot = any(is_noscript(r) for r in mine)
            if forgot and commands[-1][0] != 'XREADGROUP':
                retry += members
            else:  # a fetch in bulk refused NOSCRIPT too: its plain read ran and claimed what it
                # read, and sent again it would read on; it fails, and its subscription's recovery
                # returns those entries (stranded.py)
                reload = reload or forgot
                for op in members:
                    if not op.done():
                        fail(op, refusal(error))
        if (retry or reload) and not self.reloading:
            self.reloading = True
            self.background(self._reload_then_retry())
        self._retry += retry  # cycles are answered in order, so the retries stay in order

    async def _reload_then_retry(self) -> None:
        """Redis forgot the scripts (restarted or flushed): load them, then send those ops again
        ahead of everything queued (a script's hash is its SHA1: the commands stay valid). Only
        idempotent scripts (fetch, browse, schedule) go by hash; publish goes as source, so a
        lost script can never reorder a producer's messages."""
        try:
            await self._scripts.load()
        except REDIS_DOWN as exc:
            retry, self._retry, self.reloading = self._retry, [], False
            unreachable(retry, exc)
            return
        retry, self._retry, self.reloading = self._retry, [], False
        self.queued[:0] = retry
        self.queued_fetches.update((op.fetches, op) for op in reversed(retry) if op.fetches)
        self.wakeup.set()

    def _units(self, ops: list[Op]) -> list[Unit]:
        """Group ops into pipeline units, merging batchable ones where the first of them stood."""
        units: list[Unit] = []
        batches: dict[tuple[Any, ...], int] = {}
        for op in ops:
            if op.batch is None:
                units.append((op.commands, [op]))
            elif op.batch in batches:
                units[batches[op.batch]][1].append(op)
            else:
                batches[op.batch] = len(units)
                units.append(([], [op]))
        for key, index in batches.items():
            members = units[index][1]
            units[index] = (self._merged(key, members), members)
        return units

    def _merged(self, key: tuple[Any, ...], members: list[Op]) -> list[tuple[Any, ...]]:
        k = keys.AddressKeys.of(key[1])
        source = self._scripts.source
        if key[0] == 'publish':
            _, _, band, kind = key
            args = quadruples(members)
            # by source, not hash: see _reload_then_retry (Redis caches it by its SHA1)
            backlog = self._backlogs.of(key[1])
            announce = (k.notify, self._replica_id)  # other replicas' consumers, in the script
            if backlog is not None:  # a declared queue's maxMessages, SHOAL_MAX_BACKLOG_PER_ADDRESS
                script_keys = (k.streams[band], k.groups, *k.streams, k.watchers, k.levels,
                               k.body_index)  # fmt: skip
                return with_bodies(members, source['publish_limited'], script_keys,
                                   (kind, *backlog, *announce, args))  # fmt: skip
            script_keys = (k.streams[band], k.groups, k.watchers, k.levels, k.body_index)
            return with_bodies(members, source['publish'], script_keys, (kind, *announce, args))
        if key[0] == 'unique':  # by source, as publish; with no limit, '0' and an unread overflow
            _, _, band, kind, count, seconds = key
            unique_keys = (
                k.streams[band],
                k.groups,
                k.watchers,
                k.duplicates,
                *k.streams,
                k.levels,
            )
            return [
                ('EVAL', source['publish_unique'], len(unique_keys), *unique_keys, kind,
                 k.notify, self._replica_id, count, seconds * 1000,
                 *(self._backlogs.of(key[1]) or (0, '')), quintuples(members))
            ]  # fmt: skip
        if key[0] == 'last':  # a last-value queue (last_values.py)
            last = source['publish_last']
            return [publish_last_command(last, key, members, self._replica_id,
                                         self._backlogs.of(key[1]))]  # fmt: skip
        if key[0] == 'claim':  # by source, as publish
            _, _, band, group, _ = key
            args = quadruples(members)
            script_keys = (k.streams[band], k.groups, k.body_index)
            return with_bodies(members, source['publish_claim'], script_keys,
                               (group, self._replica_id, band, args))  # fmt: skip
        _, _, band, group = key  # ack: one XACK for all ids, one HDEL for the counted ones
        # batch_args: (id, counted field or None) pairs, one pair per ack or many (ack_nowait)
        commands: list[tuple[Any, ...]] = [
            ('XACK', k.streams[band], group, *(i for op in members for i in op.batch_args[::2]))
        ]
        counted = [f for op in members for f in op.batch_args[1::2] if f]
        if counted:
            commands.append(('HDEL', k.delivery_counts(group), *counted))
        return commands


def _writes(ops: list[Op]) -> bool:
    """Whether ``replicated`` durability waits for a replica after these ops: they append
    messages, or they are fetches (``Op.confirmed``) or acks (``Op.durable``)."""
    return any(
        (op.batch is not None and op.batch[0] in WRITES) or op.confirmed or op.durable for op in ops
    )


class _NoPool:
    """The pool of the unused single lane on Redis Cluster: never connected."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable('no single connection on Redis Cluster')

    async def release(self, connection: Any) -> None:
        pass
