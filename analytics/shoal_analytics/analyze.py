"""
``shoal-analytics analyze``: indicators, anomalies and the replica recommendation of the lookback.

Writes one Parquet table per indicator under ``analysis/`` (each run replaces them: they describe
the latest lookback) and ``summary.json``; the CLI also publishes the summary to Redis.
"""

import dataclasses
import json
import time
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from shoal_analytics.anomalies import (
    entity_anomalies,
    fairness_anomalies,
    ranked,
    replica_anomalies,
    share_anomalies,
)
from shoal_analytics.errors import AnalysisError
from shoal_analytics.indicators import (
    backlog_samples,
    cells,
    cluster_rates,
    entity_replica_shares,
    entity_summary,
    entity_windows,
    fairness,
    replica_share,
    replica_windows,
    select_span,
)
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.quantiles import sketch_rows
from shoal_analytics.recommend import Recommendation, headline, recommend
from shoal_broker.metrics.records import AnalyticsSummary


@dataclasses.dataclass(frozen=True)
class Analysis:
    summary: AnalyticsSummary
    recommendation: Recommendation
    malformed_records: int


def _write(frame: DataFrame, path: Path) -> DataFrame:
    """Write a table (replacing the previous run's) and read it back, so it is computed once."""
    frame.write.mode('overwrite').parquet(str(path))
    return frame.sparkSession.read.parquet(str(path))


def analyze(spark: SparkSession, lake: Lake, params: AnalysisParams) -> Analysis:
    try:
        raw = spark.read.parquet(str(lake.raw))
    except AnalysisException as exc:
        raise AnalysisError(f'no raw metric records under {lake.raw}: run ingest first') from exc
    records, span = select_span(raw, params)
    out = lake.analysis
    # The one scan of the records; everything below reads the (smaller) cells.
    per_cell = _write(cells(records), out / 'cells.parquet')
    load = _write(replica_windows(per_cell, params), out / 'replica_windows.parquet')
    shares = _write(replica_share(load), out / 'replicas.parquet')
    shares_rows = [row.asDict() for row in shares.collect()]
    record_count = sum(int(row['records']) for row in shares_rows)
    if record_count == 0:
        raise AnalysisError(f'no well-formed metric records under {lake.raw}')
    # the sketches merged per window and entity: every percentile is read from these
    sketches = _write(
        sketch_rows(records, 'window_start_ms', 'address', 'subscription'),
        out / 'latency_sketches.parquet',
    )
    windows = _write(entity_windows(per_cell, sketches, params), out / 'entity_windows.parquet')
    samples = _write(backlog_samples(records), out / 'backlog_samples.parquet')
    entities = _write(entity_summary(windows, samples, sketches, params), out / 'entities.parquet')
    entity_shares = _write(entity_replica_shares(per_cell), out / 'entity_replicas.parquet')
    fair = _write(fairness(per_cell, params), out / 'fairness.parquet')
    cluster = _write(cluster_rates(load), out / 'cluster_windows.parquet')

    entity_rows = [row.asDict() for row in entities.collect()]
    hot = replica_anomalies(shares_rows, params)
    anomalies = ranked(
        entity_anomalies(entity_rows, params)
        + fairness_anomalies(row.asDict() for row in fair.where('starved').collect())
        + hot
        + share_anomalies(
            (row.asDict() for row in entity_shares.collect()), params, (a.replica for a in hot)
        )
    )
    rates = cluster.orderBy('window_start_ms').collect()
    current = params.current_replicas
    if current is None:  # the newest complete window's; without one, all seen in the lookback
        current = int(rates[-1]['replicas']) if rates else len(shares_rows)
    growing = sum(1 for row in entity_rows if row['backlog_growing'])
    advice = recommend([float(r['transfers_per_s']) for r in rates], current, growing, params)
    summary = AnalyticsSummary(
        generated_at_ms=int(time.time() * 1000),
        window_start_ms=span.start_ms,
        window_end_ms=span.end_ms,
        records=record_count,
        current_replicas=current,
        recommended_replicas=advice.replicas,
        reason=advice.reason,
        anomalies=tuple(anomalies),
    )
    spark.createDataFrame(
        [dataclasses.asdict(a) for a in anomalies] or [],
        'flag STRING, address STRING, subscription STRING, replica STRING, severity STRING, '
        'detail STRING, value DOUBLE',
    ).coalesce(1).write.mode('overwrite').parquet(str(out / 'anomalies.parquet'))
    document = {
        **json.loads(summary.to_fields()['summary']),
        'headline': headline(advice, current, anomalies),
        'malformed_records': span.malformed,
        # what the records cover (the lookback above is only how far back they were read)
        'data_start_ms': span.data_start_ms,
        'data_end_ms': span.end_ms,
        'p95_transfers_per_s': advice.p95_transfers_per_s,
        'utilisation': advice.utilisation,
        'params': dataclasses.asdict(params),
    }
    lake.summary.write_text(json.dumps(document, indent=2, default=str))
    return Analysis(summary, advice, span.malformed)
