"""What the store tests share: a started RedisStore and a plain client on the session's Redis,
and a Redis Cluster of three primaries and three replicas for the tests of the cluster's layout
and channels."""

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio
from processes import RedisServer
from redisclusters import ClusterGroup

from shoal_broker.store.redisstore import RedisStore


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    s = RedisStore.from_url(redis_server.url, f'replica-{uuid.uuid4().hex[:6]}')
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(redis_server.url)
    yield c
    await c.aclose()


@pytest.fixture(scope='session')
def redis_cluster() -> Iterator[ClusterGroup]:
    """Started once (about ten seconds); a test that kills a node starts it again."""
    cluster = ClusterGroup()
    yield cluster
    cluster.stop()
