"""
Acknowledgements in ``replicated`` durability (``store/acks.py``), on a real Redis primary with a
real replica: an ack the replica has not confirmed stays held (a recovery does not return its
entry) and is sent again until the replica confirms it, within the store's hold bound; past the
bound it is given up. A fetch no replica confirmed is delivered only once one does, and a publish
is answered stored only once one does, never failed to be written again (``store/confirming.py``).
"""

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from processes import LOOPBACK, RedisServer, wait_for
from startedstores import started_store

from shoal_broker.errors import StoreUnavailable, StoreUnconfirmed, UnconfirmedPastHold
from shoal_broker.routing.storage import QUEUE_GROUP, Entry, OutgoingMessage
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.store import keys
from shoal_broker.store.redisstore import RedisStore

TIMEOUT_MS = 500
"""The store's ``WAIT`` timeout: short, so an unconfirmed ack is answered soon."""


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer()
    replica = RedisServer(None, '--replicaof', LOOPBACK, str(primary.port))
    try:
        wait_for(replica.linked, 10, 'the replica linked')
        wait_for(lambda: _confirms(primary), 10, 'the replica confirming writes')
        yield primary, replica
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)  # a stopped one must hear the stop
        replica.stop()
        primary.stop()


@pytest.fixture
async def store(primary_and_replica: tuple[RedisServer, RedisServer]) -> AsyncIterator[RedisStore]:
    primary, _ = primary_and_replica
    async with started_store(primary.url, 'r', Durability.REPLICATED, TIMEOUT_MS) as s:
        yield s


async def _one_stored(store: RedisStore) -> str:
    """A new queue holding one message, ``body``; its name."""
    name = f'acks-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(name, AddressKind.QUEUE)
    message = OutgoingMessage(band=0, header=b'', rest=b'body', expiry_ms=0)
    assert await store.messages.publish(name, AddressKind.QUEUE, message) is True
    return name


async def _one_fetched(store: RedisStore) -> tuple[str, Entry]:
    name = await _one_stored(store)
    (entry,) = await store.messages.fetch(name, QUEUE_GROUP, 10)
    return name, entry


def _confirms(primary: RedisServer) -> bool:
    client = redis.Redis(host=LOOPBACK, port=primary.port)
    try:
        client.set('confirms', 1)
        return int(client.execute_command('WAIT', 1, 1000)) >= 1
    finally:
        client.close()


def _pending(server: RedisServer, name: str) -> int:
    client = redis.Redis(host=LOOPBACK, port=server.port)
    try:
        stream = keys.AddressKeys.of(name).streams[0]
        return int(client.xpending(stream, QUEUE_GROUP)['pending'])
    finally:
        client.close()


def _kill_sockets(primary: RedisServer) -> None:
    """Close every client connection of ``primary``, as a failover does: between two probes
    (none in flight), and a blocking call, so no probe goes out before it is done."""
    killer = redis.Redis(host=LOOPBACK, port=primary.port)
    try:
        assert killer.client_kill_filter(_type='normal', skip_me=True) >= 1
    finally:
        killer.close()


async def _until(predicate: object, seconds: float) -> bool:
    for _ in range(int(seconds / 0.05)):
        if predicate():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


async def test_an_unconfirmed_ack_is_held_and_sent_again_until_the_replica_confirms_it(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    primary, replica = primary_and_replica
    name, entry = await _one_fetched(store)
    os.kill(replica.process.pid, signal.SIGSTOP)  # WAIT 1 confirms nothing meanwhile
    try:
        store.messages.ack_nowait(name, QUEUE_GROUP, [entry])
        assert await _until(lambda: _pending(primary, name) == 0, 5)  # applied on the primary
        await asyncio.sleep(3 * TIMEOUT_MS / 1000)  # a few WAITs time out
        assert store.messages.acks.held(name, QUEUE_GROUP) == {entry.key}
        # a recovery meanwhile leaves it alone: it is no stranded entry
        assert await store.messages.return_stranded(name, QUEUE_GROUP, set()) == 0
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert await _until(lambda: not store.messages.acks.held(name, QUEUE_GROUP), 10)
    assert store.messages.acks.given_up == 0
    assert _pending(replica, name) == 0  # the replica has it
    assert await store.messages.fetch(name, QUEUE_GROUP, 10) == []


async def test_an_ack_no_replica_confirms_within_the_bound_is_given_up_and_comes_back_counted(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    """The entry is pending again only if a failover undid the ack; here the primary keeps it,
    so a recovery finds nothing to return: the bound only ends the attempts."""
    _, replica = primary_and_replica
    store.messages.acks.confirm_seconds = 0.5
    name, entry = await _one_fetched(store)
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        store.messages.ack_nowait(name, QUEUE_GROUP, [entry])
        assert await _until(lambda: store.messages.acks.given_up == 1, 10)
        assert store.messages.acks.held(name, QUEUE_GROUP) == set()
        assert await store.messages.return_stranded(name, QUEUE_GROUP, set()) == 0
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)


async def test_acks_of_many_entries_are_confirmed_together(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    """Acks queued in one loop turn ride one pipeline with one WAIT."""
    primary, _ = primary_and_replica
    name = f'acks-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(name, AddressKind.QUEUE)
    for i in range(50):
        message = OutgoingMessage(band=0, header=b'', rest=b'%d' % i, expiry_ms=0)
        assert await store.messages.publish(name, AddressKind.QUEUE, message) is True
    entries = list(await store.messages.fetch(name, QUEUE_GROUP, 50))
    before = store.cycles.pipelines
    for entry in entries:
        store.messages.ack_nowait(name, QUEUE_GROUP, [entry])
    assert await _until(lambda: not store.messages.acks.held(name, QUEUE_GROUP), 10)
    assert store.cycles.pipelines - before == 1
    assert _pending(primary, name) == 0


async def test_a_fetch_no_replica_confirmed_is_delivered_once_one_does(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    """Its claim could be undone by a failover meanwhile (and with it a write no replica had):
    the entries wait for a replica, then go to the consumer."""
    _, replica = primary_and_replica
    name = await _one_stored(store)
    answers: list[tuple[object, object]] = []
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        store.messages.fetch_then(name, QUEUE_GROUP, 10, lambda f, e: answers.append((f, e)))
        assert await _until(lambda: store.messages.confirming.waiting == 1, 5)
        await asyncio.sleep(3 * TIMEOUT_MS / 1000)  # a few probes time out
        assert answers == []
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert await _until(lambda: bool(answers), 10)
    ((fetched, error),) = answers
    assert error is None
    assert [e.rest for e in fetched] == [b'body']  # type: ignore[attr-defined]
    assert store.messages.confirming.waiting == 0


async def test_a_fetch_whose_socket_is_lost_before_a_replica_confirms_it_is_never_delivered(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    """A fetch waiting for a replica whose socket is lost between two probes fails: the next
    probe goes out on another socket, after a failover to a new primary that may never have had
    the claim, so a replica confirming it says nothing of the fetch. The recovery returns the
    entry, counted."""
    primary, replica = primary_and_replica
    name = await _one_stored(store)
    answers: list[tuple[object, object]] = []
    lane = store.cycles.lane
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        store.messages.fetch_then(name, QUEUE_GROUP, 10, lambda f, e: answers.append((f, e)))
        assert await _until(lambda: store.messages.confirming.waiting == 1 and not lane.in_flight,
                            5)  # fmt: skip
        _kill_sockets(primary)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert await _until(lambda: bool(answers), 10)
    ((fetched, error),) = answers
    assert fetched is None
    assert isinstance(error, StoreUnavailable), error
    assert store.messages.confirming.waiting == 0
    assert await store.messages.return_stranded(name, QUEUE_GROUP, set()) == 1
    (entry,) = await store.messages.fetch(name, QUEUE_GROUP, 10)
    assert (entry.rest, entry.delivery_count) == (b'body', 1)


def _publish_then(store: RedisStore, name: str, answers: list[tuple[object, object]]) -> None:
    message = OutgoingMessage(band=0, header=b'', rest=b'body', expiry_ms=0)

    def answered(_: object, kept: object, error: object) -> None:
        answers.append((kept, error))

    store.messages.publish_then(name, AddressKind.QUEUE, message, answered, 'm')


def _stored(server: RedisServer, name: str) -> int:
    client = redis.Redis(host=LOOPBACK, port=server.port)
    try:
        return int(client.xlen(keys.AddressKeys.of(name).streams[0]))
    finally:
        client.close()


async def _new_queue(store: RedisStore) -> str:
    name = f'writes-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(name, AddressKind.QUEUE)
    return name


async def test_a_publish_no_replica_confirmed_is_answered_stored_once_one_does(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    """The message is in the stream on the primary: a replica confirming on the same socket
    confirms it, so it is answered as stored, never failed to be written again (a second copy
    once the replica is back)."""
    primary, replica = primary_and_replica
    name = await _new_queue(store)
    answers: list[tuple[object, object]] = []
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        _publish_then(store, name, answers)
        assert await _until(lambda: store.messages.confirming.writes_waiting == 1, 5)
        await asyncio.sleep(3 * TIMEOUT_MS / 1000)  # a few probes time out
        assert answers == []
        assert _stored(primary, name) == 1
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert await _until(lambda: bool(answers), 10)
    assert answers == [(True, None)]
    assert store.messages.confirming.writes_waiting == 0
    assert _stored(primary, name) == 1
    (entry,) = await store.messages.fetch(name, QUEUE_GROUP, 10)
    assert (entry.rest, entry.delivery_count) == (b'body', 0)


async def test_a_publish_whose_socket_is_lost_before_a_replica_confirms_it_fails_unavailable(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    """After a failover the socket that wrote it may have gone with the write: the publish fails
    ``StoreUnavailable`` (the hold writes it again), not answered stored on another primary's
    replica's word."""
    primary, replica = primary_and_replica
    name = await _new_queue(store)
    answers: list[tuple[object, object]] = []
    lane = store.cycles.lane
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        _publish_then(store, name, answers)
        assert await _until(
            lambda: store.messages.confirming.writes_waiting == 1 and not lane.in_flight, 5
        )
        _kill_sockets(primary)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert await _until(lambda: bool(answers), 10)
    ((kept, error),) = answers
    assert kept is None
    assert isinstance(error, StoreUnavailable), error
    assert not isinstance(error, StoreUnconfirmed), error
    assert store.messages.confirming.writes_waiting == 0


async def test_a_publish_no_replica_confirms_within_the_bound_is_rejected_not_held_again(
    store: RedisStore, primary_and_replica: tuple[RedisServer, RedisServer]
) -> None:
    _, replica = primary_and_replica
    store.messages.confirming.confirm_seconds = 1.0
    name = await _new_queue(store)
    answers: list[tuple[object, object]] = []
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        _publish_then(store, name, answers)
        assert await _until(lambda: bool(answers), 10)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    ((kept, error),) = answers
    assert kept is None
    assert isinstance(error, UnconfirmedPastHold), error  # rejected: not StoreUnavailable, held
    assert 'within 1 s' in str(error)
    assert store.messages.confirming.writes_waiting == 0
