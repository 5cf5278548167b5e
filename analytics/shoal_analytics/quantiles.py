"""
Latency percentiles from the records' sketches, merged exactly, as Spark column expressions.

A record's sketch (``records.latency_sketch``) counts waits per logarithmic bucket index; merging
sketches is adding counts per index, so any grouping (a window, the lookback, a replica) is
exact. A percentile is the nearest rank: the value of the first bucket, in index order, whose
cumulative count reaches q of the total; it is within 2 % of the true percentile of the waits.
Expressions and a window sum, not a Python UDF, so the work stays in the JVM.

Records written before the sketch (schemas 1 and 2) count waits per fixed upper bound. They are
turned into sketches: a bucket's count goes to the sketch index of its upper bound (all that is
known of those waits is that they were at most that), and the +Inf bucket's to an index of its
own past every real one (``CAPPED``), which answers the largest bound, marked as a lower bound
(``anomalies.is_capped``): 30 s for schema 1, an hour for schema 2.
"""

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from shoal_broker.metrics.records import (
    LATENCY_BOUNDS,
    LATENCY_BOUNDS_V1,
    SKETCH_GAMMA,
    sketch_index,
)

QUANTILES = {'p50_ms': 0.50, 'p95_ms': 0.95, 'p99_ms': 0.99}
TOP_BOUND_MS = LATENCY_BOUNDS[-1] * 1000
"""The answer of a rank in a schema 2 record's +Inf bucket."""
V1_TOP_MS = LATENCY_BOUNDS_V1[-1] * 1000
"""The answer of a rank in a schema 1 record's +Inf bucket (waits beyond 30 s)."""
CAPPED = 1_000_000
"""Sketch indices from here on are old records' +Inf buckets: ``CAPPED + index of the bound``."""
SKETCH = 'latency'
"""The sketch column of the records ``select_span`` selects."""
INDEX, COUNT = 'lat_index', 'lat_count'


def _old_buckets(bounds: tuple[float, ...]) -> list[int]:
    return [*(sketch_index(b) for b in bounds), CAPPED + sketch_index(bounds[-1])]


def record_sketch(raw: DataFrame) -> Column:
    """A raw record's sketch: its own (schema 3), or the one its old buckets make."""
    buckets = F.col('latency_buckets')
    old = F.when(
        F.size(buckets) == len(LATENCY_BOUNDS_V1) + 1,
        F.map_from_arrays(F.array(*map(F.lit, _old_buckets(LATENCY_BOUNDS_V1))), buckets),
    ).when(
        F.size(buckets) == len(LATENCY_BOUNDS) + 1,
        F.map_from_arrays(F.array(*map(F.lit, _old_buckets(LATENCY_BOUNDS))), buckets),
    )
    if 'latency_sketch' not in raw.columns:  # a lake ingested before the sketch
        return old.alias(SKETCH)
    return F.coalesce(F.col('latency_sketch'), old).alias(SKETCH)


def sketch_rows(records: DataFrame, *keys: str) -> DataFrame:
    """The records' sketches merged per KEYS: one row per (KEYS, bucket index) with its count."""
    return (
        records.select(*keys, F.explode(SKETCH).alias(INDEX, COUNT))
        .where(F.col(COUNT) > 0)
        .groupBy(*keys, INDEX)
        .agg(F.sum(COUNT).alias(COUNT))
    )


def _value_ms(index: Column) -> Column:
    """The bucket's value (``records.sketch_value``), or an old record's largest bound."""
    return (
        F.when(index == CAPPED + sketch_index(LATENCY_BOUNDS_V1[-1]), F.lit(V1_TOP_MS))
        .when(index == CAPPED + sketch_index(LATENCY_BOUNDS[-1]), F.lit(TOP_BOUND_MS))
        .otherwise(F.lit(2000 / (SKETCH_GAMMA + 1)) * F.pow(F.lit(SKETCH_GAMMA), index))
    )


def percentiles(sketches: DataFrame, *keys: str) -> DataFrame:
    """Per KEYS (of ``sketch_rows`` rows, merged further if KEYS are fewer): ``p50_ms``,
    ``p95_ms``, ``p99_ms`` and ``latency_samples``."""
    merged = sketches.groupBy(*keys, INDEX).agg(F.sum(COUNT).alias(COUNT))
    ordered = Window.partitionBy(*keys).orderBy(INDEX)
    everything = Window.partitionBy(*keys)
    ranked = merged.select(
        *keys,
        INDEX,
        F.sum(COUNT).over(ordered.rowsBetween(Window.unboundedPreceding, 0)).alias('cum'),
        F.sum(COUNT).over(everything).alias('total'),
    )
    return ranked.groupBy(*keys).agg(
        *(
            _value_ms(F.min(F.when(F.col('cum') >= F.col('total') * q, F.col(INDEX)))).alias(name)
            for name, q in QUANTILES.items()
        ),
        F.max('total').alias('latency_samples'),
    )


def with_percentiles(frame: DataFrame, sketches: DataFrame, *keys: str) -> DataFrame:
    """FRAME with the percentiles of SKETCHES per KEYS (null where no wait was recorded)."""
    return frame.join(percentiles(sketches, *keys), list(keys), 'left')
