"""
The per-message pipelines on Redis Cluster: one ``Lane`` per primary, each unit of commands sent
to the primary serving its slot (docs/redis-modes.md, "One lane per node").

A unit is the commands of one op on one slot (a publish script, a fetch, an ack). ``send`` groups
the units it is given into one pipeline per node, each on that node's lane, so a producer's
messages to one address (one slot, one node) keep the order Redis applies them in. What Redis
refuses before running it is sent again where it belongs, and only then answered:

- ``MOVED`` (the slot moved for good): to the node it names, which serves the slot from then on;
- ``ASK`` (the slot is migrating and this unit's keys are gone): to the target, each command
  preceded by ``ASKING``; the slot still belongs to the source for the next units;
- ``TRYAGAIN`` (a unit's keys split between the two nodes), ``CLUSTERDOWN`` (a failover),
  ``READONLY``: after a pause, on a fresh slot map.

Each pipeline's round trip is observed in ``shoal_redis_pipeline_seconds``, as the single lane's
pipelines are (``cycles.py``): on a cluster one cycle makes one pipeline per node it writes to.

A slot's units go to one node at a time: while units of slot *s* are in flight on one node, units
of *s* for another node wait, and units sent back wait ahead of later ones, so a move never
reorders a slot's units. A unit still refused after ``settle_seconds`` is answered with the
refusal; a unit some of whose commands ran is answered as it is (the caller decides, as for any
error reply). A lost connection answers every unit in flight on it with the error, as one lane
does.
"""

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.crc import key_slot

from shoal_broker.metrics.registry import REDIS_ROUND_TRIP
from shoal_broker.store import connect, keys
from shoal_broker.store.lane import CONNECTION_ERRORS, Lane

logger = logging.getLogger(__name__)

Done = Callable[[list[Any] | None, BaseException | None], None]
"""Called with a unit's replies (error replies as exception objects), or the error that lost
them."""

Answer = Callable[[list['Unit'], list[Any] | None, BaseException | None], None]
"""Called with units answered together: their replies one after the other (followed by the
WAIT's reply when one of them is to ``confirm``), or the error that lost them."""

PAUSE_SECONDS = {
    redis.exceptions.TryAgainError: 0.02,
    redis.exceptions.ClusterDownError: 0.1,
    redis.exceptions.ReadOnlyError: 0.1,
}
"""Pause before sending again a unit Redis refused with these (MOVED and ASK go at once)."""

REFRESH_SECONDS = 1.0
"""At most one slot map refresh this often."""

_REFUSED = (
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
)


@dataclasses.dataclass(slots=True, eq=False)
class Unit:
    """Commands on one slot and who wants their replies."""

    slot: int
    commands: list[tuple[Any, ...]]
    done: Done | None = None
    """Called with this unit's replies, unless it has an ``answer``."""
    started: float = 0.0
    """When it was first sent (loop time): past ``settle_seconds`` a refusal is its answer."""
    asking: str | None = None
    """The node an ASK named: the next sending goes there, with ASKING."""
    confirm: bool = False
    """It writes what a replica must confirm (``replicated`` durability): the pipeline it goes
    in ends with a WAIT, whose reply is appended to its replies."""
    answer: Answer | None = None
    """Instead of ``done``: answers at once all the units of one pipeline that share it and
    that Redis did not refuse (a cycle's units, settled together); a unit sent again is
    answered alone."""
    context: Any = None
    """The sender's own, for ``answer`` to tell its units apart."""
    carrier: int = 0
    """The socket (``Lane.serial``) whose pipeline answered it last."""


def answer_one(unit: Unit, replies: list[Any] | None, error: BaseException | None) -> None:
    if unit.answer is not None:
        unit.answer([unit], replies, error)
    elif unit.done is not None:
        unit.done(replies, error)


def _answer_grouped(answered: list[tuple[Unit, list[Any]]], confirmed: Any) -> None:
    """Each unit's ``done`` with its replies, each ``answer`` once with all of its units'
    (``confirmed``: the reply of the pipeline's WAIT, if it had one)."""
    groups: dict[Answer, tuple[list[Unit], list[Any]]] = {}
    for unit, mine in answered:
        if unit.answer is None:
            if unit.done is not None:
                unit.done([*mine, confirmed] if unit.confirm else mine, None)
            continue
        group = groups.get(unit.answer)
        if group is None:
            group = groups[unit.answer] = ([], [])
        group[0].append(unit)
        group[1].extend(mine)
    for answer, (together, theirs) in groups.items():
        if any(unit.confirm for unit in together):
            theirs.append(confirmed)
        answer(together, theirs, None)


@functools.lru_cache(maxsize=65536)  # a key's slot, computed once: addresses recur
def slot_of(key: str | bytes) -> int:
    return int(key_slot(key.encode() if isinstance(key, str) else key))


def unit_slot(commands: list[tuple[Any, ...]]) -> int:
    """The slot of a unit: that of its first tagged key (``shoal:{<tag>}:...``), else of its
    first command's key."""
    first = commands[1] if commands[0][0] == 'MULTI' else commands[0]  # store/bodies.py
    # usually the first command's first key: a script's source or hash and its key count
    # (what stands before a script's first key) are never tagged
    key = first[3] if first[0] in _SCRIPTS and len(first) > 3 else first[1]
    if isinstance(key, str) and key.startswith(_KEY_HEAD):
        return slot_of(key)
    for command in commands:
        for arg in command[1:]:
            if isinstance(arg, str) and arg.startswith(_KEY_HEAD):
                return slot_of(arg)
            if isinstance(arg, bytes) and arg.startswith(_KEY_HEAD_BYTES):
                return slot_of(arg)
    if first[0] in _SCRIPTS:
        return slot_of(first[3])
    return slot_of(first[1])  # a global key (``keys.SCHEDULED``): the command's first argument


_KEY_HEAD = f'{keys.PREFIX}:{{'
_SCRIPTS = ('EVAL', 'EVALSHA')
_KEY_HEAD_BYTES = _KEY_HEAD.encode()


class ClusterLanes:
    def __init__(
        self,
        cluster: 'redis.asyncio.cluster.RedisCluster',
        pool_for: Callable[[str, int], 'redis.asyncio.ConnectionPool'],
        max_in_flight: int,
        *,
        settle_seconds: float = 5.0,
        confirm_timeout_ms: int = 1000,
    ) -> None:
        """``confirm_timeout_ms``: the WAIT of a pipeline with a unit to ``confirm``."""
        self._cluster = cluster
        self._confirm_timeout_ms = confirm_timeout_ms
        self._pool_for = pool_for
        self._max_in_flight = max_in_flight
        self._settle_seconds = settle_seconds
        self._lanes: dict[str, Lane] = {}
        self._moved: dict[int, str] = {}
        """Slot -> node a MOVED named, until the next map refresh."""
        self._in_flight: dict[int, tuple[str, int]] = {}
        """Slot -> (node, units of the slot in flight there)."""
        self._held: dict[int, list[Unit]] = {}
        """Units of a slot waiting for it to drain from another node, in order."""
        self._sent_back: collections.Counter[int] = collections.Counter()
        """Units at the head of ``_held[slot]`` that were sent back: later ones go behind."""
        self._paused: set[int] = set()
        self._refreshed_at = -REFRESH_SECONDS
        self._refreshing: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.redirects = 0
        """Units sent again after MOVED, ASK, TRYAGAIN or CLUSTERDOWN (a metric)."""

    @property
    def nodes(self) -> list[str]:
        """The nodes (``host:port``) a lane was opened to."""
        return list(self._lanes)

    def lane(self, node: str) -> Lane:
        lane = self._lanes.get(node)
        if lane is None:
            host, _, port = node.rpartition(':')
            lane = self._lanes[node] = Lane(self._pool_for(host, int(port)), self._max_in_flight)
        return lane

    def _owner(self, unit: Unit) -> str:
        if unit.asking is not None:
            return unit.asking
        if self._moved:  # only after a MOVED, until the next map refresh
            moved = self._moved.get(unit.slot)
            if moved is not None:
                return moved
        nodes = self._cluster.nodes_manager.slots_cache.get(unit.slot)
        if not nodes:
            raise redis.exceptions.ClusterDownError(f'slot {unit.slot} is not served')
        return str(nodes[0].name)

    async def send(self, units: Sequence[Unit]) -> None:
        """Send ``units`` to their slots' primaries, one pipeline per node (waiting for room
        on each lane), or hold them behind their slot's units in flight elsewhere."""
        loop = asyncio.get_running_loop()
        by_node: dict[str, list[Unit]] = {}
        for unit in units:
            if not unit.started:
                unit.started = loop.time()
            try:
                node = self._owner(unit)
            except redis.exceptions.ClusterDownError as exc:  # its slot is in no map yet
                if loop.time() - unit.started < self._settle_seconds:
                    self._send_back(unit, exc)
                else:  # as any refusal past settle_seconds: never sent back for ever
                    answer_one(unit, None, exc)
                continue
            busy = self._in_flight.get(unit.slot)
            if (
                (busy and busy[0] != node)
                or (self._held and self._held.get(unit.slot))  # most often nothing is held
                or unit.slot in self._paused
            ):
                self._held.setdefault(unit.slot, []).append(unit)
                continue
            self._in_flight[unit.slot] = (node, busy[1] + 1) if busy else (node, 1)
            mine = by_node.get(node)
            if mine is None:
                by_node[node] = [unit]
            else:
                mine.append(unit)
        for node, mine in by_node.items():
            await self._write(node, mine)

    async def _write(self, node: str, units: list[Unit]) -> None:
        commands: list[tuple[Any, ...]] = []
        plain = True  # no unit goes with ASKING: the replies are the units', one after another
        confirm = False
        for unit in units:
            if unit.asking is None:
                commands += unit.commands
            else:
                plain = False
                for command in unit.commands:
                    commands += [('ASKING',), command]
            if unit.confirm:
                confirm = True
        if confirm:  # on the pipeline's own connection: it confirms what came before it
            commands.append(('WAIT', 1, self._confirm_timeout_ms))
        lane = self.lane(node)

        def answered(replies: list[Any] | None, error: BaseException | None) -> None:
            if error is None:
                REDIS_ROUND_TRIP.observe(time.perf_counter() - started)
                if confirm:
                    for unit in units:
                        unit.carrier = lane.serial
            self._answered(units, replies, error, plain=plain, confirm=confirm)

        try:
            await lane.wait_for_room()
            started = time.perf_counter()
            await lane.send_then(commands, answered)
        except CONNECTION_ERRORS as exc:
            self._answered(units, None, exc, plain=plain, confirm=confirm)
        except Exception as exc:  # a bug: answered all the same, or its slot waits for ever
            logger.exception('a pipeline to %s was not sent', node)
            lost = redis.exceptions.ConnectionError(f'a pipeline was not sent: {exc!r}')
            self._answered(units, None, lost, plain=plain, confirm=confirm)

    def _answered(
        self,
        units: list[Unit],
        replies: list[Any] | None,
        error: BaseException | None,
        *,
        plain: bool,
        confirm: bool,
    ) -> None:
        in_flight = self._in_flight
        for unit in units:
            node, count = in_flight[unit.slot]
            if count > 1:
                in_flight[unit.slot] = (node, count - 1)
            else:
                del in_flight[unit.slot]
        try:
            if error is not None or replies is None:
                self._refresh_soon()
                lost = error or redis.exceptions.ConnectionError('no replies')
                for unit in units:
                    try:  # each answered, whatever another's answer raised
                        answer_one(unit, None, lost)
                    except Exception:
                        logger.exception('answering a unit Redis did not answer failed')
            elif plain and not any(isinstance(r, _REFUSED) for r in replies):
                self._answer_together(units, replies, confirm)
            else:
                self._answer_each(units, replies, confirm)
        finally:  # whatever an answer raised, what waits behind these units goes
            for slot in {unit.slot for unit in units}:
                self._release(slot)

    def _answer_together(self, units: list[Unit], replies: list[Any], confirm: bool) -> None:
        """Nothing refused: each ``answer`` once, with all of its units."""
        answer = units[0].answer
        if answer is not None and all(unit.answer is answer for unit in units):
            answer(units, replies, None)  # the usual case: one cycle's units, WAIT's reply last
            return
        answered: list[tuple[Unit, list[Any]]] = []
        pos = 0
        for unit in units:
            answered.append((unit, replies[pos : pos + len(unit.commands)]))
            pos += len(unit.commands)
        _answer_grouped(answered, replies[-1] if confirm else None)

    def _answer_each(self, units: list[Unit], replies: list[Any], confirm: bool) -> None:
        """Some were refused (or went with ASKING): each unit looked at on its own, a refused
        one sent again while it has time, the others answered as above."""
        loop = asyncio.get_running_loop()
        answered: list[tuple[Unit, list[Any]]] = []
        pos = 0
        for unit in units:
            width = len(unit.commands) * (2 if unit.asking else 1)
            mine = replies[pos : pos + width]
            pos += width
            if unit.asking:
                mine = mine[1::2]  # the ASKING replies go
            refused = [r for r in mine if isinstance(r, _REFUSED)]
            timely = loop.time() - unit.started < self._settle_seconds
            whole = len(refused) == len(mine)
            if refused and isinstance(mine[-1], redis.exceptions.ExecAbortError):
                # a MULTI refused as it was queued: nothing ran. Sent again only for MOVED; ASK
                # and TRYAGAIN in a MULTI name a new key (a big body, store/bodies.py) in a slot
                # on the move, which neither node takes until the address's keys have moved
                whole = isinstance(refused[0], redis.exceptions.MovedError)
            if refused and whole and timely:
                self._send_back(unit, refused[0])
            else:
                answered.append((unit, mine))
        _answer_grouped(answered, replies[-1] if confirm else None)

    def _send_back(self, unit: Unit, refusal: BaseException) -> None:
        """Hold a refused unit ahead of its slot's later units, to go where Redis said."""
        self.redirects += 1
        unit.asking = None
        pause = 0.0
        if isinstance(refusal, redis.exceptions.MovedError):
            self._moved[unit.slot] = refusal.node_addr[0] + ':' + str(refusal.node_addr[1])
        elif isinstance(refusal, redis.exceptions.AskError):
            unit.asking = refusal.node_addr[0] + ':' + str(refusal.node_addr[1])
        else:
            pause = next((p for kind, p in PAUSE_SECONDS.items() if isinstance(refusal, kind)), 0.1)
            self._refresh_soon()
        held = self._held.setdefault(unit.slot, [])
        held.insert(self._sent_back[unit.slot], unit)
        self._sent_back[unit.slot] += 1
        if pause and unit.slot not in self._paused:
            self._paused.add(unit.slot)
            asyncio.get_running_loop().call_later(pause, self._resume, unit.slot)

    def _resume(self, slot: int) -> None:
        self._paused.discard(slot)
        self._release(slot)

    def _release(self, slot: int) -> None:
        """Send what waits for ``slot`` once nothing of it is in flight and it is not paused."""
        if slot in self._paused or slot in self._in_flight or not self._held.get(slot):
            return
        units = self._held.pop(slot)
        self._sent_back.pop(slot, None)
        self._background(self.send(units))

    def _refresh_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if self._refreshing is None and loop.time() - self._refreshed_at >= REFRESH_SECONDS:
            self._refreshed_at = loop.time()
            self._refreshing = loop.create_task(self._refresh(), name='cluster-slot-map')

    async def _refresh(self) -> None:
        try:
            await connect.refresh_slot_map(self._cluster)
            self._moved.clear()
        except (*CONNECTION_ERRORS, redis.exceptions.RedisClusterException) as exc:
            logger.debug('slot map not refreshed: %s', exc)
        finally:
            self._refreshing = None

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop: units still waiting to be sent again are answered with an error."""
        for task in [*self._tasks, *([self._refreshing] if self._refreshing else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        held, self._held = self._held, {}
        for units in held.values():
            for unit in units:
                answer_one(unit, None, redis.exceptions.ConnectionError('the lanes are closed'))
        for lane in self._lanes.values():
            with contextlib.suppress(*CONNECTION_ERRORS):
                await lane.close()
