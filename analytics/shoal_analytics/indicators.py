"""
The indicators of one analysis, as Spark DataFrames over the raw records.

Records are deltas per (replica, entity, interval), so sums are additive across replicas and
windows; ``backlog`` is a cluster-wide gauge every replica samples, so the newest sample wins;
``consumers`` is a per-replica gauge. A record belongs to the window holding its interval's
midpoint; a window is complete once the records cover it from its start to its end (the first
and the newest window are partial, and judging them would see a rate rise or dip).

The records are scanned into *cells*: one row per (window, entity, replica). Every other table
but one is an aggregate of the cells, which are a few times smaller than the records. The
exception is the backlog, a gauge: its samples (one per entity and record interval, the newest
replica's) are kept as they are, so its trend needs no complete windows (a backlog that grows
for two minutes has a dozen samples, not one complete minute-window) and its newest value is
the one the broker shows.

A broker writes the record of a quiet entity (no activity, backlog and consumers unchanged) only
every heartbeat (``SHOAL_METRICS_HEARTBEAT_SECONDS``, 30 s: at most half a window), so every
window still holds a record of every entity and replica, and a missing interval means "as
before", never zero or gone: sums lose nothing (a left-out record's deltas are all 0), gauges
take the newest value, and the backlog's trend counts the intervals between its samples.

A topic's publishes are recorded under the topic with an empty subscription (``TOPIC``): they are
what arrives at each of its subscriptions, whose own records count no enqueues, so a
subscription's ``enqueued`` is the topic's (less what its selector filtered out) and the topic's
own record is not an entity of the tables.
"""

import dataclasses

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from shoal_analytics.params import AnalysisParams
from shoal_analytics.quantiles import record_sketch, with_percentiles
from shoal_broker.metrics.records import COUNTS

ENTITY = ('address', 'subscription')
TOPIC = ''
"""The subscription of a topic's publish records (``Counters.enqueued`` for a topic)."""
QUEUE = 'queue'
PRIVATE = 'private'
"""Plain topic subscribers' private subscriptions, recorded together (one per consumer)."""


@dataclasses.dataclass(frozen=True)
class Span:
    start_ms: int
    """Start of the lookback."""
    end_ms: int
    """The newest record's end."""
    malformed: int
    data_start_ms: int
    """Where the records of the lookback begin (the first one's interval start)."""


def _nonzero(column: Column) -> Column:
    return F.nullif(column, F.lit(0))


def _sums(*names: str) -> list[Column]:
    return [F.sum(name).alias(name) for name in names]


def _ratios(frame: DataFrame) -> DataFrame:
    returned = F.col('released') + F.col('modified')
    return frame.withColumn('redelivery_ratio', returned / _nonzero(F.col('delivered'))).withColumn(
        'expiry_ratio', F.col('expired') / _nonzero(F.col('enqueued'))
    )


def select_span(raw: DataFrame, params: AnalysisParams) -> tuple[DataFrame, Span]:
    """The well-formed records of the lookback ending at the newest one, with their window. A
    window is complete when the records cover all of it: it starts no earlier than the data
    (or the lookback) and ends no later than the newest record, so neither a first window the
    records only half cover nor the newest, still filling, reads as a dip."""
    well_formed = F.col('error').isNull()
    stats = raw.agg(
        F.max('ts_ms').alias('end_ms'),
        F.min(F.when(well_formed, F.col('ts_ms') - F.col('interval_ms'))).alias('first_ms'),
        F.count(F.when(~well_formed, 1)).alias('malformed'),
    ).first()
    assert stats is not None
    end_ms = int(stats['end_ms'] or 0)
    start_ms = end_ms - params.lookback_minutes * 60_000
    data_start_ms = max(
        int(stats['first_ms'] if stats['first_ms'] is not None else end_ms), start_ms
    )
    window_ms = params.window_seconds * 1000
    midpoint = F.col('ts_ms') - F.col('interval_ms') / 2
    window_start = (F.floor(midpoint / window_ms) * window_ms).cast('long')
    complete = (window_start >= data_start_ms) & (window_start + window_ms <= end_ms)
    records = raw.where(well_formed & (F.col('ts_ms') > start_ms)).select(
        window_start.alias('window_start_ms'),
        complete.alias('complete'),
        'ts_ms', 'interval_ms', *ENTITY, 'replica', *COUNTS, 'consumers', 'backlog',
        record_sketch(raw),
    )  # fmt: skip
    return records, Span(start_ms, end_ms, int(stats['malformed']), data_start_ms)


def cells(records: DataFrame) -> DataFrame:
    """Per (window, entity, replica): summed deltas and buckets, the newest gauges."""
    known_backlog = F.when(F.col('backlog') >= 0, F.col('ts_ms'))
    return records.groupBy('window_start_ms', 'complete', *ENTITY, 'replica').agg(
        F.count('*').alias('records'),
        *_sums(*COUNTS),
        F.max_by('consumers', 'ts_ms').alias('consumers'),
        F.max('consumers').alias('consumers_max'),
        F.max_by('backlog', known_backlog).alias('backlog'),
        F.max(known_backlog).alias('backlog_ts'),
    )


def backlog_samples(records: DataFrame) -> DataFrame:
    """Per entity and record interval: the newest known backlog (``ts_ms``, ``backlog``,
    ``interval_ms``). Every replica samples the same cluster-wide gauge, so one sample per
    interval is kept. A broker leaves out the record of a quiet entity whose backlog did not
    change (up to its heartbeat), so between two samples the backlog held the earlier one's value
    until the later one's interval."""
    known = records.where((F.col('backlog') >= 0) & (F.col('subscription') != TOPIC))
    return (
        known.groupBy(*ENTITY, F.floor(F.col('ts_ms') / F.col('interval_ms')).alias('tick'))
        .agg(
            F.max('ts_ms').alias('ts_ms'),
            F.max_by('backlog', 'ts_ms').alias('backlog'),
            F.max('interval_ms').alias('interval_ms'),
        )
        .drop('tick')
    )


def entity_windows(cells: DataFrame, sketches: DataFrame, params: AnalysisParams) -> DataFrame:
    """Per (window, address, subscription): rates, ratios, backlog, consumers, percentiles (of
    SKETCHES, ``quantiles.sketch_rows`` per window and entity). A topic subscription's
    ``enqueued`` is what the topic received (times its consumers for the private subscriptions,
    one each), less what it filtered out."""
    seconds = float(params.window_seconds)
    windows = cells.groupBy('window_start_ms', 'complete', *ENTITY).agg(
        *_sums(*COUNTS, 'consumers', 'consumers_max'),
        F.max_by('backlog', 'backlog_ts').alias('backlog'),
        F.count('replica').alias('replicas'),
    )
    published = windows.where(F.col('subscription') == TOPIC).select(
        'window_start_ms', 'address', F.col('enqueued').alias('published')
    )
    copies = F.when(F.col('subscription') == PRIVATE, F.greatest(F.col('consumers'), F.lit(1)))
    arrived = F.greatest(
        F.col('published') * F.coalesce(copies, F.lit(1)) - F.col('filtered'), F.lit(0)
    )
    windows = (
        windows.where(F.col('subscription') != TOPIC)
        .join(published, ['window_start_ms', 'address'], 'left')
        .withColumn(
            'enqueued',
            F.when(
                (F.col('subscription') != QUEUE) & F.col('published').isNotNull(), arrived
            ).otherwise(F.col('enqueued')),
        )
        .drop('published')
        .withColumn('in_rate', F.col('enqueued') / seconds)
        .withColumn('out_rate', F.col('accepted') / seconds)
    )
    return with_percentiles(_ratios(windows), sketches, 'window_start_ms', *ENTITY)


def entity_summary(
    windows: DataFrame, samples: DataFrame, sketches: DataFrame, params: AnalysisParams
) -> DataFrame:
    """Per entity over the lookback: totals, ratios, percentiles (the window SKETCHES merged);
    the backlog's trend over its samples and its newest value; rates of the newest complete
    window; consumers of the newest window, the most in any window and the fraction of the
    windows with something to deliver that had any (a consumer attached all along is slow, not
    absent); time to drain."""
    totals = with_percentiles(
        _ratios(windows.groupBy(*ENTITY).agg(*_sums(*COUNTS))), sketches, *ENTITY
    )
    by_time = Window.partitionBy(*ENTITY).orderBy('ts_ms')
    # the intervals from the previous sample to this one (1 when no record was left out): the
    # backlog grew in at most the last of them, and held still in the others
    since = F.col('ts_ms') - F.lag('ts_ms').over(by_time)
    steps = F.when(since.isNotNull(), F.greatest(F.round(since / F.col('interval_ms')), F.lit(1)))
    stepped = (
        samples.withColumn('previous', F.lag('backlog').over(by_time))
        .withColumn('steps', steps)
        .withColumn('t_s', F.col('ts_ms') / 1000)
    )
    grew = (F.col('backlog') > F.col('previous')).cast('int')
    trend = stepped.groupBy(*ENTITY).agg(
        (F.lit(1) + F.coalesce(F.sum('steps'), F.lit(0))).cast('long').alias('backlog_samples'),
        F.regr_slope('backlog', 't_s').alias('backlog_slope_per_s'),
        (F.sum(F.when(F.col('previous').isNotNull(), grew)) / _nonzero(F.sum('steps'))).alias(
            'backlog_growing_fraction'
        ),
        F.max_by('backlog', 'ts_ms').alias('backlog'),
        F.max('ts_ms').alias('backlog_ts_ms'),
    )
    rates = (
        windows.where('complete')
        .groupBy(*ENTITY)
        .agg(
            F.max_by('in_rate', 'window_start_ms').alias('in_rate'),
            F.max_by('out_rate', 'window_start_ms').alias('out_rate'),
        )
    )
    consumers = windows.groupBy(*ENTITY).agg(  # a gauge: the newest window's, complete or not
        F.max_by('consumers', 'window_start_ms').alias('consumers'),
        F.max('consumers_max').alias('consumers_max'),
        # of the windows with something to deliver: after its traffic ends, a queue whose
        # consumer left is not one that had none
        F.avg(
            F.when(
                (F.col('enqueued') > 0) | (F.col('delivered') > 0) | (F.col('backlog') > 0),
                (F.col('consumers_max') > 0).cast('double'),
            )
        ).alias('consumer_presence'),
    )
    drain = F.col('out_rate') - F.col('in_rate')
    return (
        totals.join(trend, list(ENTITY), 'left')
        .join(rates, list(ENTITY), 'left')
        .join(consumers, list(ENTITY), 'left')
        .withColumn(
            'time_to_drain_s',
            F.when(F.col('backlog') == 0, F.lit(0.0)).when(
                drain > 0, F.col('backlog') / _nonzero(drain)
            ),
        )
        .withColumn(
            'backlog_growing',
            F.coalesce(
                (F.col('backlog_samples') >= params.min_backlog_samples)
                & (F.col('backlog_slope_per_s') > 0)
                & (F.col('backlog_growing_fraction') >= params.backlog_growing_fraction)
                & (F.col('backlog') >= params.backlog_min),
                F.lit(False),
            ),
        )
    )


def fairness(cells: DataFrame, params: AnalysisParams) -> DataFrame:
    """
    Per entity: how evenly deliveries spread over the consumers of different replicas.

    Records are per replica, so the unit of fairness is a replica's consumers: deliveries per
    consumer on each replica that had consumers (Gini, max/min, the least served replica, and
    starvation = some replica's consumers get less than ``starved_fraction`` of the mean). A
    replica's consumers are averaged over the windows it had any, so per consumer is never more
    than it delivered.
    """
    per_replica = (
        cells.where(F.col('subscription') != TOPIC)
        .groupBy(*ENTITY, 'replica')
        .agg(
            F.sum('delivered').alias('delivered'),
            F.avg(F.when(F.col('consumers') > 0, F.col('consumers'))).alias('consumers'),
        )
        .where(F.col('consumers') > 0)
        .withColumn('per_consumer', F.col('delivered') / F.col('consumers'))
    )
    ranked = per_replica.withColumn(
        'rank', F.row_number().over(Window.partitionBy(*ENTITY).orderBy('per_consumer', 'replica'))
    )
    n = F.col('replicas')
    high, low = F.col('max_per_consumer'), F.col('min_per_consumer')
    total = F.col('total_per_consumer')
    mean = total / n
    return (
        ranked.groupBy(*ENTITY)
        .agg(
            F.count('*').alias('replicas'),
            F.sum('delivered').alias('delivered'),
            F.sum('per_consumer').alias('total_per_consumer'),
            F.sum(F.col('rank') * F.col('per_consumer')).alias('ranked_sum'),
            F.max('per_consumer').alias('max_per_consumer'),
            F.min('per_consumer').alias('min_per_consumer'),
            F.min_by('replica', F.struct('per_consumer', 'replica')).alias('least_served_replica'),
        )
        .withColumn('mean_per_consumer', mean)
        .withColumn(
            'gini',
            F.coalesce(2 * F.col('ranked_sum') / (n * _nonzero(total)) - (n + 1) / n, F.lit(0.0)),
        )
        .withColumn('max_min_ratio', high / _nonzero(low))
        .withColumn(
            'starved',
            (n >= 2)
            & (F.col('delivered') >= params.min_deliveries)
            & (F.col('min_per_consumer') < F.lit(params.starved_fraction) * mean),
        )
        .drop('ranked_sum', 'total_per_consumer')
    )


def entity_replica_shares(cells: DataFrame) -> DataFrame:
    """Per entity and replica: deliveries and the replica's share of the entity's deliveries,
    with the replica's mean consumers while it had any (a 2:1 split may be 2:1 consumers)."""
    per_replica = (
        cells.where(F.col('subscription') != TOPIC)
        .groupBy(*ENTITY, 'replica')
        .agg(
            F.sum('delivered').alias('delivered'),
            F.avg(F.when(F.col('consumers') > 0, F.col('consumers'))).alias('consumers'),
        )
        .where(F.col('delivered') > 0)
    )
    entity = Window.partitionBy(*ENTITY)
    return per_replica.withColumn(
        'share', F.col('delivered') / F.sum('delivered').over(entity)
    ).withColumn('replicas', F.count('*').over(entity))


def replica_windows(cells: DataFrame, params: AnalysisParams) -> DataFrame:
    """Per (window, replica): transfers per second and the replica's share of the cluster's."""
    seconds = float(params.window_seconds)
    per_window = Window.partitionBy('window_start_ms')
    return (
        cells.groupBy('window_start_ms', 'complete', 'replica')
        .agg(
            (F.sum('enqueued') + F.sum('delivered')).alias('transfers'),
            F.count('*').alias('entities'),
            F.sum('records').alias('records'),
        )
        .withColumn('transfers_per_s', F.col('transfers') / seconds)
        .withColumn('share', F.col('transfers') / _nonzero(F.sum('transfers').over(per_window)))
    )


def replica_share(replica_windows: DataFrame) -> DataFrame:
    """Per replica over the lookback: transfers and share of the cluster's transfers."""
    per_replica = replica_windows.groupBy('replica').agg(
        F.sum('transfers').alias('transfers'), F.sum('records').alias('records')
    )
    total = per_replica.agg(F.sum('transfers').alias('cluster_transfers'))
    return (
        per_replica.crossJoin(total)
        .withColumn('share', F.col('transfers') / _nonzero(F.col('cluster_transfers')))
        .drop('cluster_transfers')
    )


def cluster_rates(replica_load: DataFrame) -> DataFrame:
    """Per complete window: the cluster's transfers per second and the replicas that reported."""
    return (
        replica_load.where('complete')
        .groupBy('window_start_ms')
        .agg(
            F.sum('transfers_per_s').alias('transfers_per_s'),
            F.count('replica').alias('replicas'),
        )
    )
