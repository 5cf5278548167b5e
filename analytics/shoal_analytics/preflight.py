"""
What a command needs, checked before its JVM starts.

Spark takes many seconds to start, an unreachable Redis surfaces from inside the streaming query
as pages of JVM and Python tracebacks, and a lake that cannot be created fails deep in Hadoop's
file system layer. Checked first, each is one line naming the thing and the reason, and nothing
has been written.
"""

import os
import urllib.parse

import redis

from shoal_analytics.errors import AnalysisError, AnalyticsError
from shoal_analytics.lake import Lake
from shoal_broker.store.connect import SyncRedis, sync_client_of_any_mode

CONNECT_TIMEOUT_SECONDS = 5
REDIS_FAILURES = (redis.RedisError, redis.exceptions.RedisClusterException)
"""What an unreachable Redis raises; a Cluster client raises the second while it is created, as
it asks a seed for the slot map then."""


def writable_lake(lake: Lake) -> None:
    """The lake's directory exists (created if need be) and this process may write into it."""
    try:
        lake.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyticsError(f'cannot create the lake {lake.root}: {exc.strerror or exc}') from exc
    if not os.access(lake.root, os.W_OK | os.X_OK):
        raise AnalyticsError(f'cannot write into the lake {lake.root}: permission denied')


def ingested_lake(lake: Lake) -> None:
    """The lake holds raw records an ingest landed (Spark checks their content later)."""
    if not lake.raw.is_dir():
        raise AnalysisError(f'no raw metric records under {lake.raw}: run ingest first')
    writable_lake(lake)


def split_password(redis_url: str) -> tuple[str, str | None]:
    """The URL without its password (options appear in plans and logs) and the password. The
    user name stays; any of the URL forms (``redis://``, ``redis+sentinel://`` and
    ``redis+cluster://`` with several hosts) keeps its hosts as written."""
    scheme, sep, rest = redis_url.partition('://')
    netloc, slash, path = rest.partition('/')
    userinfo, at, hosts = netloc.rpartition('@')
    user, colon, password = userinfo.partition(':')
    if not (sep and at and colon):
        return redis_url, None
    kept = f'{user}@' if user else ''
    return f'{scheme}{sep}{kept}{hosts}{slash}{path}', urllib.parse.unquote(password)


def client(redis_url: str, *, decode_responses: bool = False) -> SyncRedis:
    """A client that gives up on an unreachable Redis after a few seconds, not minutes."""
    return sync_client_of_any_mode(
        redis_url, decode_responses=decode_responses,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, socket_timeout=CONNECT_TIMEOUT_SECONDS,
    )  # fmt: skip


def unreachable(redis_url: str, exc: Exception) -> str:
    """The one line for a Redis that did not answer (the URL shown without its password)."""
    return f'cannot reach Redis at {split_password(redis_url)[0]}: {exc}'


def reachable_redis(redis_url: str) -> None:
    """Redis at ``redis_url`` answers a PING."""
    try:
        probe = client(redis_url)
    except REDIS_FAILURES as exc:
        raise AnalyticsError(unreachable(redis_url, exc)) from exc
    try:
        probe.ping()
    except REDIS_FAILURES as exc:
        raise AnalyticsError(unreachable(redis_url, exc)) from exc
    finally:
        probe.close()
