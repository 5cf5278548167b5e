"""Offset arithmetic and raw rows of the stream data source (no Spark, no Redis)."""

import pytest

from shoal_analytics.offsets import (
    MAX_SEQ,
    DataLossError,
    Offset,
    StreamId,
    check_not_trimmed,
    split_range,
)
from shoal_analytics.rows import RAW_COLUMNS, raw_row
from shoal_broker.metrics.records import MetricRecord


def test_split_range_covers_the_half_open_range_without_overlap() -> None:
    slices = split_range(StreamId(1000, 3), StreamId(1010, 2), 3)
    assert slices == [
        ('(1000-3', f'1003-{MAX_SEQ}'),
        (f'(1003-{MAX_SEQ}', f'1006-{MAX_SEQ}'),
        (f'(1006-{MAX_SEQ}', '1010-2'),
    ]


def test_split_range_of_one_millisecond_or_nothing() -> None:
    assert split_range(StreamId(5, 1), StreamId(5, 9), 4) == [('(5-1', '5-9')]
    assert split_range(StreamId(5, 9), StreamId(5, 9), 4) == []


def test_offsets_round_trip_through_the_checkpoint_json() -> None:
    offset = Offset(StreamId(1700000000000, 12), 345)
    assert Offset.from_json(offset.to_json()) == offset
    assert Offset.from_json({'id': '7-0', 'n': 3}) == Offset(StreamId(7, 0), 3)
    with pytest.raises(ValueError, match='not a stream id'):
        StreamId.parse('seven-0')


def test_trimming_is_data_loss_only_past_what_was_read() -> None:
    read_up_to = Offset(StreamId(9, 0), 100)
    check_not_trimmed('s', read_up_to, entries_added=150, length=50)  # trimmed 100: all read
    with pytest.raises(DataLossError, match=r'30 entries .* trimmed before being read'):
        check_not_trimmed('s', read_up_to, entries_added=150, length=20)


def test_a_record_becomes_a_raw_row_and_a_malformed_one_keeps_its_id() -> None:
    record = MetricRecord(
        ts_ms=2000, interval_ms=1000, replica='r', address='a', subscription='queue', enqueued=3,
        latency_buckets=(1,) * 10,
    )  # fmt: skip
    row = dict(zip(RAW_COLUMNS, raw_row('1-0', record.to_fields()), strict=True))
    assert row['stream_id'] == '1-0'
    assert row['enqueued'] == 3
    assert row['latency_buckets'] == [1] * 10
    assert row['error'] is None
    bad = dict(zip(RAW_COLUMNS, raw_row('2-0', {'v': '1', 'ts_ms': 'soon'}), strict=True))
    assert bad['stream_id'] == '2-0'
    assert bad['ts_ms'] is None
    assert 'ValueError' in bad['error']
