"""The lane's socket timeout counts Redis's silence, not how long Redis is busy nor how long the
broker's own event loop was stalled: a pipeline of tens of MB that a healthy Redis works through
for seconds, or replies that arrived while the loop was busy, fail nothing; a frozen Redis is
still given up on, with an error that says what happened."""

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio
import redis.exceptions
import uvloop
from lanes import send
from processes import RedisServer
from startedstores import started_store

from shoal_broker.routing.storage import NORMAL_BAND, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store.calls import reason
from shoal_broker.store.lane import WRITE_HIGH_WATER, Lane

SOCKET_TIMEOUT = 0.3
BUSY = 'for i = 1, tonumber(ARGV[1]) do end return #ARGV[2]'
"""A script that keeps Redis busy a little, then answers with its padding's length."""
COMMANDS = 3000
PADDING = b'p' * 8192
"""3 000 commands of ~8 KiB: ~24 MiB, more than the loopback socket's buffers hold, so the
lane waits for Redis to read most of it."""
QUEUES = 3000
SPINS = 60_000
"""Lua loop turns per command: ~0.6 ms of Redis each, ~2 s for the pipeline, several times the
socket timeout."""


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: it is frozen."""
    server = RedisServer()
    yield server
    os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@contextlib.contextmanager
def starved(server: RedisServer, running: float = 0.01, stopped: float = 0.04) -> Iterator[None]:
    """Redis given ``running`` seconds of CPU in every ``running + stopped``, as on a machine
    whose other work leaves it little: slow, never silent for long (at most 60 s of it)."""
    done = threading.Event()

    def starve() -> None:
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            os.kill(server.process.pid, signal.SIGSTOP)
            time.sleep(stopped)
            os.kill(server.process.pid, signal.SIGCONT)
            time.sleep(running)

    thread = threading.Thread(target=starve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        os.kill(server.process.pid, signal.SIGCONT)


def _stall(seconds: float) -> None:
    """Hold the event loop, as a burst of work in the broker does."""
    time.sleep(seconds)


def _busy_pipeline() -> list[tuple[object, ...]]:
    return [('EVAL', BUSY, 0, SPINS, PADDING) for _ in range(COMMANDS)]


async def test_a_pipeline_redis_works_through_for_longer_than_the_socket_timeout_is_answered(
    own_redis: RedisServer,
) -> None:
    """Redis reads the pipeline as it runs it, for several socket timeouts in all: it is busy,
    not silent (the lane had bounded the whole write by the socket timeout and failed every
    pipeline in flight with a bare ``TimeoutError``)."""
    pool = redis.asyncio.ConnectionPool.from_url(own_redis.url, socket_timeout=SOCKET_TIMEOUT)
    lane = Lane(pool, max_in_flight=4)
    ahead = await send(lane, [('PING',)])
    started = time.monotonic()
    big = await send(lane, _busy_pipeline())
    behind = await send(lane, [('PING',)])
    assert await ahead == [b'PONG']
    assert await big == [len(PADDING)] * COMMANDS
    assert await behind == [b'PONG']
    assert time.monotonic() - started > SOCKET_TIMEOUT  # it did take longer than the timeout
    assert lane.reconnects == 0
    await lane.close()
    await pool.disconnect()


async def test_a_cycle_of_thousands_of_publishes_on_a_starved_redis_fails_none(
    own_redis: RedisServer,
) -> None:
    """Row e's burst in small: a cycle of a publish to each of thousands of queues is a pipeline
    of tens of MB (each publish carries its script's source), which a Redis short of CPU reads
    for longer than its socket timeout. Every publish is accepted."""
    async with started_store(f'{own_redis.url}?socket_timeout={SOCKET_TIMEOUT}') as store:
        names = [f'burst-{uuid.uuid4().hex[:8]}-{i}' for i in range(QUEUES)]
        await asyncio.gather(
            *(store.registry.create_address(name, AddressKind.QUEUE) for name in names)
        )
        body = OutgoingMessage(band=NORMAL_BAND, header=b'', rest=b'm' * 1024, expiry_ms=0)
        with starved(own_redis):
            accepted = await asyncio.gather(
                *(store.messages.publish(name, AddressKind.QUEUE, body) for name in names)
            )
        assert accepted == [True] * QUEUES
        assert store.cycles.lane.reconnects == 0


async def test_a_redis_frozen_while_a_pipeline_is_written_is_given_up_on_with_a_reason(
    own_redis: RedisServer,
) -> None:
    pool = redis.asyncio.ConnectionPool.from_url(own_redis.url, socket_timeout=SOCKET_TIMEOUT)
    lane = Lane(pool, max_in_flight=4)
    assert await (await send(lane, [('PING',)])) == [b'PONG']
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    with pytest.raises(redis.exceptions.TimeoutError) as raised:
        await asyncio.wait_for(send(lane, _busy_pipeline()), 10)
    assert str(raised.value).startswith('Redis took none of')
    os.kill(own_redis.process.pid, signal.SIGCONT)
    # the next pipeline goes out on a fresh connection
    key = f'lane-{uuid.uuid4().hex}'
    assert await (await send(lane, [('SET', key, 'v'), ('GET', key)])) == [b'OK', b'v']
    assert lane.reconnects == 1
    await lane.close()
    await pool.disconnect()


def test_replies_that_arrived_while_the_loop_was_stalled_are_read_not_timed_out(
    own_redis: RedisServer,
) -> None:
    """On uvloop, the broker's loop: a stall of the loop past the socket timeout is no silence of
    Redis's. The loop polls the socket before it runs the lane's overdue watchdog, which then
    finds the reply read."""

    async def stalled() -> list[object]:
        pool = redis.asyncio.ConnectionPool.from_url(own_redis.url, socket_timeout=SOCKET_TIMEOUT)
        lane = Lane(pool, max_in_flight=4)
        try:
            assert await (await send(lane, [('PING',)])) == [b'PONG']
            answered = await send(lane, [('PING',)])
            _stall(3 * SOCKET_TIMEOUT)  # the loop does nothing meanwhile: the reply waits
            return [await answered, lane.reconnects]
        finally:
            await lane.close()
            await pool.disconnect()

    assert uvloop.run(stalled()) == [[b'PONG'], 0]


def test_a_write_waiting_while_the_loop_was_stalled_is_not_timed_out(
    own_redis: RedisServer,
) -> None:
    """The same stall while a big pipeline waits to be written: Redis read what the socket held
    meanwhile and answered it, so the write goes on (a bound on the whole write failed it as soon
    as the loop ran again, with a ``TimeoutError`` that has no text)."""

    async def stalled() -> list[object]:
        pool = redis.asyncio.ConnectionPool.from_url(own_redis.url, socket_timeout=SOCKET_TIMEOUT)
        lane = Lane(pool, max_in_flight=4)
        loop = asyncio.get_running_loop()
        try:
            assert await (await send(lane, [('PING',)])) == [b'PONG']
            stall = loop.call_later(0.05, _stall, 3 * SOCKET_TIMEOUT)
            big = await send(lane, _busy_pipeline())
            stall.cancel()
            return [await big == [len(PADDING)] * COMMANDS, lane.reconnects]
        finally:
            await lane.close()
            await pool.disconnect()

    assert COMMANDS * len(PADDING) > 8 * WRITE_HIGH_WATER
    assert uvloop.run(stalled()) == [True, 0]


def test_an_error_with_no_text_is_named_by_its_type() -> None:
    """What follows "Redis unreachable: " in the log and in the refusal a client sees."""
    assert reason(TimeoutError()) == 'TimeoutError'
    assert reason(redis.exceptions.TimeoutError('Redis did not answer in time')) == (
        'Redis did not answer in time'
    )
