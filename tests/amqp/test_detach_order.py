"""
A plain (non-durable) topic subscriber's detach is answered once its subscription is deleted, as
a named subscription's is answered once it is unregistered: after ``close()`` returns, a message
published to the topic is stored for nobody. Redis is frozen (SIGSTOP) to hold the deletion
open, so the test runs on a Redis and broker of its own.
"""

import signal
import uuid
from collections.abc import Iterator

import pytest
import redis
from amqpclient import Capabilities, connect, flush, receiver
from processes import BrokerProcess, RedisServer
from proton import Endpoint, Timeout
from proton.utils import BlockingReceiver

TOPIC = Capabilities('topic')
TIMEOUT = 10.0
FROZEN_SECONDS = 1.0
"""How long the broker has to answer a detach it should not answer yet: it answers one that
needs no Redis within milliseconds."""


@pytest.fixture
def frozen_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.process.send_signal(signal.SIGCONT)  # a failed test may have left it stopped
    server.stop()


@pytest.fixture
def detaching_broker(frozen_redis: RedisServer) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(frozen_redis.url, replica_id='detaching')
    yield broker
    broker.stop()


def _subscriptions(server: RedisServer, address: str) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.scard(f'shoal:{{a:{address}}}:groups'))
    finally:
        client.close()


def _answered(sub: BlockingReceiver) -> bool:
    return bool(sub.link.state & Endpoint.REMOTE_CLOSED)


def test_a_topic_subscribers_detach_waits_for_its_subscription_to_go(
    frozen_redis: RedisServer, detaching_broker: BrokerProcess
) -> None:
    address = f'detach-{uuid.uuid4().hex[:8]}'
    conn = connect(detaching_broker.url)
    try:
        sub = receiver(conn, address, TOPIC, credit=5)
        assert _subscriptions(frozen_redis, address) == 1
        frozen_redis.process.send_signal(signal.SIGSTOP)
        try:
            sub.link.close()
            flush(conn)
            with pytest.raises(Timeout):  # no answer while the deletion waits for Redis
                conn.wait(lambda: _answered(sub), timeout=FROZEN_SECONDS)
        finally:
            frozen_redis.process.send_signal(signal.SIGCONT)
        conn.wait(lambda: _answered(sub), timeout=TIMEOUT, msg='the detach, Redis back')
        assert _subscriptions(frozen_redis, address) == 0
    finally:
        conn.close()
