"""The metric record schema shared by the broker and the analytics job."""

import bisect
import json
import math
import random

import pytest

from shoal_broker.metrics import records, registry
from shoal_broker.metrics.records import AnalyticsSummary, Anomaly, MetricRecord
from shoal_broker.metrics.registry import Counters
from shoal_broker.routing.storage import Entry


def _record(**counts: int) -> MetricRecord:
    return MetricRecord.of(
        ts_ms=1_700_000_000_000, interval_ms=10_000, replica='r1', address='orders',
        subscription='queue', counts=counts, consumers=2, backlog=7,
        latency={-120: 1, 0: 2, 300: 3},
    )  # fmt: skip


def test_a_record_survives_the_trip_through_stream_fields() -> None:
    record = _record(enqueued=5, accepted=4, released=1)
    fields = record.to_fields()
    assert all(isinstance(v, str) for v in fields.values())
    assert MetricRecord.from_fields(fields) == record


def test_another_schema_version_is_refused() -> None:
    fields = _record().to_fields()
    fields['v'] = '999'
    with pytest.raises(ValueError, match='schema'):
        MetricRecord.from_fields(fields)


def test_a_schema_1_record_is_read_with_its_buckets_ending_at_30_s() -> None:
    """Records a replica wrote before its upgrade: its +Inf bucket holds every wait past 30 s."""
    fields = _record(accepted=3).to_fields()
    del fields['latency_sketch']
    old = {**fields, 'v': '1', 'latency_buckets': json.dumps([1] + [0] * 8 + [2])}
    record = MetricRecord.from_fields(old)
    assert record.latency_buckets == (1, *[0] * 8, 2)
    assert len(record.latency_buckets) == len(records.LATENCY_BOUNDS_V1) + 1
    assert record.to_fields() == old
    with pytest.raises(ValueError, match='buckets'):  # schema 1 with schema 2's buckets
        MetricRecord.from_fields({**old, 'latency_buckets': json.dumps([0] * 14)})


def test_unknown_counts_are_refused() -> None:
    with pytest.raises(ValueError, match='unknown counts'):
        _record(bogus=1)


def test_a_wrong_number_of_latency_buckets_is_refused() -> None:
    fields = _record().to_fields()
    fields['latency_buckets'] = '[1, 2]'
    with pytest.raises(ValueError, match='buckets'):
        MetricRecord.from_fields(fields)
    with pytest.raises(ValueError, match='buckets'):
        MetricRecord.from_fields({**fields, 'v': '2'})


def test_a_schema_2_record_is_read_with_its_buckets() -> None:
    fields = _record(accepted=3).to_fields()
    del fields['latency_sketch']
    old = {**fields, 'v': '2', 'latency_buckets': json.dumps([0] * 13 + [3])}
    record = MetricRecord.from_fields(old)
    assert record.latency_buckets == (0,) * 13 + (3,)
    assert record.latency_sketch == ()
    assert record.to_fields() == old


def test_the_sketch_is_written_compactly_and_a_bad_one_is_refused() -> None:
    fields = _record().to_fields()
    assert fields['latency_sketch'] == '-120:1 0:2 300:3'
    assert 'latency_buckets' not in fields
    for bad in ('1:0', '1:2 1:3', 'x:1', '1'):
        with pytest.raises(ValueError, match='latency_sketch'):
            MetricRecord.from_fields({**fields, 'latency_sketch': bad})


@pytest.mark.parametrize('seconds', [1e-4, 0.00123, 0.02, 1.0, 1.6, 99.0, 3600.0, 86_400.0])
def test_a_sketch_bucket_value_is_within_2_percent_of_every_wait_in_it(seconds: float) -> None:
    for wait in (seconds, seconds * 1.019, seconds * 0.981):
        value = records.sketch_value(records.sketch_index(wait))
        assert abs(value - wait) <= 0.02 * wait * (1 + 1e-9)


@pytest.mark.parametrize(
    ('seconds', 'bucket'),
    [
        (0.0, 0),
        (0.001, 0),
        (0.0011, 1),
        (0.05, 3),
        (30.0, 8),
        (30.1, 9),
        (54.8, 9),
        (61, 10),
        (3600, 12),
        (1e9, 13),
    ],
)
def test_latencies_fall_in_the_right_bucket(seconds: float, bucket: int) -> None:
    assert records.bucket_index(seconds) == bucket


def test_analytics_summary_round_trips_and_refuses_other_schemas() -> None:
    summary = AnalyticsSummary(
        generated_at_ms=3, window_start_ms=1, window_end_ms=2, records=10, current_replicas=2,
        recommended_replicas=3, reason='backlog grows on orders',
        anomalies=(Anomaly(flag='hot_replica', replica='r1', severity='critical', value=0.9),),
    )  # fmt: skip
    assert AnalyticsSummary.from_fields(summary.to_fields()) == summary
    with pytest.raises(ValueError, match='schema'):
        AnalyticsSummary.from_fields({**summary.to_fields(), 'v': '0'})
    with pytest.raises(ValueError, match='malformed'):
        AnalyticsSummary.from_fields({'v': '1', 'summary': '{"records": 1}'})


LATENCIES = [0.0, 0.0004, 0.0005, 0.0007, 0.001, 0.003, 0.005, 0.02, 0.05, 0.3, 0.5, 2, 5, 29,
             30, 31, 61, 299, 300, 301, 1e6]  # fmt: skip


@pytest.mark.parametrize('seconds', LATENCIES)
def test_an_accepted_delivery_counts_in_the_record_bucket_its_latency_falls_in(
    seconds: float,
) -> None:
    # Counters.accepted_all counts in C what records.sketch_index says; entries appended at 0 ms
    # (ids 0-1, 0-2) accepted at `seconds` are `seconds` old
    counters = Counters()
    entries = [Entry(f'0-{i}', 5, b'h', b'r', 0, 0) for i in (1, 2)]
    counters.accepted_all('records-test', 'queue', entries, seconds)
    tallies, latencies = counters.take()
    assert tallies[('records-test', 'queue')]['accepted'] == 2
    assert latencies[('records-test', 'queue')] == {records.sketch_index(seconds): 2}


def test_consumer_links_with_a_taken_name_or_named_like_the_aggregate_count_in_it() -> None:
    """Their own series would repeat another's labels in the exposition."""
    address = 'links-sharing-names'
    attached = [
        registry.link_attached(address, 'queue', name)
        for name in ('consumer', 'consumer', registry.OTHER_LINKS)
    ]
    for count, deliveries in enumerate(attached, start=1):
        deliveries.count += count
    samples = [
        s for s in registry.link_deliveries_family().samples if s.labels['address'] == address
    ]
    assert sorted((s.labels['link'], s.value) for s in samples) == [
        (registry.OTHER_LINKS, 5),
        ('consumer', 1),
    ]
    for deliveries in attached:
        registry.link_detached(deliveries)
    samples = [
        s for s in registry.link_deliveries_family().samples if s.labels['address'] == address
    ]
    assert [(s.labels['link'], s.value) for s in samples] == [(registry.OTHER_LINKS, 5)]


def _histogram_quantile(bounds: tuple[float, ...], waits: list[float], q: float) -> float:
    """Prometheus's ``histogram_quantile``: linear inside the bucket the rank falls in."""
    counts = [0] * (len(bounds) + 1)
    for wait in waits:
        counts[bisect.bisect_left(bounds, wait)] += 1
    rank, below, lower = q * len(waits), 0, 0.0
    for bound, count in zip(bounds, counts, strict=False):
        if below + count >= rank:
            return lower + (bound - lower) * (rank - below) / count
        below, lower = below + count, bound
    return bounds[-1]


@pytest.mark.parametrize(
    ('low', 'high'), [(1.0, 1.6), (0.2, 0.3), (0.022, 0.024), (50.0, 99.0), (0.001, 0.01)]
)
def test_histogram_quantile_over_the_delivery_buckets_is_within_about_10_percent(
    low: float, high: float
) -> None:
    """The narrow shapes are the hard ones: a whole distribution inside two or three buckets."""
    rng = random.Random(f'{low}-{high}')
    waits = sorted(rng.uniform(low, high) for _ in range(5000))
    for q in (0.5, 0.95, 0.99):
        truth = waits[math.ceil(q * len(waits)) - 1]
        estimate = _histogram_quantile(registry.DELIVERY_LATENCY_BUCKETS, waits, q)
        assert estimate == pytest.approx(truth, rel=0.125), q
