"""Prometheus metrics on the broker's HTTP endpoint, after real traffic."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from amqpclient import Capabilities, connect, flush, receive_all, receiver, send_all, settle
from jmswire import JmsSource, jms_connect, subscriber
from metricrecords import metric_records
from processes import BrokerProcess, RedisServer
from prometheus_client.parser import text_string_to_metric_families
from proton import Delivery, Timeout
from proton.utils import BlockingReceiver

from shoal_broker.metrics.records import MetricRecord


def _samples(broker: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = broker.http_get('/metrics')
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(samples, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_message_counters_latency_and_gauges_follow_the_traffic(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_DEAD_LETTER_ADDRESS': f'{address}-dlq'})
    conn = connect(b.url)
    send_all(conn, address, range(4))
    rcv = receiver(conn, address, credit=10)
    receive_all(rcv, 2)  # accepted
    rcv.receive(timeout=5)
    settle(rcv, Delivery.RELEASED)
    rcv.receive(timeout=5)
    settle(rcv, Delivery.REJECTED)
    receive_all(rcv, 1)  # the released one again
    samples = _samples(b)
    queue = {'address': address, 'subscription': 'queue'}
    assert _value(samples, 'shoal_messages_enqueued_total', address=address) == 4
    assert _value(samples, 'shoal_messages_delivered_total', **queue) == 5
    assert _value(samples, 'shoal_deliveries_settled_total', outcome='accepted', **queue) == 3
    assert _value(samples, 'shoal_deliveries_settled_total', outcome='released', **queue) == 1
    assert _value(samples, 'shoal_deliveries_settled_total', outcome='rejected', **queue) == 1
    assert _value(samples, 'shoal_messages_dead_lettered_total', **queue) == 1
    assert _value(samples, 'shoal_delivery_latency_seconds_count', **queue) == 3
    assert _value(samples, 'shoal_connections') == 1
    assert _value(samples, 'shoal_consumers', **queue) == 1
    assert _value(samples, 'shoal_links', role='consumer') == 1
    assert _value(samples, 'shoal_replica_lease_up') == 1
    assert _value(samples, 'shoal_redis_pipeline_seconds_count') > 0
    conn.close()


def test_backlog_gauges_count_unconsumed_messages(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    # refreshed in the background (every 10 s by default): often here, so the wait is short
    b = start_broker(env={'SHOAL_BACKLOG_REFRESH_SECONDS': '0.5'})
    conn = connect(b.url)
    send_all(conn, address, range(3))
    deadline = time.monotonic() + 15
    labels = {'address': address, 'subscription': 'queue'}
    while time.monotonic() < deadline:
        if _value(_samples(b), 'shoal_backlog_messages', **labels) == 3:
            break
        time.sleep(0.5)
    assert _value(_samples(b), 'shoal_backlog_messages', **labels) == 3
    conn.close()


def test_in_flight_and_oldest_age_gauges_follow_deliveries_awaiting_their_outcome(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    """Unsettled deliveries are in flight (and still backlog) until settled, the oldest one's
    age grows while it waits; an hour's wait has a latency bucket of its own."""
    b = start_broker(env={'SHOAL_BACKLOG_REFRESH_SECONDS': '0.2'})
    conn = connect(b.url)
    send_all(conn, address, range(2))
    rcv = receiver(conn, address, credit=2)
    rcv.receive(timeout=5)
    rcv.receive(timeout=5)  # both left unsettled
    queue = {'address': address, 'subscription': 'queue'}

    def gauges() -> tuple[float, float]:
        samples = _samples(b)
        in_flight = _value(samples, 'shoal_in_flight_messages', **queue)
        return in_flight, _value(samples, 'shoal_backlog_messages', **queue)

    deadline = time.monotonic() + 15
    while (seen := gauges()) != (2, 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert seen == (2, 2)
    settle(rcv, Delivery.ACCEPTED)
    flush(conn)
    deadline = time.monotonic() + 15
    while (seen := gauges()) != (1, 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert seen == (1, 1)
    # the unsettled one waits: its age grows from its enqueue, not from the last refresh
    age = _value(_samples(b), 'shoal_oldest_message_age_seconds', **queue)
    time.sleep(1.0)
    later = _value(_samples(b), 'shoal_oldest_message_age_seconds', **queue)
    assert 0 < age < later < 60
    settle(rcv, Delivery.ACCEPTED)
    flush(conn)
    deadline = time.monotonic() + 15
    while (seen := gauges()) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _value(_samples(b), 'shoal_oldest_message_age_seconds', **queue) == 0
    assert ('shoal_oldest_message_age_seconds', tuple(sorted(queue.items()))) in _samples(b)
    buckets = {
        dict(labels).get('le')
        for name, labels in _samples(b)
        if name == 'shoal_delivery_latency_seconds_bucket' and ('address', address) in labels
    }
    assert {'0.001', '1.0', '3300.0', '3600.0', '+Inf'} <= buckets
    conn.close()


def test_dead_lettering_and_latency_name_the_topic_subscription(
    start_broker, redis_server, address: str
) -> None:  # type: ignore[no-untyped-def]
    """On a topic the subscription is known: which one rejects, which one is slow."""
    b = start_broker(env={'SHOAL_DEAD_LETTER_ADDRESS': f'{address}-dlq'})
    topic, name = f'{address}-t', f'{address}-sub'
    source = JmsSource('topic', 'shared', 'global', durable=True)
    consumer = jms_connect(b.url)
    rcv = subscriber(consumer, topic, f'{name}|global', source, credit=2)
    publisher = connect(b.url)
    send_all(publisher, topic, range(2), Capabilities('topic'))
    rcv.receive(timeout=5)
    settle(rcv, Delivery.ACCEPTED)
    rcv.receive(timeout=5)
    settle(rcv, Delivery.REJECTED)
    flush(consumer)
    listed = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', redis_server.url,
         'subscriptions', '--json'],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    [subscription] = [s['id'] for s in json.loads(listed.stdout) if s['name'] == name]
    labels = {'address': topic, 'subscription': subscription}
    deadline = time.monotonic() + 15
    while _value(_samples(b), 'shoal_messages_dead_lettered_total', **labels) != 1:
        assert time.monotonic() < deadline, 'no dead-lettering counted for the subscription'
        time.sleep(0.2)
    samples = _samples(b)
    assert _value(samples, 'shoal_delivery_latency_seconds_count', **labels) == 1
    assert _value(samples, 'shoal_messages_dead_lettered_total', address=topic) == 0  # no bare
    consumer.close()
    publisher.close()


def _until(broker: BrokerProcess, name: str, value: float, seconds: float) -> float:
    """The gauge's value once it reads VALUE, or its last value after SECONDS."""
    deadline = time.monotonic() + seconds
    while (seen := _value(_samples(broker), name)) != value and time.monotonic() < deadline:
        time.sleep(0.2)
    return seen


@pytest.fixture
def own_redis() -> Iterator[list[RedisServer]]:
    """A Redis of the test's own (a list, so the test may replace it), stopped after the
    brokers the test started (request it before ``start_broker``)."""
    servers = [RedisServer()]
    yield servers
    servers[-1].stop()


def test_redis_up_gauge_drops_while_redis_is_gone_and_comes_back_with_it(
    own_redis: list[RedisServer], start_broker
) -> None:  # type: ignore[no-untyped-def]
    """The series the ShoalRedisUnreachable alert watches (charts/shoal/files/prometheus-rules)."""
    b = start_broker(redis_url=own_redis[0].url, env={'SHOAL_LEASE_SECONDS': '1.5'})
    assert _value(_samples(b), 'shoal_redis_up') == 1
    own_redis[0].stop()
    assert _until(b, 'shoal_redis_up', 0, 15) == 0
    own_redis.append(RedisServer(own_redis[0].port))
    assert _until(b, 'shoal_redis_up', 1, 15) == 1


def test_each_replica_appends_interval_records_to_the_metrics_stream(
    start_broker, redis_server, address: str
) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_METRICS_INTERVAL_SECONDS': '0.5'}, replica_id='recorder')
    conn = connect(b.url)
    send_all(conn, address, range(5))
    receive_all(receiver(conn, address, credit=10), 5)
    mine: list[MetricRecord] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(r.accepted for r in mine) < 5:
        time.sleep(0.5)
        mine = metric_records(
            redis_server.url,
            lambda f: (f.get('replica'), f.get('address')) == ('recorder', address),
        )
    assert sum(r.enqueued for r in mine) == 5
    assert sum(r.delivered for r in mine) == 5
    assert sum(r.accepted for r in mine) == 5
    assert sum(n for r in mine for _, n in r.latency_sketch) == 5
    assert {r.subscription for r in mine} == {'queue'}
    conn.close()


def _records(redis_url: str, address_prefix: str) -> list[MetricRecord]:
    return metric_records(redis_url, lambda f: f.get('address', '').startswith(address_prefix))


def test_idle_queues_and_the_dead_letter_queue_get_a_record_every_interval_from_one_replica(
    own_redis: list[RedisServer], start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    """A DLQ nobody reads and a backlog nobody consumes appear in every interval, written once
    (by the live replica with the smallest id), not only when a replica sees activity."""
    url = own_redis[0].url
    dlq, idle = f'{address}-dlq', f'{address}-idle'
    env = {'SHOAL_METRICS_INTERVAL_SECONDS': '0.5', 'SHOAL_METRICS_HEARTBEAT_SECONDS': '0.5',
           'SHOAL_DEAD_LETTER_ADDRESS': dlq}  # fmt: skip
    first = start_broker(redis_url=url, env=env, replica_id='aa-first')
    second = start_broker(redis_url=url, env=env, replica_id='zz-second')
    conn = connect(second.url)
    send_all(conn, idle, range(2))
    send_all(conn, address, range(1))
    rcv = receiver(conn, address, credit=1)
    rcv.receive(timeout=5)
    settle(rcv, Delivery.REJECTED)  # to the DLQ, which has no consumer
    conn.close()
    quiet_from = time.time() * 1000 + 1000  # once the last active interval has passed
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        later = [r for r in _records(url, address) if r.ts_ms > quiet_from]
        if {r.address for r in later if r.ts_ms > quiet_from + 1500} >= {dlq, idle}:
            break
        time.sleep(0.5)
    for entity, held in ((dlq, 1), (idle, 2), (address, 0)):
        mine = [r for r in later if r.address == entity]
        assert len(mine) >= 3, (entity, mine)
        assert {r.replica for r in mine} == {'aa-first'}
        assert {r.backlog for r in mine} == {held}
        assert {r.subscription for r in mine} == {'queue'}
    # the first replica gone, the next one writes them
    first.stop()
    handed_over = time.time() * 1000
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        after = [r for r in _records(url, dlq) if r.ts_ms > handed_over]
        if len(after) >= 2:
            break
        time.sleep(0.5)
    assert {r.replica for r in after} == {'zz-second'}
    assert {r.backlog for r in after} == {1}


def test_an_unchanged_quiet_queue_waits_for_its_heartbeat_and_a_changed_one_is_recorded_at_once(
    own_redis: list[RedisServer], start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    """The replica writing idle entities leaves out a record whose figures it already wrote,
    until the heartbeat; a backlog that changed (here through another replica: no activity on
    this one) is recorded at the next interval, and both replicas' gauges show it."""
    url = own_redis[0].url
    env = {'SHOAL_METRICS_INTERVAL_SECONDS': '0.5', 'SHOAL_METRICS_HEARTBEAT_SECONDS': '6'}
    start_broker(redis_url=url, env=env, replica_id='aa-first')
    second = start_broker(redis_url=url, env=env, replica_id='zz-second')
    conn = connect(second.url)
    send_all(conn, address, range(2))

    def idle_records() -> list[MetricRecord]:
        return [r for r in _records(url, address) if r.replica == 'aa-first']

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(r.backlog == 2 for r in idle_records()):
        time.sleep(0.2)
    first_of_2 = min(r.ts_ms for r in idle_records() if r.backlog == 2)
    time.sleep(max(0.0, first_of_2 / 1000 + 3 - time.time()))
    quiet = [r for r in idle_records() if first_of_2 < r.ts_ms <= first_of_2 + 3000]
    assert quiet == []  # six intervals, the figures unchanged, the heartbeat not due
    send_all(conn, address, range(1))
    conn.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(r.backlog == 3 for r in idle_records()):
        time.sleep(0.2)
    [changed] = [r for r in idle_records() if r.backlog == 3][:1]
    assert changed.enqueued == 0  # aa-first saw no traffic: the change alone wrote it
    assert changed.ts_ms < first_of_2 + 6000  # before the heartbeat would have
    labels = {'address': address, 'subscription': 'queue'}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if _value(_samples(second), 'shoal_backlog_messages', **labels) == 3:
            break
        time.sleep(0.3)
    assert _value(_samples(second), 'shoal_backlog_messages', **labels) == 3


def _receive_everything(receivers: list[BlockingReceiver], count: int) -> list[int]:
    """Receive and accept from every receiver in turn until ``count`` messages came in all
    (bounded: 30 s); how many each got."""
    got = [0] * len(receivers)
    deadline = time.monotonic() + 30
    while sum(got) < count and time.monotonic() < deadline:
        for i, rcv in enumerate(receivers):
            try:
                rcv.receive(timeout=0.2)
            except Timeout:
                continue
            rcv.accept()
            got[i] += 1
    for rcv in receivers:
        flush(rcv.connection)
    assert sum(got) == count, f'received {got}'
    return got


def test_each_consumer_link_counts_what_it_was_sent_and_the_cap_folds_the_rest(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    """Two replicas of one cluster: the first with one consumer, the second, capped at one
    series, with two; the second's later link counts under link="_other". A detached link's
    series goes, while ``_other`` keeps what its detached links were sent."""
    one = start_broker()
    two = start_broker(env={'SHOAL_METRICS_MAX_CONSUMER_LINKS': '1'})
    conn_one, conn_two = connect(one.url), connect(two.url)
    first = receiver(conn_one, address, credit=10)
    second = receiver(conn_two, address, credit=10)
    folded = receiver(conn_two, address, credit=10)
    producer = send_all(conn_one, address, range(30))
    got = _receive_everything([first, second, folded], 30)
    queue = {'address': address, 'subscription': 'queue'}
    name = 'shoal_consumer_deliveries_total'
    on_one, on_two = _samples(one), _samples(two)
    assert _value(on_one, name, link=first.link.name, **queue) == got[0]
    assert _value(on_two, name, link=second.link.name, **queue) == got[1]
    assert _value(on_two, name, link='_other', **queue) == got[2]
    links_two = {dict(labels).get('link') for (n, labels) in on_two if n == name}
    assert links_two == {second.link.name, '_other'}, f'received {got}'
    folded.close()
    second.close()
    flush(conn_two)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        on_two = _samples(two)
        if _value(on_two, 'shoal_consumers', **queue) == 0:
            break
        time.sleep(0.2)
    assert {dict(labels).get('link') for (n, labels) in on_two if n == name} == {'_other'}
    assert _value(on_two, name, link='_other', **queue) == got[2]
    producer.close()
    conn_one.close()
    conn_two.close()
