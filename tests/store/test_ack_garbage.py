"""
Acknowledgements and fetches leave nothing for the cyclic garbage collector (``store/acks.py``,
``store/confirming.py``): an ack op's callback refers to the op (and so does a fetch's in
``replicated`` durability), and an op kept in that cycle once answered is freed only by a young
collection, which over 1 000 queues at 1 000 msg/s stalled the event loop 10-40 ms every few
seconds (docs/performance.md#ack-cycles). Real Redis: a primary, and a replica for the
``replicated`` durability's acks, whose callback waits for the replica's confirmation.
"""

import gc
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from processes import LOOPBACK, RedisServer, wait_for
from startedstores import started_store

from shoal_broker.routing.storage import QUEUE_GROUP, OutgoingMessage
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.store.ops import Op
from shoal_broker.store.redisstore import RedisStore

QUEUES = 20
MESSAGES = 5


@pytest.fixture(scope='module')
def replicated() -> Iterator[RedisServer]:
    """A primary with one replica, so that the store's WAIT is answered."""
    primary = RedisServer()
    replica = RedisServer(None, '--replicaof', LOOPBACK, str(primary.port))
    try:
        wait_for(replica.linked, 10, 'the replica linked')
        yield primary
    finally:
        replica.stop()
        primary.stop()


@pytest.fixture(params=[Durability.MEMORY, Durability.REPLICATED], ids=lambda d: d.value)
async def a_store(
    request: pytest.FixtureRequest, plain_redis: RedisServer, replicated: RedisServer
) -> AsyncIterator[RedisStore]:
    server = replicated if request.param is Durability.REPLICATED else plain_redis
    async with started_store(server.url, 'acks', request.param, 2000) as store:
        yield store


async def test_answered_acks_are_freed_without_the_cyclic_collector(a_store: RedisStore) -> None:
    names = [f'garbage-{uuid.uuid4().hex[:8]}' for _ in range(QUEUES)]
    fetched = []
    for name in names:
        await a_store.registry.create_address(name, AddressKind.QUEUE)
        for i in range(MESSAGES):
            message = OutgoingMessage(band=4, header=b'', rest=b'%d' % i, expiry_ms=0)
            assert await a_store.messages.publish(name, AddressKind.QUEUE, message) is True
        fetched.append((name, await a_store.messages.fetch(name, QUEUE_GROUP, MESSAGES)))
    gc.collect()  # what came before this test is not its concern
    gc.disable()
    try:
        for name, entries in fetched:
            assert len(entries) == MESSAGES
            for entry in entries:  # an ack op per queue and cycle
                a_store.messages.ack_nowait(name, QUEUE_GROUP, [entry])
        await a_store.flush()
        answers: list[tuple[object, object]] = []
        for name, _ in fetched:  # a consumer's fetch: in replicated durability, confirmed
            a_store.messages.fetch_then(
                name, QUEUE_GROUP, MESSAGES, lambda got, error: answers.append((got, error))
            )
        await a_store.flush()
        for name, _ in fetched:  # later cycles: the last one's ops leave its frames
            assert await a_store.messages.fetch(name, QUEUE_GROUP, MESSAGES) == []
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ops = [o for o in gc.garbage if isinstance(o, Op)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ops == []
    assert answers == [([], None)] * QUEUES
    for name, _ in fetched:  # and the acks applied: nothing is pending
        assert await a_store.messages.return_stranded(name, QUEUE_GROUP, set()) == 0
