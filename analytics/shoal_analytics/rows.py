"""
The raw table: one row per stream entry, the ``MetricRecord`` fields plus the entry id.

A malformed entry is not dropped and does not stop the ingest: it lands with ``error`` set and
its fields null, so nothing is lost and the analysis counts and skips it.
"""

import dataclasses
from collections.abc import Mapping

from shoal_broker.metrics.records import COUNTS, MetricRecord

STRING_FIELDS = ('replica', 'address', 'subscription', 'cr_namespace', 'cr_name')
LONG_FIELDS = ('ts_ms', 'interval_ms', *COUNTS, 'consumers', 'backlog')

RAW_DDL = ', '.join(
    [
        'stream_id STRING',
        *(f'{name} {"STRING" if name in STRING_FIELDS else "BIGINT"}'
          for name in (f.name for f in dataclasses.fields(MetricRecord))
          if name not in ('latency_buckets', 'latency_sketch')),
        'latency_buckets ARRAY<BIGINT>',
        'latency_sketch MAP<INT, BIGINT>',
        'error STRING',
    ]
)  # fmt: skip
"""Spark DDL of the raw table, in the column order of ``raw_row``."""

RAW_COLUMNS = tuple(part.split(' ')[0] for part in RAW_DDL.replace('<INT, ', '<INT,').split(', '))

_BUCKETS_INDEX = RAW_COLUMNS[1:-1].index('latency_buckets')
_SKETCH_INDEX = RAW_COLUMNS[1:-1].index('latency_sketch')

RawRow = tuple[object, ...]


def raw_row(stream_id: str, fields: Mapping[str, str]) -> RawRow:
    """The raw row of one stream entry (``error`` set, fields null, when it does not parse)."""
    try:
        record = MetricRecord.from_fields(fields)
    except (ValueError, TypeError) as exc:
        return (stream_id, *([None] * (len(RAW_COLUMNS) - 2)), f'{type(exc).__name__}: {exc}')
    # getattr, not dataclasses.asdict: asdict deep-copies and cost most of the ingest's CPU.
    values = [getattr(record, name) for name in RAW_COLUMNS[1:-1]]
    # a record has either (schema 3: the sketch; 1 and 2: the buckets); the other is null
    values[_BUCKETS_INDEX] = list(record.latency_buckets) or None
    values[_SKETCH_INDEX] = dict(record.latency_sketch) if not record.latency_buckets else None
    return (stream_id, *values, None)
