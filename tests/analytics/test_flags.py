"""Anomaly thresholds and the replica recommendation, on hand-made rows (no Spark)."""

from shoal_analytics.anomalies import entity_anomalies, fairness_anomalies, replica_anomalies
from shoal_analytics.params import AnalysisParams
from shoal_analytics.recommend import recommend

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
    assert flags == {('redelivery_storm', 'critical'), ('expiry_storm', 'critical'),
                     ('slow_consumer', 'critical')}  # fmt: skip
    assert entity_anomalies([_entity(redelivery_ratio=0.06)], PARAMS)[0].severity == 'warning'


def test_a_growing_backlog_nobody_consumes_is_critical() -> None:
    row = _entity(backlog_growing=True, consumers=0, backlog=500, backlog_slope_per_s=3.0,
                  backlog_growing_fraction=1.0)  # fmt: skip
    [anomaly] = entity_anomalies([row], PARAMS)
    assert (anomaly.flag, anomaly.severity) == ('growing_backlog', 'critical')
    assert 'nobody consumes' in anomaly.detail


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
