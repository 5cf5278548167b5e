"""
A broker leaves out the record of a quiet entity whose figures did not change, up to its
heartbeat (``SHOAL_METRICS_HEARTBEAT_SECONDS``). The analysis must read such records the same as
the full series: a left-out interval held the backlog still, it is neither zero nor gone.
"""

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from shoal_analytics.analyze import analyze
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.rows import RAW_DDL, raw_row
from shoal_broker.metrics.records import MetricRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # two analyses; may start the JVM

INTERVAL_MS = 10_000
INTERVALS = 60
HEARTBEAT_MS = 30_000
START_MS = 1_800_000_000_000


def backlog_of(address: str, t: int) -> int:
    if address == 'stepping':  # grows in one interval of three, holds still in the others
        return 200 + 50 * (t // 3)
    return 200 + 10 * t  # rising: grows every interval


def records(*, left_out: bool) -> list[MetricRecord]:
    """One replica's records of two quiet entities (no traffic, no consumers); LEFT_OUT drops
    those the broker would, as ``reporting.RecordedFigures`` does."""
    found = []
    last: dict[str, tuple[int, int]] = {}  # address -> (backlog, ts) last written
    for t in range(INTERVALS):
        ts = START_MS + (t + 1) * INTERVAL_MS
        for address in ('stepping', 'rising'):
            backlog = backlog_of(address, t)
            before = last.get(address)
            if left_out and before and before[0] == backlog and ts - before[1] < HEARTBEAT_MS:
                continue
            last[address] = (backlog, ts)
            found.append(MetricRecord(
                ts_ms=ts, interval_ms=INTERVAL_MS, replica='shoal-0', address=address,
                subscription='queue', backlog=backlog,
            ))  # fmt: skip
    return found


def entities(
    spark: SparkSession, tmp_path: Path, *, left_out: bool
) -> dict[str, dict[str, object]]:
    lake = Lake(tmp_path / ('sparse' if left_out else 'dense'))
    rows = [
        raw_row(f'{r.ts_ms}-{i}', r.to_fields()) for i, r in enumerate(records(left_out=left_out))
    ]
    spark.createDataFrame(rows, schema=RAW_DDL).write.parquet(str(lake.raw))
    analyze(spark, lake, AnalysisParams())
    table = spark.read.parquet(str(lake.analysis / 'entities.parquet')).collect()
    return {row['address']: row.asDict() for row in table}


def test_left_out_records_read_as_unchanged_figures_not_as_gaps(
    spark: SparkSession, tmp_path: Path
) -> None:
    assert len(records(left_out=True)) < 0.7 * len(records(left_out=False))  # some were left out
    dense = entities(spark, tmp_path, left_out=False)
    sparse = entities(spark, tmp_path, left_out=True)
    for found in (dense, sparse):
        assert found['rising']['backlog_growing']
        assert not found['stepping']['backlog_growing']  # every sample grew, a third of the time
        assert found['stepping']['backlog'] == backlog_of('stepping', INTERVALS - 1)
        assert found['stepping']['backlog_samples'] >= INTERVALS - HEARTBEAT_MS // INTERVAL_MS
    for address in ('stepping', 'rising'):
        fractions = [found[address]['backlog_growing_fraction'] for found in (dense, sparse)]
        assert abs(fractions[0] - fractions[1]) < 0.05, (address, fractions)
