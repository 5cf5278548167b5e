"""
Session-wide real components: one redis-server on a free loopback port and broker processes.

Tests share brokers and isolate themselves by address names (``address`` fixture), so no test
flushes Redis under a running broker. Tests that need other broker settings start their own
with ``start_broker``; everything started is stopped by PID at the end.

``SHOAL_TEST_STORE=sentinel`` runs the same tests with the brokers on a Sentinel URL (a primary,
its replica and three sentinels; ``redis_server`` is then the primary, for tests that read Redis
directly): ``make test-sentinel`` runs the core functional modules that way.
``SHOAL_TEST_STORE=cluster`` does the same with a Redis Cluster of three primaries and three
replicas (``redis+cluster://``; ``redis_server`` is then one of its nodes, which answers MOVED for
keys of the others' slots): ``make test-cluster``, part of ``make test``.
"""

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from processes import LOG_DIR, BrokerProcess, RedisServer
from redisclusters import ClusterGroup
from sentinels import SentinelGroup

STORE_MODE = os.environ.get('SHOAL_TEST_STORE', 'standalone')


FAILURE_LOG_LINES = 60
"""Lines of each broker log a failed test's report ends with."""
FAILURE_LOGS = 4
"""At most this many logs, those written last."""
_SETUP_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report ends with the last lines of the broker logs written since its setup
    began: a failure seen once in CI is then read from what the brokers said, not guessed at."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if call.when == 'setup':
        item.stash[_SETUP_STARTED] = call.start
    if not report.failed or call.when == 'teardown':
        return
    since = item.stash.get(_SETUP_STARTED, call.start)
    written = []
    for path in LOG_DIR.glob('shoal-broker-*.log'):
        try:
            modified = path.stat().st_mtime
        except FileNotFoundError:
            continue
        if modified >= since:
            written.append((modified, path))
    for _, path in sorted(written)[-FAILURE_LOGS:]:
        lines = path.read_text(errors='replace').splitlines()[-FAILURE_LOG_LINES:]
        report.sections.append((f'broker log {path.name}, last lines', '\n'.join(lines)))


@pytest.fixture(scope='session', autouse=True)
def broker_logs() -> Iterator[None]:
    """The brokers' logs live as long as the test run."""
    yield
    shutil.rmtree(LOG_DIR, ignore_errors=True)


@pytest.fixture(scope='session')
def store_backend() -> Iterator[tuple[RedisServer, str]]:
    """The session's Redis (the primary, in sentinel mode; a node, in cluster mode) and the URL
    brokers are given."""
    if STORE_MODE == 'sentinel':
        group = SentinelGroup()
        yield group.servers[0], group.url
        group.stop()
    elif STORE_MODE == 'cluster':
        cluster = ClusterGroup()
        yield cluster.nodes[0], cluster.url
        cluster.stop()
    else:
        server = RedisServer()
        yield server, server.url
        server.stop()


@pytest.fixture(scope='session')
def redis_server(store_backend: tuple[RedisServer, str]) -> RedisServer:
    return store_backend[0]


@pytest.fixture(scope='session')
def store_url(store_backend: tuple[RedisServer, str]) -> str:
    return store_backend[1]


@pytest.fixture
def store_client(store_url: str) -> Iterator[Any]:
    """A synchronous client of the brokers' Redis in any store mode (on a cluster, each command
    goes to the node serving its key's slot)."""
    from shoal_broker.store import connect

    client = connect.sync_client_of_any_mode(store_url)
    yield client
    client.close()
    # a Sentinel URL's client asks its sentinels on connections of their own: closed here too,
    # or one is found unclosed later, failing whichever test the collector runs in
    manager = getattr(getattr(client, 'connection_pool', None), 'sentinel_manager', None)
    for sentinel in getattr(manager, 'sentinels', ()):
        sentinel.close()


@pytest.fixture(scope='session')
def broker(store_url: str) -> Iterator[BrokerProcess]:
    b = BrokerProcess(store_url, replica_id='replica-a')
    yield b
    b.stop()


@pytest.fixture(scope='session')
def second_broker(store_url: str, broker: BrokerProcess) -> Iterator[BrokerProcess]:
    """Another replica on the same Redis as ``broker``."""
    b = BrokerProcess(store_url, replica_id='replica-b')
    yield b
    b.stop()


@pytest.fixture
def start_broker(store_url: str) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def start(**kwargs: Any) -> BrokerProcess:
        kwargs.setdefault('redis_url', store_url)
        b = BrokerProcess(kwargs.pop('redis_url'), **kwargs)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def address(request: pytest.FixtureRequest) -> str:
    """A fresh address name for this test."""
    return f'{request.node.name[:40]}-{uuid.uuid4().hex[:8]}'
