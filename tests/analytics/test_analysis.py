"""
Analysis acceptance on synthetic records: every planted problem is flagged, nothing else is, and
healthy traffic raises no flag; plus the indicators behind the flags and the summary hand-off.
"""

import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis
from processes import RedisServer, free_port
from pyspark.sql import Row, SparkSession

from shoal_analytics.analyze import Analysis, analyze
from shoal_analytics.anomalies import is_capped
from shoal_analytics.errors import AnalyticsError
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.publish import publish_summary, publish_to
from shoal_analytics.quantiles import QUANTILES, percentiles, record_sketch, sketch_rows
from shoal_analytics.synthetic import PLANTS, Synthetic, write_raw
from shoal_broker.metrics.records import AnalyticsSummary, sketch_index
from shoal_broker.store import keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the first also starts the JVM


def test_every_planted_problem_is_flagged_and_nothing_else(
    planted: tuple[Synthetic, Lake, Analysis],
) -> None:
    spec, _, analysis = planted
    assert set(spec.planted) == set(PLANTS)
    found = {(a.flag, a.address or a.replica) for a in analysis.summary.anomalies}
    assert found == set(spec.planted.items())
    starved = next(a for a in analysis.summary.anomalies if a.flag == 'starved_consumer')
    assert (starved.address, starved.replica) == (spec.entity(1), spec.starved_replica)
    assert analysis.summary.records == spec.intervals * spec.replicas * spec.entities
    assert analysis.summary.current_replicas == spec.replicas


def test_healthy_traffic_flags_nothing(spark: SparkSession, tmp_path: Path) -> None:
    spec = Synthetic(plants=(), seed=11)
    lake = Lake(tmp_path)
    write_raw(spec, lake.raw)
    analysis = analyze(spark, lake, AnalysisParams())
    assert analysis.summary.anomalies == ()
    assert analysis.summary.recommended_replicas == 1  # ~500 transfers/s of 10 000 each
    assert 'consumer-bound' not in analysis.summary.reason


def test_without_a_complete_window_the_replicas_seen_are_kept(
    spark: SparkSession, tmp_path: Path
) -> None:
    # 30 s of records, 60 s windows: nothing to judge yet; the advice was "0 replica(s)"
    spec = Synthetic(plants=(), intervals=3, seed=5)
    lake = Lake(tmp_path)
    write_raw(spec, lake.raw)
    summary = analyze(spark, lake, AnalysisParams()).summary
    assert 'no complete window' in summary.reason
    assert summary.current_replicas == summary.recommended_replicas == spec.replicas


def _by_address(spark: SparkSession, lake: Lake, table: str) -> dict[str, Row]:
    rows = spark.read.parquet(str(lake.analysis / f'{table}.parquet')).collect()
    return {row['address']: row for row in rows}


def test_indicators_behind_the_flags(
    spark: SparkSession, planted: tuple[Synthetic, Lake, Analysis]
) -> None:
    spec, lake, _ = planted
    entities = {
        row['address']: row
        for row in spark.read.parquet(str(lake.analysis / 'entities.parquet')).collect()
    }
    growing = entities[spec.entity(0)]
    assert growing['backlog_growing']
    assert growing['time_to_drain_s'] is None  # enqueued faster than drained: never drains
    assert growing['backlog_slope_per_s'] == pytest.approx(4.0, rel=0.05)  # 40 per 10 s interval
    healthy = entities[spec.entity(5)]
    assert not healthy['backlog_growing']
    assert healthy['p50_ms'] < healthy['p95_ms'] < healthy['p99_ms'] < 250
    assert entities[spec.entity(2)]['redelivery_ratio'] == pytest.approx(0.2, abs=0.02)
    assert entities[spec.entity(4)]['expiry_ratio'] == pytest.approx(0.05, abs=0.01)

    fairness = {
        row['address']: row
        for row in spark.read.parquet(str(lake.analysis / 'fairness.parquet')).collect()
    }
    starved = fairness[spec.entity(1)]
    assert starved['least_served_replica'] == spec.starved_replica
    assert starved['min_per_consumer'] == 0
    assert starved['max_min_ratio'] is None  # division by a zero minimum
    assert starved['gini'] > 0.25
    assert fairness[spec.entity(5)]['gini'] < 0.1

    shares = spark.read.parquet(str(lake.analysis / 'replicas.parquet')).collect()
    assert sum(row['share'] for row in shares) == pytest.approx(1.0)
    windows = spark.read.parquet(str(lake.analysis / 'cluster_windows.parquet')).collect()
    window_count = spec.intervals * spec.interval_ms // 60_000
    assert len(windows) == window_count  # records run up to the end of the newest window


def _percentiles(spark: SparkSession, rows: Sequence[tuple[str, object, object]]) -> dict[str, Row]:
    frame = spark.createDataFrame(
        rows, 'entity STRING, latency_buckets ARRAY<BIGINT>, latency_sketch MAP<INT, BIGINT>'
    )
    sketches = sketch_rows(frame.select('entity', record_sketch(frame)), 'entity')
    return {row['entity']: row for row in percentiles(sketches, 'entity').collect()}


def _nearest_rank(waits: list[float], q: float) -> float:
    ordered = sorted(waits)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def test_percentiles_of_merged_sketches_are_within_2_percent_of_the_true_ones(
    spark: SparkSession,
) -> None:
    """Waits from 1 ms to an hour, sketched on three replicas apart and merged in Spark."""
    rng = random.Random(7)
    waits = {
        'fast': [rng.uniform(0.001, 0.003) for _ in range(3000)],
        'slow': [rng.uniform(1.0, 1.6) for _ in range(3000)],
        'stuck': [rng.uniform(600, 3600) for _ in range(300)],
    }
    rows = []
    for entity, values in waits.items():
        for replica in range(3):
            sketch: dict[int, int] = {}
            for wait in values[replica::3]:
                index = sketch_index(wait)
                sketch[index] = sketch.get(index, 0) + 1
            rows.append((entity, None, sketch))
    found = _percentiles(spark, rows)
    for entity, values in waits.items():
        for name, q in QUANTILES.items():
            truth = _nearest_rank(values, q) * 1000
            assert found[entity][name] == pytest.approx(truth, rel=0.02), (entity, name)
        assert found[entity]['latency_samples'] == len(values)


def test_old_records_answer_the_upper_bound_of_their_bucket_and_beyond_the_top_at_least_it(
    spark: SparkSession,
) -> None:
    """Schema 2 and 1 records: what they counted is known up to the bucket's upper bound;
    schema 1 counted waits past 30 s only as "beyond 30 s", which is what they answer."""
    schema_2 = [0] * 9 + [60, 40, 0, 0, 0]  # 60 in (30 s, 60 s], 40 in (60 s, 300 s]
    schema_1 = [50, *[0] * 8, 50]  # 50 under 1 ms, 50 beyond 30 s
    found = _percentiles(spark, [('two', schema_2, None), ('one', schema_1, None)])
    assert found['two']['p50_ms'] == pytest.approx(60_000, rel=0.02)
    assert found['two']['p95_ms'] == pytest.approx(300_000, rel=0.02)
    assert not is_capped(found['two']['p95_ms'])
    assert found['one']['p50_ms'] == pytest.approx(1.0, rel=0.02)
    assert found['one']['p95_ms'] == found['one']['p99_ms'] == 30_000
    assert is_capped(found['one']['p95_ms'])


def test_the_summary_reaches_the_operator_hash(
    planted: tuple[Synthetic, Lake, Analysis], redis_server: RedisServer
) -> None:
    _, _, analysis = planted
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.hset(keys.ANALYTICS_SUMMARY, 'stale', 'field of an older writer')
    publish_summary(client, analysis.summary)
    fields = client.hgetall(keys.ANALYTICS_SUMMARY)
    client.close()
    assert set(fields) == {'v', 'summary'}
    assert AnalyticsSummary.from_fields(fields) == analysis.summary


def test_a_summary_that_cannot_be_published_is_one_line_saying_the_analysis_is_kept(
    planted: tuple[Synthetic, Lake, Analysis],
) -> None:
    _, _, analysis = planted
    url = f'redis://:s3cret@127.0.0.1:{free_port()}/0'  # nobody listens there
    with pytest.raises(AnalyticsError) as raised:
        publish_to(url, analysis.summary)
    message = str(raised.value)
    assert message.startswith('the analysis is in the lake, not published: cannot reach Redis at ')
    assert 's3cret' not in message
    assert '\n' not in message
