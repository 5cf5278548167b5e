"""Anomaly thresholds and the replica recommendation, on hand-made rows (no Spark)."""

from shoal_analytics.anomalies import (
    entity_anomalies,
    fairness_anomalies,
    replica_anomalies,
    share_anomalies,
)
from shoal_analytics.params import AnalysisParams
from shoal_analytics.recommend import headline, recommend
from shoal_analytics.units import entity_name, subscription_name
from shoal_broker.metrics.records import Anomaly

PARAMS = AnalysisParams()


def _entity(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        'address': 'a', 'subscription': 'queue', 'backlog_growing': False, 'consumers': 2,
        'backlog': 0, 'backlog_slope_per_s': 0.0, 'backlog_growing_fraction': 0.0,
        'delivered': 1000, 'accepted': 1000, 'enqueued': 1000, 'redelivery_ratio': 0.0,
        'expiry_ratio': 0.0, 'p99_ms': 20.0,
    }  # fmt: skip
    row.update(changes)
    return row


def test_ratios_and_latency_need_their_minimum_sample_counts() -> None:
    few = _entity(delivered=20, accepted=20, enqueued=20, redelivery_ratio=0.5, expiry_ratio=0.5,
                  p99_ms=20_000.0)  # fmt: skip
    assert entity_anomalies([few], PARAMS) == []
    many = _entity(redelivery_ratio=0.5, expiry_ratio=0.5, p99_ms=20_000.0)
    flags = {(a.flag, a.severity) for a in entity_anomalies([many], PARAMS)}
    # critical only for what is lost (expired unread) or stops; the rest delays: warning
    assert flags == {('redelivery_storm', 'warning'), ('expiry_storm', 'critical'),
                     ('slow_consumer', 'warning')}  # fmt: skip
    [slow] = [a for a in entity_anomalies([many], PARAMS) if a.flag == 'slow_consumer']
    assert slow.detail.startswith('p99 wait 20 s over the 1 s objective')  # not "20000 ms"


def test_a_growing_backlog_nobody_consumes_is_critical() -> None:
    row = _entity(backlog_growing=True, consumers=0, backlog=500, backlog_slope_per_s=3.0,
                  backlog_growing_fraction=1.0)  # fmt: skip
    [anomaly] = entity_anomalies([row], PARAMS)
    assert (anomaly.flag, anomaly.severity) == ('growing_backlog', 'critical')
    assert 'no consumer attached in the whole lookback' in anomaly.detail


def test_a_growing_backlog_whose_consumer_left_lately_is_behind_not_unconsumed() -> None:
    row = _entity(backlog_growing=True, consumers=0, consumers_max=1, backlog=500,
                  backlog_slope_per_s=3.0, backlog_growing_fraction=1.0)  # fmt: skip
    [anomaly] = entity_anomalies([row], PARAMS)
    assert (anomaly.flag, anomaly.severity) == ('growing_backlog', 'warning')
    assert 'falling behind' in anomaly.detail


def test_dead_letters_are_flagged_with_their_reasons() -> None:
    row = _entity(dead_lettered=12, rejected=10)
    [anomaly] = entity_anomalies([row], PARAMS)
    assert (anomaly.flag, anomaly.severity) == ('dead_letters', 'warning')
    assert anomaly.detail == '12 messages dead-lettered (10 rejected, 2 past max delivery attempts)'


def test_an_uneven_split_over_replicas_is_flagged_unless_a_hot_replica_explains_it() -> None:
    shares = [{'address': 'prices', 'subscription': 'durable:global:*:sub1', 'replica': 'a',
               'delivered': 200, 'share': 2 / 3},
              {'address': 'prices', 'subscription': 'durable:global:*:sub1', 'replica': 'b',
               'delivered': 100, 'share': 1 / 3}]  # fmt: skip
    [anomaly] = share_anomalies(shares, PARAMS)
    assert (anomaly.flag, anomaly.replica, anomaly.severity) == ('uneven_share', 'a', 'info')
    assert anomaly.detail == 'deliveries split a 67% / b 33% over 2 replicas'
    assert share_anomalies(shares, PARAMS, hot_replicas=['a']) == []
    even = [{**row, 'delivered': 150, 'share': 0.5} for row in shares]
    assert share_anomalies(even, PARAMS) == []


def test_the_headline_says_what_to_do() -> None:
    advice = recommend([500.0] * 10, current=2, growing_backlogs=1, params=PARAMS)
    behind = Anomaly(flag='slow_consumer', address='orders', subscription='queue')
    absent = Anomaly(flag='growing_backlog', address='jobs', subscription='queue',
                     severity='critical')  # fmt: skip
    assert headline(advice, 2, [behind]) == 'Add consumers to orders'
    assert (
        headline(advice, 2, [absent, behind]) == 'Attach consumers to jobs; add consumers to orders'
    )
    busy = recommend([20_000.0] * 10, current=2, growing_backlogs=0, params=PARAMS)
    assert headline(busy, 2, []) == 'Scale brokers to 3'
    assert headline(advice, 2, []) == 'Scale brokers down to 1'
    steady = recommend([500.0] * 10, current=1, growing_backlogs=0, params=PARAMS)
    assert headline(steady, 1, []) == 'No action needed: 1 broker(s) carry the load'


def test_starvation_comes_from_the_fairness_table() -> None:
    row = {'address': 'a', 'subscription': 'queue', 'least_served_replica': 'r2', 'starved': True,
           'min_per_consumer': 3.0, 'mean_per_consumer': 400.0, 'gini': 0.4}  # fmt: skip
    [anomaly] = fairness_anomalies([row, {**row, 'starved': False}])
    assert (anomaly.replica, anomaly.severity) == ('r2', 'warning')


def test_a_hot_replica_needs_peers_and_traffic() -> None:
    shares = [{'replica': 'r0', 'transfers': 6000, 'share': 0.6},
              {'replica': 'r1', 'transfers': 2000, 'share': 0.2},
              {'replica': 'r2', 'transfers': 2000, 'share': 0.2}]  # fmt: skip
    assert [a.replica for a in replica_anomalies(shares, PARAMS)] == ['r0']
    quiet = [{**row, 'transfers': int(row['transfers']) // 100} for row in shares]  # type: ignore[call-overload]
    assert replica_anomalies(quiet, PARAMS) == []
    assert replica_anomalies([{'replica': 'r0', 'transfers': 10**6, 'share': 1.0}], PARAMS) == []


def test_the_recommendation_sizes_for_the_busy_windows() -> None:
    rates = [1000.0] * 18 + [20_000.0, 30_000.0]  # p95 = 20 000 transfers/s
    advice = recommend(rates, current=2, growing_backlogs=0, params=PARAMS)
    assert advice.replicas == 3  # 20 000 / (10 000 x 0.7)
    assert advice.p95_transfers_per_s == 20_000.0


def test_a_growing_backlog_adds_a_replica_only_when_replicas_are_busy() -> None:
    busy = recommend([15_000.0] * 10, current=2, growing_backlogs=1, params=PARAMS)
    assert busy.replicas == 3
    idle = recommend([500.0] * 10, current=2, growing_backlogs=1, params=PARAMS)
    assert idle.replicas == 1
    assert 'consumer-bound' in idle.reason
    assert recommend([], current=4, growing_backlogs=0, params=PARAMS).replicas == 4


def test_subscriptions_are_named_as_their_users_named_them() -> None:
    assert subscription_name('durable:global:*:sub1') == 'sub1'
    assert subscription_name('durable:client:ID:abc:1:orders') == 'orders (client ID:abc:1)'
    assert subscription_name('volatile:global:*:a:b') == 'a:b'
    assert entity_name('prices', 'durable:global:*:sub1') == 'prices / sub1'
    assert entity_name('orders', 'queue') == 'orders'
