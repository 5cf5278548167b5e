"""
``shoal-analytics ingest``: land the metrics stream as raw Parquet, exactly once.

A streaming query with ``Trigger.AvailableNow`` reads what the stream holds when the run starts
(in micro-batches of at most ``max_records_per_batch``) and stops. Exactly once comes from three
parts together: replayable offsets (stream ids), the checkpoint (its offset log is written before
a batch runs, its commit log after), and Spark's file sink, which records each batch's files in
``raw/_spark_metadata`` and skips a batch it already holds when a restarted run replays it.
"""

import dataclasses

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from shoal_analytics.errors import IngestError
from shoal_analytics.lake import Lake
from shoal_analytics.offsets import DataLossError
from shoal_analytics.preflight import split_password
from shoal_analytics.source import DEFAULT_PASSWORD_ENV, NAME
from shoal_broker.store.keys import METRICS


@dataclasses.dataclass(frozen=True)
class IngestResult:
    batches: int
    rows: int


def ingest(
    spark: SparkSession,
    lake: Lake,
    redis_url: str,
    *,
    stream: str = METRICS,
    max_records_per_batch: int | None = None,
    partitions: int = 2,
) -> IngestResult:
    """Read everything the stream holds now into ``lake.raw``; returns what this run landed."""
    url, password = split_password(redis_url)
    if password is not None:
        raise IngestError(
            f'put the Redis password in ${DEFAULT_PASSWORD_ENV}, not in the URL (the CLI does this)'
        )
    reader = (
        spark.readStream.format(NAME)
        .option('url', url)
        .option('stream', stream)
        .option('numPartitions', str(partitions))
    )
    if max_records_per_batch:
        reader = reader.option('maxRecordsPerBatch', str(max_records_per_batch))
    frame = reader.load().withColumn('date', F.to_date(F.timestamp_millis(F.col('ts_ms'))))
    query = (
        frame.writeStream.format('parquet')
        .option('path', str(lake.raw))
        .option('checkpointLocation', str(lake.checkpoint))
        .partitionBy('date')
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    except StreamingQueryException as exc:
        raise IngestError(_cause(exc)) from exc
    progress = query.recentProgress
    landed = [p for p in progress if p['numInputRows']]
    return IngestResult(batches=len(landed), rows=sum(int(p['numInputRows']) for p in landed))


def _cause(exc: StreamingQueryException) -> str:
    """The useful line of a streaming failure (the data source's own error when it has one)."""
    text = str(exc)
    marker = DataLossError.__name__ + ': '
    if marker in text:
        return 'data loss: ' + text.split(marker, 1)[1].splitlines()[0]
    traceback = 'Traceback (most recent call last):'
    if traceback in text:
        # The data source raised in a Python worker: Spark quotes its traceback, whose last
        # exception line (the first unindented one after the last header) says what went wrong.
        quoted = text.rsplit(traceback, 1)[1].splitlines()
        raised = next((line for line in quoted if line.strip() and not line[0].isspace()), '')
        if raised:
            return f'reading the stream failed: {raised}'
    return text.splitlines()[0] if text else type(exc).__name__
