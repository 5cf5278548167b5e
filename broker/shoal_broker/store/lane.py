"""
One Redis connection carrying the per-message pipelines, several of them in flight at once.

Redis runs one connection's commands in the order they arrive, so pipelines written one after
the other on one connection are applied in that order whether or not the previous replies have
come back: a producer's messages stay in order without waiting a round trip per pipeline. The
broker builds the next pipeline while Redis works on the previous ones (the one-in-flight limit
measured in docs/performance.md#store-lane left the broker idle for each round trip).

The connection comes from redis-py's pool (so authentication, TLS and the database in the URL
apply), but the hot path packs RESP with hiredis, writes it to the connection's stream and feeds the
replies to the connection's own hiredis reader: redis-py's pipeline packing was 10 % of the
broker's CPU under load (docs/performance.md#store-lane), and its per-command write (a task and a
timer for ``wait_for``) and per-reply read (an ``asyncio.timeout``) were a third of the store
path at 1 000 msg/s, where every message travels in pipelines of its own. Replies are read by a
protocol of the lane's own put on the connection's transport (``_Receiver``): a reader task woken
through redis-py's stream cost each message one more event-loop turn at a trickle; what the
bytes it reads hold is ``reply_reader.ReplyReader``'s to find. This reaches
into redis-py's connection (``_writer``, ``_parser``, its stream protocol), which is why redis
is pinned; tests/store/test_lane.py fails first if a release moves them.

A connection that fails is never written to again, because replies still owed on it could
otherwise be matched with the wrong pipeline: every pipeline sent on it fails, and the next one
goes out on a fresh connection. One taken from the pool is looked at first: Redis may have closed
it while it sat idle (``fresh_connection``).
"""

import asyncio
import collections
import gc
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import hiredis
import redis.asyncio
import redis.exceptions
from redis._parsers.hiredis import NOT_ENOUGH_DATA

from shoal_broker.store.reply_reader import READ_ENTRIES, ReplyReader, entry_reads
from shoal_broker.store.script_heads import with_heads

__all__ = [
    'BULK_HEADS', 'CONNECTION_ERRORS', 'CRLF', 'NOT_ENOUGH_DATA', 'READ_ENTRIES', 'Encoded',
    'Lane', 'encode', 'fresh_connection', 'pack', 'read_into_parser',
]  # fmt: skip

logger = logging.getLogger(__name__)

CONNECTION_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    redis.exceptions.InvalidResponse,
)
"""What makes a connection unusable. ``InvalidResponse``: what answered is not Redis (a dead
node's port taken by another server), which redis-py does not count as a connection error."""

Answer = Callable[[list[Any] | None, BaseException | None], None]
"""Called with (replies, None) or (None, error) the moment a pipeline's replies are read."""

FEED_BYTES = 16 * 1024
"""What the lane hands its hiredis reader at a time, reading the replies in it before the next
piece. The reader moves what it holds unread to the front of its buffer each time a reply it
returns leaves a kilobyte read behind, so a 256 KiB read of 1 KiB replies fed whole was copied
~100 times over: 2.2 µs a reply against 0.66 µs fed 16 KiB at a time (docs/performance.md,
"Replies fed in pieces"). ``read_into_parser`` reads that much at most for the same reason."""
WRITE_HIGH_WATER = 1024 * 1024
"""Bytes buffered for Redis past which ``send_then`` waits for the socket to drain."""

_SERIALS = itertools.count(1)


class Encoded:
    """The last arguments of a command, already RESP bulk strings: ``count`` of them, whose bytes
    are ``parts`` joined. A publish's per-message arguments are encoded this way as the messages
    are published (``BULK_HEADS``): hiredis took ~2.4 µs to pack one message's four arguments
    and this takes ~0.25 µs (docs/performance.md#encoded-arguments)."""

    __slots__ = ('apart', 'count', 'parts')

    def __init__(self, parts: list[bytes], count: int, apart: bool = False) -> None:
        self.parts = parts
        self.count = count
        self.apart = apart
        """Whether the parts are big enough to go to the socket as they are (``pieces``)."""


class _BulkHeads(dict[int, bytes]):
    """A bulk string's head (``$``, the length, CRLF) by length; those of lengths under
    CACHED_BULK_HEADS are kept once made."""

    def __missing__(self, length: int) -> bytes:
        head = b'$%d\r\n' % length
        if length < CACHED_BULK_HEADS:
            self[length] = head
        return head


CACHED_BULK_HEADS = 1 << 13
"""Heads kept for lengths under this: at most ~1 MiB of cache, however message sizes vary. A
longer value's head is made each time, ~0.15 µs beside copying 8 KiB or more."""
BULK_HEADS = _BulkHeads()
"""A bulk string is ``BULK_HEADS[len(value)]``, the value, then ``CRLF``."""
CRLF = b'\r\n'


def encode(*values: bytes) -> bytes:
    """``values`` as consecutive RESP bulk strings (for an ``Encoded``)."""
    return b''.join([BULK_HEADS[len(value)] + value + CRLF for value in values])


def pack(commands: Iterable[tuple[Any, ...]]) -> bytes:
    """RESP arrays of bulk strings for ``commands`` (tuples of str, bytes, int or float, the last
    of which may be ``Encoded``; anything else is a TypeError). hiredis packs in C: the Python
    packer this replaced cost ~13 µs against ~5 µs for the few small commands of a pipeline at a
    trickle. It spends ~0.6 µs on each argument, though, which a publish pays four times per
    message: that is what ``Encoded`` is for."""
    return b''.join(pieces(commands)[0])


def pieces(commands: Iterable[tuple[Any, ...]]) -> tuple[list[bytes], bool]:
    """``pack``'s bytes in pieces, and whether any ``Encoded`` among them is ``apart``: such a
    pipeline goes to the socket in its pieces (``writelines``, which the event loop writes with
    one ``writev``), so a big body is not copied once more into one ``bytes``
    (docs/performance.md#bytes-in-place)."""
    parts: list[bytes] = []
    apart = False
    for command in commands:
        last = command[-1] if command else None
        if type(last) is Encoded:
            head = hiredis.pack_command(command[:-1])
            # the array's length counts the encoded arguments too: *<n> replaced, the rest kept
            parts.append(b'*%d' % (len(command) - 1 + last.count) + head[head.index(CRLF) :])
            parts += last.parts
            apart = apart or last.apart
        else:
            parts.append(hiredis.pack_command(command))
    return parts, apart


class Lane:
    """Sends pipelines on one connection and hands back each one's replies, in order."""

    def __init__(self, pool: 'redis.asyncio.ConnectionPool', max_in_flight: int) -> None:
        self._pool = pool
        self._max_in_flight = max_in_flight
        self._conn: Any = None
        self._sent: collections.deque[tuple[int, Answer]] = collections.deque()
        """(command count, answer) of each pipeline in flight, all on ``_conn``: a connection
        given up on fails what it owed at once (``_lost``)."""
        self._partial: list[Any] = []
        """The replies read and not handed out yet: the first in ``_sent``'s so far, or of a
        pipeline whose write is still draining."""
        self._reader = ReplyReader()
        """What the replies on ``_conn`` are, one by one."""
        self._room = asyncio.Event()
        self._heard_at = 0.0
        """When the connection was last read from, or sent a pipeline with none owed."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._breaking: set[asyncio.Task[None]] = set()
        self._was_lost = False
        self.reconnects = 0
        """Pipelines written on a fresh connection after one was lost (a metric)."""
        self._transport: Any = None
        self.serial = 0
        """The number of the socket pipelines go out on, unique in this process. Read in an
        answer, it is that of the socket the replies came on: replies are answered only while
        their socket is the lane's. A fetch's entries wait for a replica's confirmation on the
        socket that claimed them (``confirming.py``)."""

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
        packed, count, answer, reads = _prepared(commands, answer)
        while self._conn is None:
            fresh = await fresh_connection(self._pool)
            if self._conn is None:
                self._conn = fresh
            else:  # another sender's got here first (ClusterLanes sends concurrently): one
                await self._give_back(fresh)  # connection, or replies go to the wrong pipeline
        conn = self._conn
        try:
            if not conn.is_connected:
                await conn.connect()
            writer = conn._writer
            if writer.is_closing():
                raise redis.exceptions.ConnectionError('the Redis connection is closing')
            transport = writer.transport
            if transport is not self._transport:
                self._transport = transport
                self.serial = next(_SERIALS)
            if not isinstance(transport.get_protocol(), _Receiver):
                transport.set_protocol(_Receiver(self, conn, transport.get_protocol()))
            if type(packed) is bytes:
                writer.write(packed)
            else:
                writer.writelines(packed)
            self._reader.written(count, reads)  # replies are read in a later loop turn
            if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await self._drain(conn, writer, transport)
        except CONNECTION_ERRORS as exc:
            self._lost(conn, exc)
            raise
        self._owe(conn, count, answer)

    def _owe(self, conn: Any, count: int, answer: Answer) -> None:
        """A pipeline written whole on ``conn`` is owed its replies."""
        if self._was_lost:
            self._was_lost = False
            self.reconnects += 1
        if not self._sent:
            self._heard_at = asyncio.get_running_loop().time()
        self._sent.append((count, answer))
        if self._partial and self._hand_out():  # its replies came while its write drained
            self._room.set()
        if self._watchdog is None and conn.socket_timeout:
            self._watchdog = asyncio.get_running_loop().call_later(
                conn.socket_timeout, self._check_silence, conn
            )

    async def _drain(self, conn: Any, writer: Any, transport: Any) -> None:
        """Wait until the socket has taken what is buffered for Redis. A cycle of thousands of
        publishes, each with its script's source, is a pipeline of tens of MB, which a healthy
        Redis reads as it runs it, for seconds on a busy machine: the connection is given up on
        only when, for a whole socket timeout, Redis has taken none of the buffer and answered
        nothing. A bound on the whole write failed every pipeline in flight on a Redis that was
        only busy (docs/redis-modes.md#timeouts-under-a-burst)."""
        timeout = conn.socket_timeout
        draining = asyncio.ensure_future(writer.drain())
        try:
            left, heard = transport.get_write_buffer_size(), self._heard_at
            while True:
                done, _ = await asyncio.wait((draining,), timeout=timeout or None)
                if done:
                    draining.result()
                    break
                now_left = transport.get_write_buffer_size()
                if now_left >= left and self._heard_at == heard:
                    raise redis.exceptions.TimeoutError(
                        f'Redis took none of {now_left} bytes written to it in {timeout} s'
                    )
                left, heard = now_left, self._heard_at
        finally:
            if not draining.done():
                draining.cancel()
        if conn is not self._conn:  # given up on meanwhile: nothing answers on it now
            raise redis.exceptions.ConnectionError(
                'the Redis connection was given up on while a pipeline was written'
            )

    def _received(self, conn: Any, data: bytes) -> None:
        """Replies arrived on ``conn``: answer every pipeline they complete, in order."""
        parser = conn._parser._reader  # hiredis.Reader, made with the connection's error classes
        if conn is not self._conn or parser is None:
            return  # a connection given up on: what it owed was answered with an error
        self._heard_at = asyncio.get_running_loop().time()  # silence is between reads, as before
        # no young collection while replies are parsed and answered: it would examine every
        # list of the replies in hand, all garbage a moment later (docs/performance.md,
        # "Entries the collector does not track")
        collecting = gc.isenabled()
        gc.disable()
        try:
            answered = self._read(conn, parser, data)
        except Exception as exc:  # a broken reply or stream: what follows cannot be matched
            self._lost(conn, exc)
            return
        finally:
            if collecting:
                gc.enable()
        if answered:
            self._room.set()

    def _read(self, conn: Any, parser: Any, data: bytes) -> bool:
        """Read the replies in ``data``, answering the pipelines they complete after each
        ``FEED_BYTES`` of it; True if any was. Replies are read even when no pipeline written so
        far is owed them yet: a pipeline past ``WRITE_HIGH_WATER`` is owed its replies only once
        its write drained, and Redis answers its first commands before that. Left in the parser
        meanwhile, MBs of replies were moved to the front of its buffer after every reply read
        later (docs/performance.md, "Replies fed in pieces")."""
        answered, pos, size = False, 0, len(data)
        while pos < size:
            if conn is not self._conn:
                return answered  # an answer gave the connection up: its replies were failed
            pos = self._reader.read(parser, data, pos, min(size, pos + FEED_BYTES), self._partial)
            answered = self._hand_out() or answered
        return answered

    def _hand_out(self) -> bool:
        """Answer the pipelines owed replies, in order, as far as the replies read go."""
        sent, answered = self._sent, False
        while sent and len(self._partial) >= sent[0][0]:
            count, answer = sent.popleft()
            replies = self._partial
            if len(replies) == count:
                self._partial = []
            else:
                self._partial = replies[count:]
                del replies[count:]
            _answer(answer, replies, None)
            answered = True
        return answered

    def _check_silence(self, conn: Any) -> None:
        """Give up on a connection that owes replies and has said nothing for its socket
        timeout (what ``asyncio.timeout`` around each read did before). A stall of the broker's
        own loop is not taken for silence: the loop polls its sockets before it runs the timers
        that fell due meanwhile (asyncio and uvloop alike), so replies that arrived during the
        stall are read first (tests/store/test_lane_busy.py)."""
        self._watchdog = None
        if not self._sent or conn is not self._conn:
            return
        silent = asyncio.get_running_loop().time() - self._heard_at
        if silent >= conn.socket_timeout:
            self._lost(conn, redis.exceptions.TimeoutError('Redis did not answer in time'))
        else:
            self._watchdog = asyncio.get_running_loop().call_later(
                conn.socket_timeout - silent, self._check_silence, conn
            )

    def _lost(self, conn: Any, error: BaseException) -> None:
        """Stop using ``conn``: every pipeline still owed a reply on it fails with ``error``
        (replies that came after could be matched with the wrong pipeline), what is buffered
        for it is dropped, and it goes back to the pool disconnected."""
        if conn is not self._conn:
            return
        self._conn = None
        self._was_lost = True
        self._partial = []
        self._reader = ReplyReader()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        owed, self._sent = self._sent, collections.deque()
        for _, answer in owed:
            _answer(answer, None, error)
        self._room.set()
        writer = conn._writer
        if writer is not None:  # what is still buffered for it is dropped, not written once a
            writer.transport.abort()  # frozen Redis wakes up (a close waits to write it all)
        task = asyncio.get_running_loop().create_task(self._give_back(conn))
        self._breaking.add(task)
        task.add_done_callback(self._breaking.discard)

    async def _give_back(self, conn: Any) -> None:
        try:
            await conn.disconnect(nowait=True)
        finally:
            await self._pool.release(conn)

    async def close(self) -> None:
        """Pipelines still in flight fail; the connection goes back to the pool."""
        if self._conn is not None:
            self._lost(self._conn, redis.exceptions.ConnectionError('store closing'))
        if self._breaking:
            await asyncio.gather(*self._breaking, return_exceptions=True)


class _Receiver(asyncio.Protocol):
    """Takes the place of redis-py's stream protocol on the lane's connection, so that replies
    are read in the loop turn they arrive in, with no reader task woken a turn later (one turn
    less per message at a trickle). Connection events still reach redis-py's protocol: its
    ``disconnect`` and ``drain`` rely on them. Nothing else reads from this connection."""

    def __init__(self, lane: Lane, conn: Any, inner: Any) -> None:
        self._lane, self._conn, self._inner = lane, conn, inner

    def data_received(self, data: bytes) -> None:
        self._lane._received(self._conn, data)

    def eof_received(self) -> bool | None:
        self._lane._lost(
            self._conn, redis.exceptions.ConnectionError('Redis closed the connection')
        )
        return bool(self._inner.eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self._lane._lost(self._conn, exc or redis.exceptions.ConnectionError('connection lost'))
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _answer(answer: Answer, replies: list[Any] | None, error: BaseException | None) -> None:
    try:
        answer(replies, error)
    except Exception:  # the reader must go on: its replies are still in step
        logger.exception('handling a Redis reply failed')


async def fresh_connection(pool: 'redis.asyncio.ConnectionPool') -> Any:
    """A connection of ``pool``, connected anew if Redis closed it while it sat idle (CLIENT
    KILL, the server's ``timeout``, a restart). Such a connection has had its end read, so its
    transport reads no more: a pipeline written there would hear nothing until the socket
    timeout (5 s by default) failed it, and the messages in it would be released. redis-py's pool
    ignores this check while maintenance notifications are configured (``auto``, its default,
    counts), since its own commands find the end and retry; the lane and ``packed.py`` write
    without redis-py, so they look themselves."""
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    if conn.is_connected:
        try:
            stale = await conn.can_read()  # its end was read, or replies left unread
        except CONNECTION_ERRORS:
            stale = True
        if stale:
            await conn.disconnect(nowait=True)  # the caller connects it
    return conn


async def read_into_parser(conn: Any, silence_seconds: float | None) -> None:
    """Read what has arrived on redis-py connection ``conn`` into its hiredis reader; raise
    ``TimeoutError`` after ``silence_seconds`` of silence, ``ConnectionError`` at its end."""
    async with asyncio.timeout(silence_seconds):
        data = await conn._reader.read(FEED_BYTES)
    if not data:
        raise redis.exceptions.ConnectionError('Redis closed the connection')
    conn._parser._reader.feed(data)


def _prepared(
    commands: Sequence[tuple[Any, ...]], answer: Answer
) -> tuple[bytes | list[bytes], int, Answer, list[int]]:
    """A pipeline's bytes (in pieces when ``pieces`` says so) and how many replies it has, each
    script that goes by source there more than once loaded at its head (``script_heads.py``),
    ``answer`` past the heads, and the positions of its ``READ_ENTRIES`` commands."""
    commands, heads = with_heads(commands)
    reads = entry_reads(commands)
    answered = _after_heads(heads, answer) if heads else answer
    parts, apart = pieces(commands)
    return parts if apart else b''.join(parts), len(commands), answered, reads


def _after_heads(heads: int, answer: Answer) -> Answer:
    """``answer`` given the replies after the first ``heads`` (``script_heads.py``'s loads)."""

    def answered(replies: list[Any] | None, error: BaseException | None) -> None:
        answer(None if replies is None else replies[heads:], error)

    return answered
