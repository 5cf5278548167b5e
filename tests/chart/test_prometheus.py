"""
The chart's alerting rules and Grafana dashboard on a real Prometheus scraping two real broker
replicas (labelled as their ServiceMonitor labels them): ``ShoalDeadLetterQueueFilling`` goes
pending on a queue's first dead letter, and with traffic and no consumer the consumer and
connection panels show 0 rather than no data; a replica stopping shows on the drain panel.
"""

import json
import re
import uuid
from collections.abc import Iterator

import pytest
from amqpclient import connect, flush, receiver, send_all, settle
from chartrender import CHART_DIR
from processes import LOOPBACK, BrokerProcess, wait_for
from prometheusserver import PrometheusServer
from proton import Delivery

RULES = CHART_DIR / 'files' / 'prometheus-rules.yaml'
DASHBOARD = CHART_DIR / 'files' / 'dashboards' / 'shoal.json'
NAMESPACE, JOB = 'shoal-test', 'shoal'
DEAD_LETTERS = 'ShoalDeadLetterQueueFilling'
ALWAYS_THERE = ('Consumers (all replicas)', 'Connections and links per pod')
"""The dashboard panels that must show 0, not "no data", for a cluster nobody consumes from."""
TEMPLATE = {'$namespace': NAMESPACE, '$address': '.+', '$__rate_interval': '1m'}
"""What Grafana puts for the dashboard's variables (one namespace, every address)."""


@pytest.fixture(scope='module')
def observed(store_url: str) -> Iterator[tuple[PrometheusServer, list[BrokerProcess]]]:
    """Two replicas on the session's store, scraped every second with the chart's rules."""
    tag = uuid.uuid4().hex[:6]
    env = {'SHOAL_BACKLOG_REFRESH_SECONDS': '0.5'}
    brokers: list[BrokerProcess] = []
    prometheus = None
    try:
        for name in ('a', 'b'):
            replica = f'prom-{tag}-{name}'
            brokers.append(BrokerProcess(store_url, replica_id=replica, env=env))
        targets = [
            (f'{LOOPBACK}:{b.http_port}', {'namespace': NAMESPACE, 'pod': b.replica_id})
            for b in brokers
        ]
        prometheus = PrometheusServer(JOB, targets, [RULES])
        yield prometheus, brokers
    finally:
        if prometheus is not None:
            prometheus.stop()
        for b in brokers:
            b.stop()


def pending(prometheus: PrometheusServer, alert: str, address: str) -> list[str]:
    return [
        a['state'] for a in prometheus.alerts()
        if a['labels'].get('alertname') == alert and a['labels'].get('address') == address
    ]  # fmt: skip


def test_the_dead_letter_alert_is_pending_after_a_queues_first_rejected_message(
    observed: tuple[PrometheusServer, list[BrokerProcess]], address: str
) -> None:
    prometheus, (first, second) = observed
    selector = f'shoal_messages_dead_lettered_total{{address="{address}",subscription="queue"}}'
    producer, consumer = connect(first.url), connect(second.url)
    try:
        send_all(producer, address, ['poison'])
        # the queue exists: Prometheus has its dead-letter series at 0 from both replicas
        wait_for(lambda: len(prometheus.query(selector)) == 2, 30, f'{selector} in Prometheus')
        assert {float(s['value'][1]) for s in prometheus.query(selector)} == {0.0}
        assert pending(prometheus, DEAD_LETTERS, address) == []
        rcv = receiver(consumer, address, credit=1)
        rcv.receive(timeout=10)
        settle(rcv, Delivery.REJECTED)
        flush(consumer)
        wait_for(lambda: pending(prometheus, DEAD_LETTERS, address) == ['pending'], 60,
                 f'{DEAD_LETTERS} pending for {address}')  # fmt: skip
        # other alerts may be pending on the address too (ShoalConsumerStarved, while the
        # delivered counter has one sample only): this test is about the dead-letter one
        [alert] = [
            a for a in prometheus.alerts()
            if a['labels'].get('alertname') == DEAD_LETTERS
            and a['labels'].get('address') == address
        ]  # fmt: skip
        assert alert['labels']['subscription'] == 'queue'
        assert alert['labels']['namespace'] == NAMESPACE
        assert float(alert['value']) > 0
    finally:
        consumer.close()
        producer.close()


def panel_queries() -> list[tuple[str, str, str]]:
    """(panel title, legend, PromQL as Grafana sends it) of every dashboard target."""
    dashboard = json.loads(DASHBOARD.read_text())
    pattern = re.compile('|'.join(re.escape(v) for v in TEMPLATE))
    return [
        (panel['title'], target.get('legendFormat', ''),
         pattern.sub(lambda m: TEMPLATE[m.group(0)], target['expr']))
        for panel in dashboard['panels'] for target in panel.get('targets', [])
    ]  # fmt: skip


def test_with_traffic_and_no_consumer_the_consumer_and_connection_panels_show_zero(
    observed: tuple[PrometheusServer, list[BrokerProcess]], address: str
) -> None:
    prometheus, (first, _) = observed
    producer = connect(first.url)
    send_all(producer, address, range(3))
    producer.close()
    # the queue's backlog and the producer's departure have both been scraped
    backlog = f'shoal_backlog_messages{{address="{address}"}}'
    wait_for(
        lambda: {float(s['value'][1]) for s in prometheus.query(backlog)} == {3.0}
        and not prometheus.query(f'shoal_connections{{namespace="{NAMESPACE}"}} > 0'),
        30, 'the backlog and no connection in Prometheus',
    )  # fmt: skip
    queries = panel_queries()
    assert {title for title, _, _ in queries} >= set(ALWAYS_THERE)
    empty = [(title, legend) for title, legend, expr in queries if not prometheus.query(expr)]
    assert [(title, legend) for title, legend in empty if title in ALWAYS_THERE] == [], empty
    consumers = prometheus.query(
        f'sum by (address, subscription) (shoal_consumers{{address="{address}"}})'
    )
    assert [float(s['value'][1]) for s in consumers] == [0.0]
    links = prometheus.query(f'sum by (role) (shoal_links{{namespace="{NAMESPACE}"}})')
    assert {s['metric']['role']: float(s['value'][1]) for s in links}.get('consumer') == 0.0


DRAIN_PANEL = 'Drain progress per replica'


def drain_panel(prometheus: PrometheusServer) -> dict[str, float]:
    """The drain panel's series now, by legend as Grafana would draw them."""
    shown = {}
    for title, legend, expr in panel_queries():
        if title == DRAIN_PANEL:
            for sample in prometheus.query(expr):
                name = legend
                for label, value in sample['metric'].items():
                    name = name.replace(f'{{{{{label}}}}}', value)
                shown[name] = float(sample['value'][1])
    return shown


@pytest.mark.timeout(90)
def test_the_drain_panel_shows_a_stopping_replica_and_what_its_connections_still_owe(
    observed: tuple[PrometheusServer, list[BrokerProcess]], store_url: str, address: str
) -> None:
    """A replica of its own is stopped while a consumer holds two unsettled deliveries: the
    panel shows it draining, with one connection left owing two deliveries; the others not."""
    _, (first, _) = observed
    stopping = BrokerProcess(store_url, replica_id=f'drain-{uuid.uuid4().hex[:6]}',
                             env={'SHOAL_CONNECTION_DRAIN_SECONDS': '60'})  # fmt: skip
    prometheus = None
    try:
        targets = [(f'{LOOPBACK}:{b.http_port}', {'namespace': NAMESPACE, 'pod': b.replica_id})
                   for b in (first, stopping)]  # fmt: skip
        prometheus = PrometheusServer(JOB, targets, [RULES])
        producer = connect(stopping.url)
        send_all(producer, address, range(2))
        producer.close()
        holding = connect(stopping.url)
        held = receiver(holding, address, credit=2)
        holding.wait(lambda: held.fetcher.has_message == 2, timeout=10)
        pod = stopping.replica_id
        wait_for(lambda: drain_panel(prometheus).get(f'{pod} draining') == 0.0, 30,
                 'the replica scraped before it stops')  # fmt: skip
        assert f'{pod} connections left' not in drain_panel(prometheus)  # only while draining
        stopping.process.terminate()
        expected = {f'{pod} draining': 1.0, f'{pod} connections left': 1.0,
                    f'{pod} owed: delivery': 2.0, f'{pod} owed: send': 0.0}  # fmt: skip
        wait_for(lambda: expected.items() <= drain_panel(prometheus).items(), 30,
                 'the drain in Prometheus')  # fmt: skip
        shown = drain_panel(prometheus)
        assert shown[f'{first.replica_id} draining'] == 0.0
        assert not [name for name in shown if name.startswith(first.replica_id) and
                    'draining' not in name]  # fmt: skip
        for _ in range(2):
            held.fetcher.pop()
            settle(held, Delivery.ACCEPTED)
        flush(holding)
        assert stopping.process.wait(timeout=20) == 0
    finally:
        if prometheus is not None:
            prometheus.stop()
        stopping.stop()
