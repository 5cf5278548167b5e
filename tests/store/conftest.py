"""What the store tests share: a started RedisStore and a plain client on the session's Redis,
and a Redis Cluster of three primaries and three replicas for the tests of the cluster's layout
and channels, with a cluster client of it and the per-node pools the store's lanes, channels and
commit records use."""

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio
from processes import RedisServer
from redisclusters import ClusterGroup
from startedstores import started_store

from shoal_broker.store import connect
from shoal_broker.store.notifications import PoolFor
from shoal_broker.store.redisstore import RedisStore


@pytest.fixture(scope='session')
def plain_redis(store_url: str, redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's Redis where it is one server to talk to (standalone, or the Sentinel
    group's primary); with the brokers on a Redis Cluster (SHOAL_TEST_STORE=cluster), whose
    nodes answer MOVED for most keys, a standalone server of its own."""
    if not store_url.startswith('redis+cluster'):
        yield redis_server
        return
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
async def store(plain_redis: RedisServer) -> AsyncIterator[RedisStore]:
    async with started_store(plain_redis.url) as s:
        yield s


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, for a test that counts what a background pass did: the
    session's brokers run their own upkeep (trims, backlog snapshots) on the session's Redis,
    and one of their trims would take what the test's was to count."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
async def own_store(own_redis: RedisServer) -> AsyncIterator[RedisStore]:
    async with started_store(own_redis.url) as s:
        yield s


@pytest.fixture
async def client(plain_redis: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(plain_redis.url)
    yield c
    await c.aclose()


@pytest.fixture(scope='session')
def redis_cluster() -> Iterator[ClusterGroup]:
    """Started once (a few seconds); a test that kills a node starts it again."""
    cluster = ClusterGroup()
    yield cluster
    cluster.stop()


@pytest.fixture
async def cluster_client(redis_cluster: ClusterGroup) -> AsyncIterator[redis.asyncio.RedisCluster]:
    client = connect.cluster_client(redis_cluster.url)
    await client.initialize()
    yield client
    await connect.close(client)


@pytest.fixture
def pool_for(redis_cluster: ClusterGroup) -> PoolFor:
    """A connection pool of one node of the cluster, as the store opens one for a primary."""
    url = redis_cluster.url
    return lambda host, port: connect.node_pool(url, host, port)
