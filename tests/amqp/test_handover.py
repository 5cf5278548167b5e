"""
At-most-once messages handed to a waiting at-most-once consumer without Redis
(``LocalSubscription.take``): what takes that path, that order holds where it meets the store,
and that a message waiting for credit goes to Redis rather than being lost.
"""

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import redis
from amqpclient import (
    Capabilities,
    Filter,
    Presettled,
    connect,
    flush,
    nothing_more,
    receive_all,
    receiver,
    sender,
)
from jmswire import SELECTOR
from processes import BrokerProcess, RedisServer, wait_for
from prometheus_client.parser import text_string_to_metric_families
from proton import Described, Message, Timeout, symbol
from proton.reactor import LinkOption

from shoal_broker.amqp.subscriptions import MAX_HELD
from shoal_broker.settings import RoutingSettings

HOLD_SECONDS = RoutingSettings().handover_hold_seconds


def _stored(redis_server: RedisServer, address: str) -> int:
    """How many entries the queue's streams were ever given (trimming does not lower it)."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        return sum(
            int(client.xinfo_stream(f'shoal:{{a:{address}}}:p:{band}')['entries-added'])
            for band in range(10)
        )
    finally:
        client.close()


def _counter(broker: BrokerProcess, name: str, **labels: str) -> float:
    status, body = broker.http_get('/metrics')
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def _pump(conn: Any, seconds: float) -> None:
    """Let the client do its I/O for a while."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=seconds)


def _send_presettled(conn: Any, address: str, bodies: range, **fields: Any) -> None:
    snd = sender(conn, address, Presettled())
    for body in bodies:
        snd.send(Message(body=body, **fields))
    flush(conn)  # a pre-settled send does not wait for the peer, so nothing wrote it out yet


def test_presettled_messages_to_a_waiting_presettled_consumer_never_reach_redis(
    broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    conn = connect(broker.url)
    rcv = receiver(conn, address, Presettled(), credit=50)
    assert nothing_more(rcv, wait=0.2)  # attached, and its first fetch found nothing
    _send_presettled(
        conn, address, range(20), subject='s', properties={'k': 'v'}, priority=7, durable=True
    )
    got = [rcv.receive(timeout=5) for _ in range(20)]
    assert [m.body for m in got] == list(range(20))
    assert {(m.subject, m.properties['k'], m.priority, m.durable) for m in got} == {
        ('s', 'v', 7, True)
    }
    assert not rcv.fetcher.unsettled  # sent settled, as from the store
    assert _stored(redis_server, address) == 0
    queue = {'address': address, 'subscription': 'queue'}
    assert _counter(broker, 'shoal_messages_enqueued_total', address=address) == 20
    assert _counter(broker, 'shoal_messages_delivered_total', **queue) == 20
    conn.close()


def test_stored_messages_go_first_then_handed_over_ones_in_order(
    broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    conn = connect(broker.url)
    _send_presettled(conn, address, range(10))  # nobody consumes yet: stored
    rcv = receiver(conn, address, Presettled(), credit=0)
    _send_presettled(conn, address, range(10, 20))  # a consumer, without credit: stored too
    wait_for(lambda: _stored(redis_server, address) == 20, 5, 'the first twenty stored')
    rcv.link.flow(25)  # one fetch takes the twenty and comes back short: five credits left
    first = [rcv.receive(timeout=5).body for _ in range(20)]
    _send_presettled(conn, address, range(20, 30))  # five handed over, five wait for credit
    rest = [rcv.receive(timeout=5).body for _ in range(10)]  # credit 1 at a time from here
    assert first + rest == list(range(30))
    assert nothing_more(rcv)
    assert 20 <= _stored(redis_server, address) < 30  # some never touched Redis
    conn.close()


def test_order_holds_while_a_slow_consumer_mixes_both_paths(
    broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    """A producer far ahead of a consumer with a prefetch of three: messages are handed over,
    held behind fetches, held for credit and sent to Redis (past MAX_HELD or HOLD_SECONDS),
    interleaved."""
    count = MAX_HELD + 1000
    conn = connect(broker.url)  # one connection: receiving also writes out what is sent
    rcv = receiver(conn, address, Presettled(), credit=3)
    assert nothing_more(rcv, wait=0.2)
    _send_presettled(conn, address, range(count))
    got = [rcv.receive(timeout=10).body for _ in range(count)]
    assert got == list(range(count))
    assert nothing_more(rcv)
    assert 0 < _stored(redis_server, address) < count
    conn.close()


def test_messages_waiting_for_credit_go_to_redis_and_are_not_lost(
    broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    conn = connect(broker.url)
    rcv = _wait_for_credit(conn, address)
    _send_presettled(conn, address, range(5))
    conn.wait(lambda: rcv.fetcher.has_message == 1, timeout=5)  # the other four wait for credit
    wait_for(lambda: _stored(redis_server, address) == 4, HOLD_SECONDS + 5, 'the four stored')
    rcv.close()
    other = receiver(conn, address, credit=10)  # an at-least-once consumer takes them
    assert [m.body for m in receive_all(other, 4)] == [1, 2, 3, 4]
    assert nothing_more(other)
    conn.close()


@pytest.mark.parametrize(
    ('consumer_options', 'fields', 'topic'),
    [
        pytest.param((), {}, False, id='consumer-settles'),
        pytest.param(
            (Presettled(), Filter({symbol('jms-selector'): Described(SELECTOR, "k = 'v'")})),
            {},
            False,
            id='consumer-with-selector',
        ),
        pytest.param((Presettled(),), {'ttl': 60.0}, False, id='message-with-ttl'),
        pytest.param((Presettled(), Capabilities('topic')), {}, True, id='topic'),
    ],
)
def test_what_an_at_least_once_consumer_a_filter_an_expiry_or_a_topic_needs_is_stored(
    broker: BrokerProcess,
    redis_server: RedisServer,
    address: str,
    consumer_options: tuple[LinkOption, ...],
    fields: dict[str, Any],
    topic: bool,
) -> None:
    conn = connect(broker.url)
    rcv = receiver(conn, address, *consumer_options, credit=10)
    assert nothing_more(rcv, wait=0.2)
    snd = sender(conn, address, Presettled(), *((Capabilities('topic'),) if topic else ()))
    for body in range(3):
        snd.send(Message(body=body, properties={'k': 'v'}, **fields))
    flush(conn)
    assert [rcv.receive(timeout=5).body for _ in range(3)] == [0, 1, 2]
    assert _stored(redis_server, address) == 3
    conn.close()


def _wait_for_credit(conn: Any, address: str) -> Any:
    """A pre-settled consumer granted one credit, whose fetch for it found nothing."""
    rcv = receiver(conn, address, Presettled(), credit=0)  # no prefetch: credit only as granted
    rcv.link.flow(1)
    _pump(conn, 0.2)
    return rcv


def test_a_stopped_replica_stores_what_it_held_for_credit(
    start_broker: Callable[..., BrokerProcess], redis_server: RedisServer, address: str
) -> None:
    b = start_broker(env={'SHOAL_HANDOVER_HOLD_SECONDS': '60'})
    conn = connect(b.url)
    rcv = _wait_for_credit(conn, address)
    _send_presettled(conn, address, range(5))
    conn.wait(lambda: rcv.fetcher.has_message == 1, timeout=5)
    _pump(conn, 0.5)
    assert _stored(redis_server, address) == 0  # the other four wait on the replica
    assert b.stop() == 0  # SIGTERM: a clean stop
    assert _stored(redis_server, address) == 4
    after = start_broker()
    other = connect(after.url)
    assert [m.body for m in receive_all(receiver(other, address, credit=10), 4)] == [1, 2, 3, 4]
    other.close()


def test_with_the_hand_over_off_every_message_goes_through_redis(
    start_broker: Callable[..., BrokerProcess], redis_server: RedisServer, address: str
) -> None:
    b = start_broker(env={'SHOAL_HANDOVER': 'false'})
    conn = connect(b.url)
    rcv = receiver(conn, address, Presettled(), credit=50)
    assert nothing_more(rcv, wait=0.2)
    _send_presettled(conn, address, range(20))
    assert [rcv.receive(timeout=5).body for _ in range(20)] == list(range(20))
    assert _stored(redis_server, address) == 20
    conn.close()
