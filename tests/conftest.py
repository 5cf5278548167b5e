"""
Session-wide real components: one redis-server on a free loopback port and broker processes.

Tests share brokers and isolate themselves by address names (``address`` fixture), so no test
flushes Redis under a running broker. Tests that need other broker settings start their own
with ``start_broker``; everything started is stopped by PID at the end.
"""

import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from processes import LOG_DIR, BrokerProcess, RedisServer


@pytest.fixture(scope='session', autouse=True)
def broker_logs() -> Iterator[None]:
    """The brokers' logs live as long as the test run."""
    yield
    shutil.rmtree(LOG_DIR, ignore_errors=True)


@pytest.fixture(scope='session')
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope='session')
def broker(redis_server: RedisServer) -> Iterator[BrokerProcess]:
    b = BrokerProcess(redis_server.url, replica_id='replica-a')
    yield b
    b.stop()


@pytest.fixture(scope='session')
def second_broker(redis_server: RedisServer, broker: BrokerProcess) -> Iterator[BrokerProcess]:
    """Another replica on the same Redis as ``broker``."""
    b = BrokerProcess(redis_server.url, replica_id='replica-b')
    yield b
    b.stop()


@pytest.fixture
def start_broker(redis_server: RedisServer) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def start(**kwargs: Any) -> BrokerProcess:
        kwargs.setdefault('redis_url', redis_server.url)
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
