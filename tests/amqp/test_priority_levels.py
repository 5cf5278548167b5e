"""
Ten JMS priority levels (docs/architecture.md, "Priority"): higher first, FIFO within a level,
on a queue and a shared subscription (durable and not) consumed from two replicas on one store,
on a plain topic subscriber, and through returns (a released or failed message goes back at
its own level, first within it). The producer is JMS-shaped: header.priority as Qpid JMS sets
it (left out at 4), durable.

The consumers take one message at a time, in turn on the two replicas, so the order they see
together is the order the store hands messages out: it must be strictly 9 to 0.
"""

import asyncio
import os
import signal
from collections.abc import Callable

import pytest
import redis
from amqpclient import Capabilities, connect, flush, receiver, sender, settle
from jmswire import JmsSource, durable_detach
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message
from proton.utils import BlockingConnection, BlockingReceiver

from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.store import keys
from shoal_broker.store.inspect import Inspector, QueueInfo

PRIORITIES = (1, 3, 0, 9, 5, 7, 2, 8, 4, 6)
"""Each round sends every level, interleaved."""
ROUNDS = 3
TOPIC = Capabilities('topic')
SHARED_DURABLE = JmsSource('topic', 'shared', 'global', durable=True)
FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}


def jms_message(body: str, priority: int) -> Message:
    """A PERSISTENT message as Qpid JMS encodes it: priority 4 is left out (the default)."""
    message = Message(body=body, durable=True)
    if priority != 4:
        message.priority = priority
    return message


def send_levels(conn: BlockingConnection, address: str, *options: Capabilities) -> list[str]:
    """Every level in every round, interleaved; returns the bodies ``<priority>-<round>`` in the
    order they must come out: 9 to 0, FIFO within a level."""
    snd = sender(conn, address, *options)
    for round_ in range(ROUNDS):
        for priority in PRIORITIES:
            snd.send(jms_message(f'{priority}-{round_}', priority))
    snd.close()
    return [f'{p}-{r}' for p in range(9, -1, -1) for r in range(ROUNDS)]


def take_in_turn(receivers: list[BlockingReceiver], count: int) -> list[tuple[int, Message]]:
    """One message on each receiver in turn (each asks for one credit when it has none), all
    accepted; returns (which receiver, message)."""
    got = []
    for n in range(count):
        which = n % len(receivers)
        rcv = receivers[which]
        got.append((which, rcv.receive(timeout=15)))
        rcv.accept()
    return got


def check_order(got: list[tuple[int, Message]], expected: list[str]) -> None:
    bodies = [m.body for _, m in got]
    assert sorted(bodies) == sorted(expected)  # every message, once
    assert bodies == expected  # strictly 9 -> 0, FIFO within a level
    assert {which for which, _ in got} == {0, 1}  # both replicas delivered
    for which in (0, 1):  # and each consumer's share is in order too
        mine = [m.body for w, m in got if w == which]
        assert mine == [b for b in expected if b in mine]


def test_ten_levels_of_a_queue_come_strictly_nine_to_zero_across_two_replicas(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    producer = connect(broker.url)
    expected = send_levels(producer, address)
    producer.close()
    conns = [connect(broker.url), connect(second_broker.url)]
    receivers = [receiver(c, address, credit=0) for c in conns]
    check_order(take_in_turn(receivers, len(expected)), expected)
    for conn in conns:
        conn.close()


def test_ten_levels_of_a_shared_durable_subscription_come_strictly_nine_to_zero(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    link = f'{address}|global'
    first = connect(broker.url)  # the subscription exists before anything is published
    durable_detach(first.create_receiver(address, credit=0, name=link, options=[SHARED_DURABLE]))
    producer = connect(second_broker.url)
    expected = send_levels(producer, address, TOPIC)
    producer.close()
    second = connect(second_broker.url)
    receivers = [
        c.create_receiver(address, credit=0, name=link, options=[SHARED_DURABLE])
        for c in (first, second)
    ]
    check_order(take_in_turn(receivers, len(expected)), expected)
    first.close()
    second.close()


def test_ten_levels_of_a_shared_volatile_subscription_come_strictly_nine_to_zero(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    """A non-durable shared subscription lives while a consumer is attached: the first one holds
    it, with no credit, while the messages are published."""
    link, source = f'{address}|global-volatile1', JmsSource('topic', 'shared', 'global')
    first = connect(broker.url)
    second = connect(second_broker.url)
    receivers = [
        c.create_receiver(address, credit=0, name=link, options=[source]) for c in (first, second)
    ]
    producer = connect(broker.url)
    expected = send_levels(producer, address, TOPIC)
    producer.close()
    check_order(take_in_turn(receivers, len(expected)), expected)
    first.close()
    second.close()


def test_ten_levels_reach_a_plain_topic_subscriber_strictly_nine_to_zero(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    rcv = conn.create_receiver(
        address, credit=0, name=f'plain-{address}', options=[JmsSource('topic')]
    )
    producer = connect(broker.url)
    expected = send_levels(producer, address, TOPIC)
    producer.close()
    got = take_in_turn([rcv], len(expected))
    assert [m.body for _, m in got] == expected
    conn.close()


def test_returned_messages_come_back_at_their_level_first_within_it(
    broker: BrokerProcess, second_broker: BrokerProcess, store_client: redis.Redis, address: str
) -> None:
    producer = connect(broker.url)
    expected = send_levels(producer, address)
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=0)
    held = [rcv.receive(timeout=15) for _ in range(5)]
    assert [m.body for m in held] == expected[:5]  # 9-0 9-1 9-2 8-0 8-1
    settle(rcv, Delivery.RELEASED)  # 9-0
    settle(rcv, Delivery.ACCEPTED)  # 9-1
    settle(rcv, Delivery.MODIFIED, failed=True)  # 9-2: a failed attempt
    settle(rcv, Delivery.RELEASED)  # 8-0
    settle(rcv, Delivery.ACCEPTED)  # 8-1
    flush(conn)
    returned = keys.AddressKeys.of(address).returned(QUEUE_GROUP)
    wait_for(lambda: store_client.zcard(returned) == 3, 10, 'the three returned in the store')
    # a new level-9 message after the returned ones: it comes after them
    snd = sender(producer, address)
    snd.send(jms_message('9-new', 9))
    producer.close()
    rest = ['9-0', '9-2', '9-new', '8-0', '8-2', *expected[6:]]
    other = connect(second_broker.url)
    receivers = [rcv, receiver(other, address, credit=0)]
    got = take_in_turn(receivers, len(rest))
    check_order(got, rest)
    counts = {m.body: m.delivery_count for _, m in got}
    assert (counts['9-0'], counts['9-2'], counts['8-0'], counts['9-new']) == (0, 1, 0, 0)
    conn.close()
    other.close()


def test_the_backlog_counts_every_level_ready_and_in_flight(
    broker: BrokerProcess, address: str, store_url: str
) -> None:
    """The backlog walk reads the bands in use only (backlog.lua): messages at 9, 4 and 0 all
    count, unread and then in flight."""
    producer = connect(broker.url)
    snd = sender(producer, address)
    for priority in (9, 4, 0, 0):
        snd.send(jms_message(f'{priority}', priority))

    def queue() -> QueueInfo:
        async def read() -> QueueInfo:
            async with Inspector.from_url(store_url) as inspector:
                return (await inspector.queues([address]))[0]

        return asyncio.run(read())

    unread = queue()
    assert (unread.backlog, unread.ready, unread.in_flight) == (4, 4, 0)
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=3)
    assert [rcv.receive(timeout=15).body for _ in range(3)] == ['9', '4', '0']
    held = queue()  # the replica may have fetched the fourth ahead of the credit
    assert held.backlog == 4
    assert held.in_flight >= 3
    assert held.ready + held.in_flight == 4
    conn.close()
    producer.close()


def test_a_killed_replicas_unsettled_messages_come_back_at_their_levels(
    start_broker: Callable[..., BrokerProcess], address: str, store_client: redis.Redis
) -> None:
    """The reaper reads only the bands in use (the default one and the levels SET): what a
    killed replica held at priorities 9, 4 and 0 comes back to a survivor, 9 -> 0, marked."""
    survivor = start_broker(env=FAST_LEASE)
    doomed = start_broker(env=FAST_LEASE)
    producer = connect(survivor.url)
    snd = sender(producer, address)
    for priority in (0, 4, 9):
        snd.send(jms_message(f'held-{priority}', priority))
    held = connect(doomed.url)
    rcv = receiver(held, address, credit=3)
    taken = [rcv.receive(timeout=15).body for _ in range(3)]
    assert taken == ['held-9', 'held-4', 'held-0']  # received, never settled
    doomed.process.send_signal(signal.SIGKILL)
    doomed.process.wait(timeout=5)
    returned = keys.AddressKeys.of(address).returned(QUEUE_GROUP)
    wait_for(lambda: store_client.zcard(returned) == 3, 30, 'the reaper returning all three')
    snd.send(jms_message('new-4', 4))
    conn = connect(survivor.url)
    after = receiver(conn, address, credit=4)
    got = [after.receive(timeout=30) for _ in range(4)]
    for _ in got:
        after.accept()
    # returned first within a level, each marked as delivered before
    assert [m.body for m in got] == ['held-9', 'held-4', 'new-4', 'held-0']
    assert [m.delivery_count for m in got] == [1, 1, 0, 1]
    conn.close()
    producer.close()


def test_traffic_at_one_priority_lists_no_other_level(
    broker: BrokerProcess, store_client: redis.Redis, address: str
) -> None:
    """The default priority's traffic leaves the address's levels SET empty: a fetch reads no
    other band (the fast path); one message at another level lists its band."""
    conn = connect(broker.url)
    snd = sender(conn, address)
    for n in range(5):
        snd.send(jms_message(f'4-{n}', 4))
    levels = keys.AddressKeys.of(address).levels
    assert store_client.smembers(levels) == set()
    snd.send(jms_message('7-0', 7))
    assert store_client.smembers(levels) == {b'2'}
    rcv = receiver(conn, address, credit=10)
    assert [rcv.receive(timeout=15).body for _ in range(6)] == ['7-0'] + [
        f'4-{n}' for n in range(5)
    ]
    rcv.accept()
    conn.close()


# -- the two-band layout of an older version, moved forward at start -----------------------------


def header(priority: int) -> bytes:
    """A header section as Qpid JMS sends it for a PERSISTENT message: durable, priority."""
    return b'\x00\x53\x70\xc0\x04\x02\x41\x50' + bytes([priority])


def amqp_value(text: str) -> bytes:
    data = text.encode()
    return b'\x00\x53\x77\xa1' + bytes([len(data)]) + data


@pytest.mark.skipif(
    os.environ.get('SHOAL_TEST_STORE', 'standalone') == 'cluster',
    reason='an older layout reaches a cluster only by import (test_cluster_migration.py)',
)
def test_a_two_band_backlog_is_moved_forward_at_start_and_consumed_in_order(
    start_broker, redis_server: RedisServer, address: str
) -> None:  # type: ignore[no-untyped-def]
    """An older version's two streams (priorities 0-4 and 5-9): some entries acknowledged, one
    out at a replica of the older version, one returned after a failed attempt, the rest unread.
    A broker of this version moves them into one stream per priority at start; a consumer gets
    every entry not acknowledged, strictly 9 to 0, FIFO within a level, the returned one with its
    delivery count."""
    first = start_broker()
    conn = connect(first.url)
    receiver(conn, address, credit=0).close()  # the queue exists, with its group
    conn.close()
    assert first.stop() == 0

    client = redis.Redis.from_url(redis_server.url)
    k = keys.AddressKeys.of(address)
    group = 'queue'
    client.delete(*k.streams, k.levels)
    normal, high = k.two_bands
    for stream in (normal, high):
        client.xgroup_create(stream, group, '0', mkstream=True)
    ids: dict[str, bytes] = {}
    for round_ in range(ROUNDS):
        for priority in PRIORITIES:
            body = f'{priority}-{round_}'
            stream = high if priority >= 5 else normal
            ids[body] = client.xadd(stream, {'h': header(priority), 'r': amqp_value(body)})
    # the older replica read the first four of the normal band (3-0, 1-0, 0-0, 2-0) and the
    # first of the high band (9-0): acknowledged 3-0 and 9-0, failed 1-0 once (returned), held
    # 0-0 and 2-0 when it stopped
    client.xreadgroup(group, 'older-replica', {normal: '>'}, count=4)
    client.xreadgroup(group, 'older-replica', {high: '>'}, count=1)
    client.xack(normal, group, ids['3-0'])
    client.xack(high, group, ids['9-0'])
    ms, seq = ids['1-0'].decode().split('-')
    client.zadd(k.returned(group), {f'0|{int(ms):015d}-{int(seq):010d}': 0})
    client.hset(k.delivery_counts(group), f'0|{ids["1-0"].decode()}', 1)
    client.close()

    newer = start_broker()
    consumed = {'3-0', '9-0'}
    expected = [f'{p}-{r}' for p in range(9, -1, -1) for r in range(ROUNDS)]
    expected = [b for b in expected if b not in consumed]
    conn = connect(newer.url)
    rcv = receiver(conn, address, credit=0)
    got = [rcv.receive(timeout=15) for _ in range(len(expected))]
    rcv.accept()
    assert [m.body for m in got] == expected
    counts = {m.body: m.delivery_count for m in got}
    assert (counts['1-0'], counts['0-0'], counts['2-0'], counts['1-1']) == (1, 0, 0, 0)
    conn.close()
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert not client.exists(normal, high)
        assert client.xlen(k.streams[9 - 7]) == ROUNDS  # priority 7's stream
    finally:
        client.close()
