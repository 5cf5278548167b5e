"""A fetch in bulk goes by hash with its plain read beside it (``Messages._fetch_op``): when
Redis has forgotten the scripts (``SCRIPT FLUSH``; a restart, a promoted replica that never
loaded them), the script is refused after the read claimed its entries. The fetch then fails
(sent again, it would read on and leave those entries claimed by no delivery), the scripts are
loaded again, and the recovery a failed fetch starts (``return_stranded``) gives every entry
back: each goes out once more."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from processes import RedisServer
from redisclusters import ClusterGroup
from startedstores import started_store

from shoal_broker.errors import StoreUnavailable
from shoal_broker.routing.storage import NORMAL_BAND, QUEUE_GROUP, Entry, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store import connect
from shoal_broker.store.redisstore import RedisStore


@pytest.fixture(params=['standalone', 'cluster'])
async def any_store(
    request: pytest.FixtureRequest, plain_redis: RedisServer, redis_cluster: ClusterGroup
) -> AsyncIterator[tuple[RedisStore, Any]]:
    """A store and a client of its Redis, a plain one or a Redis Cluster."""
    url = plain_redis.url if request.param == 'standalone' else redis_cluster.url
    client = connect.client_of_any_mode(url)
    async with started_store(url) as store:
        yield store, client
    await connect.close(client)


async def _publish(store: RedisStore, name: str, bodies: range) -> None:
    for i in bodies:
        message = OutgoingMessage(NORMAL_BAND, b'', b'%d' % i, 0, '')
        assert await store.messages.publish(name, AddressKind.QUEUE, message)


async def test_a_fetch_in_bulk_refused_for_a_forgotten_script_strands_nothing(
    any_store: tuple[RedisStore, Any],
) -> None:
    store, client = any_store
    name = f'bulk-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(name, AddressKind.QUEUE)
    await _publish(store, name, range(40))
    first = list(await store.messages.fetch(name, QUEUE_GROUP, 40))  # 40: bulk from now on
    await _publish(store, name, range(40, 80))
    await client.script_flush()  # on a cluster, every primary
    refused = None
    try:
        await store.messages.fetch(name, QUEUE_GROUP, 40)
    except StoreUnavailable as exc:
        refused = exc
    held = {(e.band, e.id) for e in first}  # still with their consumer
    returned = await store.messages.return_stranded(name, QUEUE_GROUP, held)
    again: list[Entry] = list(await store.messages.fetch(name, QUEUE_GROUP, 100))
    assert refused is not None
    assert 'No matching script' in str(refused)
    assert returned == 40  # what the refused fetch's read claimed
    assert sorted(int(e.rest) for e in again) == list(range(40, 80))
    assert {e.delivery_count for e in again} == {
        1
    }  # a failed attempt counted, as for any lost fetch
    assert [int(e.rest) for e in first] == list(range(40))
