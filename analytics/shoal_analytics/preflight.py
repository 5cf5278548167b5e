"""
What a command needs, checked before its JVM starts.

Spark takes many seconds to start, an unreachable Redis surfaces from inside the streaming query
as pages of JVM and Python tracebacks, and a lake that cannot be created fails deep in Hadoop's
file system layer. Checked first, each is one line naming the thing and the reason, and nothing
has been written.
"""

import os
from urllib.parse import urlsplit, urlunsplit

import redis

from shoal_analytics.errors import AnalysisError, AnalyticsError
from shoal_analytics.lake import Lake

CONNECT_TIMEOUT_SECONDS = 5


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
    """The URL without its password (options appear in plans and logs) and the password."""
    parts = urlsplit(redis_url)
    if parts.password is None:
        return redis_url, None
    host = parts.hostname or ''
    netloc = f'{host}:{parts.port}' if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc)), parts.password


def client(redis_url: str, *, decode_responses: bool = False) -> redis.Redis:
    """A client that gives up on an unreachable Redis after a few seconds, not minutes."""
    return redis.Redis.from_url(
        redis_url, decode_responses=decode_responses,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, socket_timeout=CONNECT_TIMEOUT_SECONDS,
    )  # fmt: skip


def unreachable(redis_url: str, exc: redis.RedisError) -> str:
    """The one line for a Redis that did not answer (the URL shown without its password)."""
    return f'cannot reach Redis at {split_password(redis_url)[0]}: {exc}'


def reachable_redis(redis_url: str) -> None:
    """Redis at ``redis_url`` answers a PING."""
    probe = client(redis_url)
    try:
        probe.ping()
    except redis.RedisError as exc:
        raise AnalyticsError(unreachable(redis_url, exc)) from exc
    finally:
        probe.close()
