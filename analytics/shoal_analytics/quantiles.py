"""
Latency percentiles from summed bucket counts, as Spark column expressions.

Prometheus ``histogram_quantile`` semantics: linear interpolation inside the bucket the rank falls
in (the first bucket starts at 0), and a rank in the +Inf bucket answers the largest finite bound,
because nothing better is known. Expressions, not a Python UDF, so they stay in the JVM.

Records of schema 1 (``records.LATENCY_BOUNDS_V1``, buckets up to 30 s) share the columns of the
bounds they have; what they counted beyond 30 s has a column of its own (``OVER_V1_TOP``), ranked
after 30 s, and a rank in it answers 30 s: all that is known of those waits.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shoal_broker.metrics.records import LATENCY_BOUNDS, LATENCY_BOUNDS_V1

BUCKETS = len(LATENCY_BOUNDS) + 1
QUANTILES = {'p50_ms': 0.50, 'p95_ms': 0.95, 'p99_ms': 0.99}
TOP_BOUND_MS = LATENCY_BOUNDS[-1] * 1000
"""The answer of a rank in the +Inf bucket (``anomalies.is_capped``)."""
V1_TOP_MS = LATENCY_BOUNDS_V1[-1] * 1000
"""The answer of a rank among schema 1's waits beyond its largest bound."""
OVER_V1_TOP = 'lat_b_v1_over'
"""Schema 1's +Inf bucket: waits beyond 30 s, how far beyond unknown."""


def bucket_column(index: int) -> str:
    return f'lat_b{index}'


_V1_SPLIT = len(LATENCY_BOUNDS_V1)
RANKED = (
    *(bucket_column(i) for i in range(_V1_SPLIT)),
    OVER_V1_TOP,
    *(bucket_column(i) for i in range(_V1_SPLIT, BUCKETS)),
)
"""Every bucket column in the order of the waits they count."""


def bucket_columns(buckets: Column) -> list[Column]:
    """The bucket columns of a record's ``latency_buckets`` array, whichever schema wrote it (the
    array's length tells)."""
    v1 = F.size(buckets) == _V1_SPLIT + 1
    zero = F.lit(0).cast('long')
    return [
        *(F.get(buckets, i).alias(bucket_column(i)) for i in range(_V1_SPLIT)),
        F.when(v1, F.get(buckets, _V1_SPLIT)).otherwise(zero).alias(OVER_V1_TOP),
        *(F.when(v1, zero).otherwise(F.get(buckets, i)).alias(bucket_column(i))
          for i in range(_V1_SPLIT, BUCKETS)),
    ]  # fmt: skip


def summed_buckets() -> list[Column]:
    """Aggregations summing each bucket column (use inside ``agg``)."""
    return [F.sum(name).alias(name) for name in RANKED]


def _cumulative_column(name: str) -> str:
    return f'{name}_cum'


def quantile_ms(q: float) -> Column:
    """
    The q-quantile in milliseconds of the bucket columns; null when they hold no sample.

    Reads the cumulative columns ``with_quantiles`` adds: spelling the running sums out inside
    every branch would grow the expression quadratically (seconds of code generation per query).
    """
    counts = {name: F.coalesce(F.col(name), F.lit(0)) for name in RANKED}
    total = F.col(_cumulative_column(RANKED[-1]))
    rank = total * F.lit(q)
    expression = F.when(total == 0, F.lit(None).cast('double'))
    lower, below = 0.0, F.lit(0)
    bounds = iter(LATENCY_BOUNDS)
    for name in RANKED[:-1]:  # the last is +Inf: ``otherwise``
        cumulative = F.col(_cumulative_column(name))
        if name == OVER_V1_TOP:
            expression = expression.when(cumulative >= rank, F.lit(V1_TOP_MS))
        else:
            bound = next(bounds)
            inside = (rank - below) / F.nullif(counts[name], F.lit(0))
            expression = expression.when(
                cumulative >= rank,
                F.lit(lower * 1000) + F.lit((bound - lower) * 1000) * inside,
            )
            lower = bound
        below = cumulative
    return expression.otherwise(F.lit(TOP_BOUND_MS))


def with_quantiles(frame: DataFrame) -> DataFrame:
    """``frame`` (with the bucket columns) plus ``p50_ms``, ``p95_ms`` and ``p99_ms``."""
    cumulative, previous = frame, F.lit(0)
    for name in RANKED:
        count = F.coalesce(F.col(name), F.lit(0)) if name in frame.columns else F.lit(0)
        cumulative = cumulative.withColumn(_cumulative_column(name), previous + count)
        previous = F.col(_cumulative_column(name))
    quantiles = cumulative.select(
        '*', *(quantile_ms(q).alias(name) for name, q in QUANTILES.items())
    )
    return quantiles.drop(*(_cumulative_column(name) for name in RANKED))
