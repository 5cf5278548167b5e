"""
Every labelled series is exported at 0 before its first event, so Prometheus's ``increase()`` and
``rate()`` see that event; gauges of consumers and links read 0 rather than vanish. Real brokers,
read through their /metrics (tests/chart/test_prometheus.py runs the same through a real
Prometheus and the chart's alerting rules).
"""

from collections.abc import Callable

from amqpclient import Capabilities, connect, flush, receiver, send_all, sender, settle
from exposition import Samples, samples, value
from processes import BrokerProcess, wait_for
from proton import Delivery

QUICK = {'SHOAL_BACKLOG_REFRESH_SECONDS': '0.2'}


def exported(found: Samples, name: str, **labels: str) -> bool:
    return (name, tuple(sorted(labels.items()))) in found


def test_a_fresh_replica_exports_its_refusal_and_link_series_at_zero(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    b = start_broker(env=QUICK)
    found = samples(b)
    at_zero = [
        ('shoal_authentication_failures_total', {'mechanism': 'PLAIN', 'reason': 'credentials'}),
        ('shoal_authentication_failures_total', {'mechanism': 'none', 'reason': 'throttled'}),
        ('shoal_authorization_failures_total', {'operation': 'send'}),
        ('shoal_connections_refused_total', {'condition': 'amqp:resource-limit-exceeded'}),
        ('shoal_links_refused_total', {'role': 'consumer', 'condition': 'amqp:not-found'}),
        ('shoal_publishes_refused_total', {'reason': 'address_limit'}),
        ('shoal_background_task_failures_total', {'task': 'trim'}),
        ('shoal_background_task_failures_total', {'task': 'lease'}),
        ('shoal_links', {'role': 'consumer'}),
        ('shoal_links', {'role': 'producer'}),
    ]
    missing = [(name, labels) for name, labels in at_zero if not exported(found, name, **labels)]
    assert missing == []
    assert all(value(found, name, **labels) == 0 for name, labels in at_zero)


def test_a_queue_counts_from_zero_on_every_replica_before_its_first_dead_letter(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    env = {**QUICK, 'SHOAL_DEAD_LETTER_ADDRESS': f'{address}-dlq'}
    first, other = start_broker(env=env), start_broker(env=env)
    queue = {'address': address, 'subscription': 'queue'}
    producer = connect(first.url)
    send_all(producer, address, ['poison', 'fine'])
    # both replicas, the one that never saw the queue too, export its trouble counters at 0
    for b in (first, other):
        wait_for(
            lambda b=b: exported(samples(b), 'shoal_messages_dead_lettered_total', **queue),
            15, f'the dead-letter counter of {address} on {b.replica_id}',
        )  # fmt: skip
        found = samples(b)
        assert value(found, 'shoal_messages_dead_lettered_total', **queue) == 0
        assert exported(found, 'shoal_messages_enqueued_total', address=address)
        assert exported(found, 'shoal_consumers', **queue)  # none attached: 0, not absent
        assert value(found, 'shoal_consumers', **queue) == 0
    # a consumer attaches with no credit: its queue's delivery series exist before a delivery
    consumer = connect(other.url)
    rcv = receiver(consumer, address, credit=0)
    wait_for(lambda: value(samples(other), 'shoal_consumers', **queue) == 1, 15, 'the consumer')
    found = samples(other)
    for name, labels in [
        ('shoal_messages_delivered_total', queue),
        ('shoal_messages_filtered_total', queue),
        ('shoal_messages_expired_total', queue),
        ('shoal_messages_redelivery_delayed_total', queue),
        *[('shoal_deliveries_settled_total', {**queue, 'outcome': outcome})
          for outcome in ('accepted', 'released', 'modified', 'rejected')],
        ('shoal_delivery_latency_seconds_count', queue),
        ('shoal_delivery_latency_seconds_bucket', {**queue, 'le': '+Inf'}),
    ]:  # fmt: skip
        assert exported(found, name, **labels), (name, labels)
        assert value(found, name, **labels) == 0, (name, labels)
    rcv.flow(1)
    rcv.receive(timeout=10)
    settle(rcv, Delivery.REJECTED)
    flush(consumer)
    wait_for(
        lambda: value(samples(other), 'shoal_messages_dead_lettered_total', **queue) == 1,
        15, 'the dead letter counted',
    )  # fmt: skip
    rcv.close()
    flush(consumer)
    # the last consumer gone: its gauges read 0
    wait_for(lambda: value(samples(other), 'shoal_links', role='consumer') == 0, 15, 'detach')
    found = samples(other)
    assert exported(found, 'shoal_links', role='consumer')
    assert exported(found, 'shoal_consumers', **queue)
    assert value(found, 'shoal_consumers', **queue) == 0
    consumer.close()
    producer.close()


def test_a_topic_counts_its_publishes_from_zero_once_a_producer_attaches(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    b = start_broker(env=QUICK)
    conn = connect(b.url)
    sender(conn, address, Capabilities('topic'))
    found = samples(b)
    for name in ('shoal_messages_enqueued_total', 'shoal_messages_dropped_total'):
        assert exported(found, name, address=address), name
        assert value(found, name, address=address) == 0, name
    conn.close()
