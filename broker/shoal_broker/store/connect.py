"""
Redis connections from a URL: one standalone Redis, the primary that Redis Sentinel names, or a
Redis Cluster.

redis-py parses ``redis://``, ``rediss://`` and ``unix://`` URLs and finds and follows a
Sentinel-managed primary (``redis.asyncio.sentinel``), but it has no URL form for Sentinel.
Shoal takes the ``redis+sentinel`` form other Redis clients use (redis-sentinel-url, redisvl,
prefect-redis)::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?option=value...]
    rediss+sentinel://...    TLS to the Redis servers and to the sentinels alike

The hosts are the sentinels (port 26379 unless given), ``service`` is the name they monitor the
primary under. The user and password are the Redis servers' (as in a ``redis://`` URL); the
``sentinel_username`` and ``sentinel_password`` options authenticate to the sentinels, which
otherwise get no credentials. Every other option is a redis-py URL option (``ssl_ca_certs``,
``socket_timeout``, ...), parsed by redis-py, for the servers; the socket and TLS ones apply to the
sentinels too.

Written here, because redis-py does not do it: the URL form above, a sentinel pool that blocks
when it is exhausted like the standalone store's ``BlockingConnectionPool`` (redis-py's sentinel
pool refuses past its size), and listening for the sentinels' ``+switch-master`` announcement
(``follow_switches``, started by a sentinel pool's first connection): redis-py only looks for the
new primary when a connection fails or answers READONLY, and an old primary that is still up
(demoted, or cut off from the sentinels) keeps answering reads and pub/sub on the connections
already open to it.

Redis Cluster has no URL form in redis-py either (``RedisCluster.from_url`` takes one node of a
``redis://`` URL). Shoal takes a seed list in the same shape as the Sentinel form::

    redis+cluster://[[user]:password@]host[:port][,host[:port]...][?option=value...]
    rediss+cluster://...    TLS to every node

The hosts are seed nodes (port 6379 unless given): the client asks the first that answers for the
slot map and finds every other node from it. Only database 0 exists in a cluster, so a path other
than ``/`` or ``/0`` is refused. The options are the redis-py URL options a cluster client takes
(``socket_timeout``, ``ssl_ca_certs``, ...); one it does not take is refused by name, where
redis-py would drop it silently or fail on first use.
"""

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import logging
import urllib.parse
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
import redis.sentinel
from redis.asyncio.connection import (
    URL_QUERY_ARGUMENT_PARSERS,
    BlockingConnectionPool,
    ConnectionPool,
    parse_url,
)
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from shoal_broker.store.stale import CHECKED_POOL
from shoal_broker.store.waiting_cluster import WaitingCluster

logger = logging.getLogger(__name__)

SENTINEL_SCHEMES = {'redis+sentinel': False, 'rediss+sentinel': True}
"""Sentinel URL scheme -> whether its connections use TLS."""

SENTINEL_PORT = 26379

CLUSTER_SCHEMES = {'redis+cluster': False, 'rediss+cluster': True}
"""Cluster URL scheme -> whether its connections use TLS."""

CLUSTER_PORT = 6379

SWITCH_CHANNEL = '+switch-master'

RESUBSCRIBE_SECONDS = 1.0
"""Pause before listening to a sentinel again after losing it."""

SENTINEL_TIMEOUT_SECONDS = 2.0
"""Connect and reply timeout towards a sentinel, unless the URL sets ``socket_timeout`` or
``socket_connect_timeout``: a sentinel cut off without a reset must not hold up finding the
primary (redis-py asks the next one only after an error)."""

SLOT_MAP_SECONDS = 2.0
"""How long asking a cluster for its slot map may take. redis-py asks its known nodes one after
the other with no timeout of its own, so a node that is frozen (stopped, or cut off without a
reset) would hold the request, and every other one queued behind redis-py's lock, for ever."""

QUIET_SECONDS = 5.0
"""A sentinel's ``+switch-master`` channel silent this long is pinged; silent twice as long, it is
given up on and subscribed to again."""

switches_followed: collections.Counter[str] = collections.Counter()
"""Primary switches followed in this process, by service (a metric): each counted once, however
many pools (store, inspector) follow it."""
_primaries: dict[str, tuple[str, int]] = {}
"""The primary each service last switched to, as any pool of this process heard it."""

_SENTINEL_OPTIONS = ('sentinel_username', 'sentinel_password')
_SHARED_PREFIXES = ('socket_', 'ssl')
"""Options of the URL that apply to the sentinel connections too."""


@dataclasses.dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    tls: bool
    connection: dict[str, Any]
    """redis-py connection arguments for the Redis servers (db, credentials, options)."""
    sentinel: dict[str, Any]
    """redis-py connection arguments for the sentinels."""


def is_sentinel_url(url: str) -> bool:
    return url.partition('://')[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Raises ValueError for a URL that is not a usable Sentinel URL."""
    parts = _split_seed_url(url, SENTINEL_SCHEMES, 'Sentinel URL', SENTINEL_PORT, 'sentinel')
    tls, sentinels = parts.tls, parts.hosts
    if not sentinels:
        raise ValueError('a Sentinel URL needs at least one sentinel host')
    names = [urllib.parse.unquote(p) for p in parts.path.split('/') if p]
    if not names or len(names) > 2:
        raise ValueError('a Sentinel URL names the primary: .../<service>[/<db>]')
    options = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in options if k in _SENTINEL_OPTIONS}
    rest_query = urllib.parse.urlencode([(k, v) for k, v in options if k not in _SENTINEL_OPTIONS])
    # redis-py parses the credentials, the db and every option, as for a standalone URL
    standalone = parts.standalone(f'sentinel/{"/".join(names[1:])}?{rest_query}')
    connection: dict[str, Any] = dict(parse_url(standalone))
    for key in ('host', 'port', 'connection_class'):
        connection.pop(key, None)
    if tls:
        connection['ssl'] = True  # the sentinel pool picks its TLS connection class by this
    sentinel = {k: v for k, v in connection.items() if k.startswith(_SHARED_PREFIXES)}
    if 'sentinel_username' in own:
        sentinel['username'] = own['sentinel_username']
    if 'sentinel_password' in own:
        sentinel['password'] = own['sentinel_password']
    return SentinelUrl(sentinels, names[0], tls, connection, sentinel)


@dataclasses.dataclass(frozen=True)
class _SeedUrl:
    """What the Sentinel and Cluster URL forms share: a scheme that says TLS, the credentials of
    the Redis servers, and a list of hosts, each with a port or the default one."""

    tls: bool
    credentials: str
    """``user:password@`` as written, or empty."""
    hosts: tuple[tuple[str, int], ...]
    path: str
    query: str

    def standalone(self, rest: str) -> str:
        """A ``redis://`` (``rediss://``) URL with these credentials, for redis-py to parse the
        credentials and options as it does a standalone URL's."""
        return f'{"rediss" if self.tls else "redis"}://{self.credentials}{rest}'


def _split_seed_url(
    url: str, schemes: dict[str, bool], kind: str, default_port: int, member: str
) -> _SeedUrl:
    """Raises ValueError for another scheme or a bad host (``member`` names one in the error)."""
    scheme, sep, rest = url.partition('://')
    if not sep or scheme.lower() not in schemes:
        raise ValueError(f'not a {kind} (schemes: {", ".join(schemes)})')
    rest, _, query = rest.partition('?')
    netloc, _, path = rest.partition('/')
    userinfo, at, hosts = netloc.rpartition('@')
    found = tuple(_host_port(h, default_port, member) for h in hosts.split(',') if h)
    return _SeedUrl(schemes[scheme.lower()], userinfo + at, found, path, query)


def _host_port(member: str, default_port: int, what: str) -> tuple[str, int]:
    if member.startswith('['):  # [IPv6]:port
        host, _, port = member[1:].partition(']')
        port = port.removeprefix(':')
    else:
        host, _, port = member.partition(':')
    if not host:
        raise ValueError(f'bad {what} address {member!r}')
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f'bad {what} port in {member!r}') from None
    if not 0 < number < 65536:
        raise ValueError(f'bad {what} port in {member!r}')
    return host, number


@dataclasses.dataclass(frozen=True)
class ClusterUrl:
    nodes: tuple[tuple[str, int], ...]
    """The seed nodes, in the URL's order."""
    tls: bool
    connection: dict[str, Any]
    """redis-py cluster client arguments (credentials, TLS, socket options)."""


def is_cluster_url(url: str) -> bool:
    return url.partition('://')[0].lower() in CLUSTER_SCHEMES


_CLUSTER_TEXT_OPTIONS = frozenset(
    {'client_name', 'ssl_ca_certs', 'ssl_certfile', 'ssl_keyfile', 'ssl_cert_reqs', 'ssl_ciphers'}
)
"""Options taken as text (redis-py parses the others listed in URL_QUERY_ARGUMENT_PARSERS)."""

CLUSTER_OPTIONS = frozenset(
    name
    for name in inspect.signature(redis.asyncio.cluster.RedisCluster).parameters
    if name in URL_QUERY_ARGUMENT_PARSERS or name in _CLUSTER_TEXT_OPTIONS
) - {'db'}
"""URL options a cluster URL may carry: the redis-py URL options both cluster clients take."""


def parse_cluster_url(url: str) -> ClusterUrl:
    """Raises ValueError for a URL that is not a usable Redis Cluster URL."""
    parts = _split_seed_url(url, CLUSTER_SCHEMES, 'Redis Cluster URL', CLUSTER_PORT, 'cluster node')
    tls, nodes, path = parts.tls, parts.hosts, parts.path
    if not nodes:
        raise ValueError('a Redis Cluster URL needs at least one seed node: host[:port],...')
    if path.strip('/') not in ('', '0'):
        raise ValueError(f'Redis Cluster has only database 0, not {path.strip("/")!r}')
    options = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    unknown = sorted({name for name, _ in options} - CLUSTER_OPTIONS)
    if unknown:
        raise ValueError(
            f'option {", ".join(unknown)} is not one a Redis Cluster URL takes '
            f'({", ".join(sorted(CLUSTER_OPTIONS))})'
        )
    # redis-py parses the credentials and every option, as for a standalone URL
    standalone = parts.standalone(f'cluster/0?{parts.query}')
    connection: dict[str, Any] = dict(parse_url(standalone))
    for key in ('host', 'port', 'db', 'connection_class'):
        connection.pop(key, None)
    if tls:
        connection['ssl'] = True
    return ClusterUrl(nodes, tls, connection)


def _cluster_kwargs(parsed: ClusterUrl, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The caller's arguments a cluster client takes (a pool's ``timeout`` is not one: each
    node's pool is redis-py's own), then the URL's, which win."""
    taken = {k: v for k, v in kwargs.items() if k != 'timeout'}
    return {**taken, **parsed.connection}


def cluster_client(url: str, **kwargs: Any) -> WaitingCluster:
    """An asyncio cluster client for a ``redis+cluster://`` URL, following MOVED and ASK itself;
    a call finding every connection busy waits (``timeout`` s at most, waiting_cluster.py).
    ``kwargs`` are client arguments (the URL's options win). ValueError for an unusable URL."""
    parsed = parse_cluster_url(url)
    seeds = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in parsed.nodes]
    wait = {'wait_seconds': kwargs['timeout']} if kwargs.get('timeout') else {}
    return WaitingCluster(startup_nodes=seeds, **wait, **_cluster_kwargs(parsed, kwargs))


def sync_cluster_client(url: str, **kwargs: Any) -> redis.cluster.RedisCluster:
    """The synchronous cluster client for a ``redis+cluster://`` URL (a thread's own, such as the
    lease's)."""
    parsed = parse_cluster_url(url)
    seeds = [redis.cluster.ClusterNode(host, port) for host, port in parsed.nodes]  # type: ignore[no-untyped-call]
    return redis.cluster.RedisCluster(startup_nodes=seeds, **_cluster_kwargs(parsed, kwargs))


SyncRedis = redis.Redis | redis.cluster.RedisCluster
"""A synchronous client of any of the three modes."""


def sync_client_of_any_mode(url: str, **kwargs: Any) -> SyncRedis:
    """A synchronous client for a standalone, Sentinel or Cluster URL, for tools whose commands
    each name one key (the analytics job reads the metrics stream and writes one summary hash):
    a Cluster client sends each to the node serving the key's slot."""
    if is_cluster_url(url):
        return sync_cluster_client(url, **kwargs)
    return sync_client(url, **kwargs)


async def refresh_slot_map(cluster: 'redis.asyncio.cluster.RedisCluster') -> None:
    """Ask the cluster for its slot map again, giving up (``TimeoutError``, an ``OSError``)
    after ``SLOT_MAP_SECONDS``: the next attempt asks the nodes in another order."""
    async with asyncio.timeout(SLOT_MAP_SECONDS):
        await cluster.nodes_manager.initialize()


def node_pool(url: str, host: str, port: int, **kwargs: Any) -> ConnectionPool:
    """A connection pool to one node of the cluster of a ``redis+cluster://`` URL, with the
    URL's credentials, TLS and options: for connections that stay on one node (a sharded
    notification channel's, a node's pipeline lane)."""
    parsed = parse_cluster_url(url)
    arguments = {**CHECKED_POOL, **_cluster_kwargs(parsed, kwargs)}
    tls = arguments.pop('ssl', False)
    connection_class = redis.asyncio.SSLConnection if tls else redis.asyncio.Connection
    return ConnectionPool(connection_class=connection_class, host=host, port=port, **arguments)


def _not_cluster(url: str) -> None:
    if is_cluster_url(url):
        raise ValueError(
            'the store does not run on Redis Cluster yet (docs/redis-modes.md, "Redis Cluster"): '
            'a redis+cluster:// URL has no single connection pool'
        )


class _Following:
    """A sentinel pool that, from its first connection on, follows ``+switch-master`` announcements
    (``follow_switches``) until ``stop_following``: every long-lived user of a Sentinel URL (the
    store, the metrics' inspector, the operator's registry) moves at once, idle or not."""

    _follower: 'asyncio.Task[None] | None' = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._follower is None:
            pool = cast(SentinelConnectionPool, self)
            self._follower = asyncio.get_running_loop().create_task(
                follow_switches(pool), name='sentinel-switches'
            )
        return await super().get_connection(*args, **kwargs)  # type: ignore[misc]

    async def stop_following(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)


class SentinelPool(_Following, SentinelConnectionPool):
    """redis-py's sentinel pool (connections ask the sentinels for the primary when they
    connect), following switches."""


class BlockingSentinelPool(_Following, SentinelConnectionPool, BlockingConnectionPool):
    """The same, with the blocking pool's waiting for a free connection."""


def _sentinel_kwargs(parsed: SentinelUrl, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Connection arguments for the sentinels: short timeouts unless given, the socket options
    of the caller, then the URL's own."""
    sentinel_kwargs: dict[str, Any] = {
        'socket_connect_timeout': SENTINEL_TIMEOUT_SECONDS,
        'socket_timeout': SENTINEL_TIMEOUT_SECONDS,
    }
    sentinel_kwargs.update((k, v) for k, v in kwargs.items() if k.startswith('socket_'))
    sentinel_kwargs.update(parsed.sentinel)
    return sentinel_kwargs


def connection_pool(url: str, *, blocking: bool = False, **kwargs: Any) -> ConnectionPool:
    """A pool for ``url``; ``kwargs`` are pool and connection arguments (the URL's options win,
    as with redis-py's ``from_url``). Raises ValueError for a URL redis-py cannot use."""
    _not_cluster(url)
    if not is_sentinel_url(url):
        cls = BlockingConnectionPool if blocking else ConnectionPool
        return cls.from_url(url, **{**CHECKED_POOL, **kwargs})
    parsed = parse_sentinel_url(url)
    sentinel_kwargs = _sentinel_kwargs(parsed, kwargs)
    manager = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    pool_class = BlockingSentinelPool if blocking else SentinelPool
    return pool_class(parsed.service, manager, **{**CHECKED_POOL, **kwargs, **parsed.connection})


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A synchronous client for ``url`` (the lease's own thread). For a Sentinel URL it is
    redis-py's ``master_for``: each new connection asks the sentinels for the primary, and a
    connection that fails or answers READONLY is dropped, so the next command finds the new one;
    no ``+switch-master`` listener is needed for a client that sends a command every few
    seconds. A cluster URL is refused here: ``sync_cluster_client`` builds its client."""
    _not_cluster(url)
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **kwargs)
    parsed = parse_sentinel_url(url)
    sentinel_kwargs = _sentinel_kwargs(parsed, kwargs)
    manager = redis.sentinel.Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    primary: redis.Redis = manager.master_for(parsed.service, **{**kwargs, **parsed.connection})  # type: ignore[no-untyped-call]
    return primary


def follow_primary(sync: SyncRedis) -> None:
    """Ask the sentinels which server is the primary now, for a ``sync_client`` of a Sentinel
    URL (nothing for a standalone one); if it moved, redis-py drops the idle connections, so the
    next command goes to the new primary. A demoted primary that is still up keeps answering
    on a connection already open to it, so a long-lived client asks before each write that
    must reach the primary (one sentinel round trip per lease renewal)."""
    pool = getattr(sync, 'connection_pool', None)  # a cluster client has one per node
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        pool.get_master_address()  # type: ignore[no-untyped-call]


def client(url: str, **kwargs: Any) -> 'redis.asyncio.Redis':
    """A client owning a (non-blocking) pool for ``url``: ``aclose`` closes it (use ``close``
    to close a Sentinel URL's sentinel connections too). A cluster URL is refused here:
    ``cluster_client`` builds its client."""
    return redis.asyncio.Redis.from_pool(connection_pool(url, **kwargs))


def client_of_any_mode(url: str, **kwargs: Any) -> 'redis.asyncio.Redis':
    """An asyncio client for a standalone, Sentinel or Cluster URL (a cluster client sends each
    command to the node serving its key's slot, and a pipeline's commands to theirs)."""
    if is_cluster_url(url):
        # typed as a Redis: the commands the store sends are the same
        return cast('redis.asyncio.Redis', cluster_client(url, **kwargs))
    return client(url, **kwargs)


async def close(
    redis_client: 'redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster',
) -> None:
    """Close the client, its pool and, for a Sentinel pool, the sentinel connections (for a
    cluster client: its connections to every node)."""
    if isinstance(redis_client, redis.asyncio.cluster.RedisCluster):
        await redis_client.aclose()
        return
    pool = redis_client.connection_pool
    if isinstance(pool, _Following):
        await pool.stop_following()
    try:
        await redis_client.aclose()
    finally:
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


async def follow_switches(pool: SentinelConnectionPool) -> None:
    """Listen to every sentinel for ``+switch-master`` of the pool's service; on the first
    announcement of a new primary, drop every connection of the pool (in use or idle), so each
    connects again to the primary the sentinels now name. Runs until cancelled."""
    state = _SwitchState(pool)
    listeners = [
        asyncio.create_task(_listen(sentinel, state), name='sentinel-switch')
        for sentinel in pool.sentinel_manager.sentinels
    ]
    try:
        await asyncio.gather(*listeners)
    finally:
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)


class _SwitchState:
    def __init__(self, pool: SentinelConnectionPool) -> None:
        self.pool = pool
        self.followed: tuple[str, int] | None = None
        """The last primary switched to: every sentinel announces the same switch."""

    async def announced(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        parts = text.split()  # <service> <old ip> <old port> <new ip> <new port>
        if len(parts) != 5 or parts[0] != self.pool.service_name:
            return
        new = (parts[3], int(parts[4]))
        if new == self.followed:
            return
        self.followed = new
        if _primaries.get(parts[0]) != new:
            _primaries[parts[0]] = new
            switches_followed[parts[0]] += 1
        logger.warning(
            'Redis Sentinel switched %s to %s:%d; reconnecting', parts[0], new[0], new[1]
        )
        with contextlib.suppress(*_DOWN):
            await self.pool.disconnect(inuse_connections=True)


_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


async def _listen(sentinel: 'redis.asyncio.Redis', state: _SwitchState) -> None:
    loop = asyncio.get_running_loop()
    while True:
        pubsub = sentinel.pubsub()
        try:
            await pubsub.subscribe(SWITCH_CHANNEL)
            heard = loop.time()
            while True:
                message = await pubsub.get_message(timeout=QUIET_SECONDS)
                if message is None:  # quiet: ping, and give up once even that went unanswered
                    if loop.time() - heard >= 2 * QUIET_SECONDS:
                        raise TimeoutError('the sentinel went silent')
                    await pubsub.ping()
                    continue
                heard = loop.time()  # a confirmation, a pong or an announcement
                if message.get('type') == 'message':
                    await state.announced(message['data'])
        except _DOWN as exc:
            logger.debug('sentinel channel lost: %s', exc)
        finally:
            with contextlib.suppress(*_DOWN):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        await asyncio.sleep(RESUBSCRIBE_SECONDS)
