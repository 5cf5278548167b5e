"""A started RedisStore for a test or a fixture, closed after it: the one place the store tests
spell its set-up and tear-down."""

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from shoal_broker.store.redisstore import RedisStore


@contextlib.asynccontextmanager
async def started_store(
    url: str, replica: str = 'replica', *args: Any
) -> AsyncIterator[RedisStore]:
    """A store on ``url`` whose replica id is ``replica`` with a suffix of its own, so that two
    fixtures' stores never share one; ``args`` go to ``RedisStore.from_url`` after the id
    (durability, its timeout)."""
    store = RedisStore.from_url(url, f'{replica}-{uuid.uuid4().hex[:6]}', *args)
    await store.start()
    try:
        yield store
    finally:
        await store.close()
