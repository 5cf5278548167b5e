"""
One Redis connection carrying the per-message pipelines, several of them in flight at once.

Redis runs one connection's commands in the order they arrive, so pipelines written one after
the other on one connection are applied in that order whether or not the previous replies have
come back: a producer's messages stay in order without waiting a round trip per pipeline. The
broker builds the next pipeline while Redis works on the previous ones (the one-in-flight limit
measured in docs/benchmarks.md left the broker idle for each round trip).

The connection comes from redis-py's pool (so authentication, TLS and the database in the URL
apply), but the hot path packs RESP with hiredis, writes it to the connection's stream and feeds the
replies to the connection's own hiredis reader: redis-py's pipeline packing was 10 % of the
broker's CPU under load (docs/benchmarks.md, profile G), and its per-command write (a task and a
timer for ``wait_for``) and per-reply read (an ``asyncio.timeout``) were a third of the store
path at 1 000 msg/s, where every message travels in pipelines of its own. This reaches into
redis-py's connection (``_reader``, ``_writer``, ``_parser``), which is why redis is pinned;
tests/store/test_lane.py fails first if a release moves them.

A connection that fails is never written to again, because replies still owed on it could
otherwise be matched with the wrong pipeline: every pipeline sent on it fails, and the next one
goes out on a fresh connection.
"""

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import hiredis
import redis.asyncio
import redis.exceptions
from redis._parsers.hiredis import NOT_ENOUGH_DATA

from shoal_broker.stopping import cancel_and_wait

__all__ = ['CONNECTION_ERRORS', 'NOT_ENOUGH_DATA', 'Lane', 'pack', 'read_into_parser']

logger = logging.getLogger(__name__)

CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

Answer = Callable[[list[Any] | None, BaseException | None], None]
"""Called with (replies, None) or (None, error) the moment a pipeline's replies are read."""

READ_SIZE = 256 * 1024
WRITE_HIGH_WATER = 1024 * 1024
"""Bytes buffered for Redis past which ``send_then`` waits for the socket to drain."""


def pack(commands: Iterable[tuple[Any, ...]]) -> bytes:
    """RESP arrays of bulk strings for ``commands`` (tuples of str, bytes, int or float; anything
    else is a TypeError). hiredis packs in C: the Python packer this replaced cost ~13 µs against
    ~5 µs for the few small commands of a pipeline at a trickle."""
    return b''.join([hiredis.pack_command(command) for command in commands])


class Lane:
    """Sends pipelines on one connection and hands back each one's replies, in order."""

    def __init__(self, pool: 'redis.asyncio.ConnectionPool', max_in_flight: int) -> None:
        self._pool = pool
        self._max_in_flight = max_in_flight
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sent: collections.deque[tuple[int, Answer, Any]] = collections.deque()
        self._broken: set[Any] = set()
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._sent)

    async def wait_for_room(self) -> None:
        """Return once fewer than ``max_in_flight`` pipelines await their replies."""
        while len(self._sent) >= self._max_in_flight:
            self._room.clear()
            await self._room.wait()

    async def send_then(self, commands: Sequence[tuple[Any, ...]], answer: Answer) -> None:
        """Write one pipeline; ``answer`` gets its replies (error replies as exception objects)
        or the connection error that lost them, as soon as they are read: not one event-loop
        turn later through a future (at a trickle every message waited for those turns). A
        connection error while writing is raised, not answered. Call ``wait_for_room`` first to
        bound the pipelines in flight."""
        packed = pack(commands)
        if self._conn is None:
            self._conn = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        conn = self._conn
        try:
            if not conn.is_connected:
                await conn.connect()
            writer = conn._writer
            if writer.is_closing():
                raise redis.exceptions.ConnectionError('the Redis connection is closing')
            writer.write(packed)
            if writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                async with asyncio.timeout(conn.socket_timeout):
                    await writer.drain()
        except CONNECTION_ERRORS:
            await self._break(conn)
            raise
        self._sent.append((len(commands), answer, conn))
        self._readable.set()
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name='store-lane-replies')

    async def _read(self) -> None:
        while True:
            while not self._sent:
                self._readable.clear()
                await self._readable.wait()
            count, answer, conn = self._sent[0]
            try:
                if conn in self._broken:
                    raise redis.exceptions.ConnectionError('an earlier pipeline on it failed')
                replies = await _replies(conn, count)
            except Exception as exc:  # whatever it was, the replies are out of step now
                self._sent.popleft()
                _answer(answer, None, exc)
                await self._break(conn)
            else:
                self._sent.popleft()
                _answer(answer, replies, None)
            self._room.set()

    async def _break(self, conn: Any) -> None:
        """Stop using ``conn``; give it back to the pool once no reply is owed on it."""
        if conn is self._conn:
            self._conn = None
            self._broken.add(conn)
            await conn.disconnect(nowait=True)
        if conn in self._broken and not any(c is conn for _, _, c in self._sent):
            self._broken.discard(conn)
            await self._pool.release(conn)

    async def close(self) -> None:
        """Stop reading; pipelines still in flight fail; the connection goes back to the pool."""
        if self._reader is not None:
            await cancel_and_wait([self._reader])
            self._reader = None
        while self._sent:
            _, answer, _ = self._sent.popleft()
            _answer(answer, None, redis.exceptions.ConnectionError('store closing'))
        for conn in [*self._broken, *([self._conn] if self._conn is not None else [])]:
            await conn.disconnect(nowait=True)
            await self._pool.release(conn)
        self._broken.clear()
        self._conn = None


def _answer(answer: Answer, replies: list[Any] | None, error: BaseException | None) -> None:
    try:
        answer(replies, error)
    except Exception:  # the reader must go on: its replies are still in step
        logger.exception('handling a Redis reply failed')


async def _replies(conn: Any, count: int) -> list[Any]:
    """The next ``count`` replies on ``conn``; an error reply is returned as its exception
    object (it belongs to its command), a broken or silent connection raises."""
    parser = conn._parser._reader  # hiredis.Reader, created with the connection's error classes
    replies: list[Any] = []
    while len(replies) < count:
        reply = parser.gets()
        if reply is NOT_ENOUGH_DATA:
            await read_into_parser(conn, conn.socket_timeout)
            continue
        if isinstance(reply, redis.exceptions.ConnectionError):
            raise reply
        replies.append(reply)
    return replies


async def read_into_parser(conn: Any, silence_seconds: float | None) -> None:
    """Read what has arrived on redis-py connection ``conn`` into its hiredis reader; raise
    ``TimeoutError`` after ``silence_seconds`` of silence, ``ConnectionError`` at its end."""
    async with asyncio.timeout(silence_seconds):
        data = await conn._reader.read(READ_SIZE)
    if not data:
        raise redis.exceptions.ConnectionError('Redis closed the connection')
    conn._parser._reader.feed(data)
