"""
Latency percentiles from summed bucket counts, as Spark column expressions.

Prometheus ``histogram_quantile`` semantics: linear interpolation inside the bucket the rank falls
in (the first bucket starts at 0), and a rank in the +Inf bucket answers the largest finite bound,
because nothing better is known. Expressions, not a Python UDF, so they stay in the JVM.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shoal_broker.metrics.records import LATENCY_BOUNDS

BUCKETS = len(LATENCY_BOUNDS) + 1
QUANTILES = {'p50_ms': 0.50, 'p95_ms': 0.95, 'p99_ms': 0.99}


def bucket_column(index: int) -> str:
    return f'lat_b{index}'


def summed_buckets() -> list[Column]:
    """Aggregations summing each bucket column (use inside ``agg``)."""
    return [F.sum(bucket_column(i)).alias(bucket_column(i)) for i in range(BUCKETS)]


def _cumulative_column(index: int) -> str:
    return f'lat_cum{index}'


def quantile_ms(q: float) -> Column:
    """
    The q-quantile in milliseconds of the bucket columns; null when they hold no sample.

    Reads the cumulative columns ``with_quantiles`` adds: spelling the running sums out inside
    every branch would grow the expression quadratically (seconds of code generation per query).
    """
    counts = [F.coalesce(F.col(bucket_column(i)), F.lit(0)) for i in range(BUCKETS)]
    cumulative = [F.col(_cumulative_column(i)) for i in range(BUCKETS)]
    total = cumulative[-1]
    rank = total * F.lit(q)
    expression = F.when(total == 0, F.lit(None).cast('double'))
    lower = 0.0
    for index, bound in enumerate(LATENCY_BOUNDS):
        below = cumulative[index - 1] if index else F.lit(0)
        inside = (rank - below) / F.nullif(counts[index], F.lit(0))
        expression = expression.when(
            cumulative[index] >= rank, F.lit(lower * 1000) + F.lit((bound - lower) * 1000) * inside
        )
        lower = bound
    return expression.otherwise(F.lit(LATENCY_BOUNDS[-1] * 1000))


def with_quantiles(frame: DataFrame) -> DataFrame:
    """``frame`` (with the bucket columns) plus ``p50_ms``, ``p95_ms`` and ``p99_ms``."""
    cumulative = frame
    for index in range(BUCKETS):
        count = F.coalesce(F.col(bucket_column(index)), F.lit(0))
        previous = F.col(_cumulative_column(index - 1)) if index else F.lit(0)
        cumulative = cumulative.withColumn(_cumulative_column(index), previous + count)
    quantiles = cumulative.select(
        '*', *(quantile_ms(q).alias(name) for name, q in QUANTILES.items())
    )
    return quantiles.drop(*(_cumulative_column(i) for i in range(BUCKETS)))
