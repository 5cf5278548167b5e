"""
The metric record: one per entity (queue or subscription) per interval, per replica.

The schema shared by the broker, which appends records to a bounded Redis stream, and the
analytics package, which reads that stream into Spark. Pure (stdlib only) so both can import it.
Counts are deltas over the interval; ``consumers`` and ``backlog`` are gauges at its end.

``latency_sketch`` (schema 3) counts accepted deliveries per logarithmic bucket, as DDSketch does:
bucket ``i`` holds the waits in (g^(i-1), g^i] seconds with g = (1 + a)/(1 - a) and a = 0.02,
so the bucket's representative value ``sketch_value(i)`` is within 2 % of every wait in it, from
0.1 ms to days. Only the buckets that counted something are written. Sketches merge exactly by
adding counts per index, in any order: the analytics job sums them per entity and window and reads
percentiles from the sums, still within 2 % of the true (nearest-rank) percentile.

Records of schemas 1 and 2 have ``latency_buckets`` instead: counts per fixed upper bound
(``LATENCY_BOUNDS_V1``, ending at 30 s, or ``LATENCY_BOUNDS``, ending at an hour; the last bucket
is +Inf). They are still read, and the number of their buckets tells the two apart.
"""

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 3
SKETCH_RELATIVE_ACCURACY = 0.02
"""Every wait a sketch bucket holds is within 2 % of the bucket's value."""
SKETCH_GAMMA = (1 + SKETCH_RELATIVE_ACCURACY) / (1 - SKETCH_RELATIVE_ACCURACY)
SKETCH_MULTIPLIER = 1 / math.log(SKETCH_GAMMA)
SKETCH_MIN_SECONDS = 1e-4
"""Waits up to 0.1 ms share the bucket of 0.1 ms (and 0 has no logarithm)."""
SKETCH_MIN_INDEX = math.ceil(math.log(SKETCH_MIN_SECONDS) * SKETCH_MULTIPLIER)
LATENCY_BOUNDS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0,
                                     300.0, 900.0, 3600.0)  # fmt: skip
"""Up to the Prometheus histogram's top finite bucket (an hour), so a wait of minutes is told."""
LATENCY_BOUNDS_V1 = LATENCY_BOUNDS[:9]
"""Schema 1's bounds: its +Inf bucket holds every wait beyond 30 s."""
BOUNDS_BY_VERSION = {1: LATENCY_BOUNDS_V1, 2: LATENCY_BOUNDS}
"""The buckets of the records written before the sketch (schema 3)."""
SUMMARY_SCHEMA_VERSION = 1
"""Of ``AnalyticsSummary``: versioned apart from the records, which the operator never reads."""
COUNTS = ('enqueued', 'delivered', 'accepted', 'released', 'modified', 'rejected', 'expired',
          'dead_lettered', 'filtered')  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MetricRecord:
    ts_ms: int
    """End of the interval, ms since the epoch."""
    interval_ms: int
    replica: str
    address: str
    subscription: str
    """``queue`` for a queue; a named subscription's id; ``private`` for plain subscribers."""
    enqueued: int = 0
    delivered: int = 0
    accepted: int = 0
    released: int = 0
    modified: int = 0
    rejected: int = 0
    expired: int = 0
    dead_lettered: int = 0
    filtered: int = 0
    consumers: int = 0
    backlog: int = -1
    """Cluster-wide backlog; -1 when it was not known at the end of the interval."""
    latency_sketch: tuple[tuple[int, int], ...] = ()
    """(bucket index, accepted deliveries) by index, nonzero counts only (``sketch_index``)."""
    latency_buckets: tuple[int, ...] = ()
    """Schemas 1 and 2 only: counts per ``BOUNDS_BY_VERSION`` bound, then +Inf."""
    cr_namespace: str = ''
    cr_name: str = ''
    """The Queue/SharedSubscription custom resource, when the entity was provisioned by one."""

    @classmethod
    def of(
        cls,
        *,
        ts_ms: int,
        interval_ms: int,
        replica: str,
        address: str,
        subscription: str,
        counts: Mapping[str, int],
        consumers: int,
        backlog: int,
        latency: Mapping[int, int] | None,
    ) -> 'MetricRecord':
        """A record from a replica's tallies; unknown count names are refused."""
        unknown = set(counts) - set(COUNTS)
        if unknown:
            raise ValueError(f'unknown counts {sorted(unknown)}')
        tallied: dict[str, Any] = dict(counts)
        return cls(
            ts_ms=ts_ms, interval_ms=interval_ms, replica=replica, address=address,
            subscription=subscription, consumers=consumers, backlog=backlog,
            latency_sketch=tuple(sorted(latency.items())) if latency else (), **tallied,
        )  # fmt: skip

    def to_fields(self) -> dict[str, str]:
        """Stream entry fields (all strings)."""
        version = SCHEMA_VERSION
        if self.latency_buckets:  # a record read from an older replica, written back as it was
            version = 1 if len(self.latency_buckets) == len(LATENCY_BOUNDS_V1) + 1 else 2
        fields = {'v': str(version)}
        for name in _FIELD_NAMES:  # a replica writes thousands an interval: no fields() each
            value = getattr(self, name)
            if name == 'latency_sketch':
                if version == SCHEMA_VERSION:  # compact: "index:count ..."
                    fields[name] = ' '.join(f'{i}:{n}' for i, n in value)
            elif name == 'latency_buckets':
                if version != SCHEMA_VERSION:
                    fields[name] = json.dumps(list(value))
            else:
                fields[name] = str(value)
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> 'MetricRecord':
        """Parse stream entry fields (schema 3, or 1 or 2 with their buckets as they were
        written); ValueError on another schema version or bad values."""
        version = fields.get('v', '')
        bounds = {str(v): b for v, b in BOUNDS_BY_VERSION.items()}.get(version)
        if bounds is None and version != str(SCHEMA_VERSION):
            raise ValueError(f'metric record schema {fields.get("v")!r} is not 1, 2 or 3')
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = fields.get(field.name)
            if raw is None:
                continue
            if field.name == 'latency_sketch':
                values[field.name] = _parse_sketch(raw)
            elif field.name == 'latency_buckets':
                if bounds is None:
                    raise ValueError('a schema 3 record has a sketch, not latency_buckets')
                buckets = tuple(int(x) for x in json.loads(raw))
                if len(buckets) != len(bounds) + 1:
                    raise ValueError('latency_buckets has the wrong number of buckets')
                values[field.name] = buckets
            elif field.type in ('int', int):
                values[field.name] = int(raw)
            else:
                values[field.name] = raw
        return cls(**values)  # type: ignore[arg-type]  # each field's type is checked above


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(MetricRecord))


def _parse_sketch(raw: str) -> tuple[tuple[int, int], ...]:
    pairs = []
    for pair in raw.split():
        index, _, count = pair.partition(':')
        try:
            pairs.append((int(index), int(count)))
        except ValueError:
            raise ValueError(f'latency_sketch has a malformed bucket {pair!r}') from None
    if any(count <= 0 for _, count in pairs) or len({i for i, _ in pairs}) != len(pairs):
        raise ValueError('latency_sketch has a count that is not positive or a repeated bucket')
    return tuple(sorted(pairs))


def sketch_index(seconds: float) -> int:
    """The sketch bucket a wait falls in (``Counters.accepted_all`` inlines this)."""
    if seconds <= SKETCH_MIN_SECONDS:
        return SKETCH_MIN_INDEX
    return math.ceil(math.log(seconds) * SKETCH_MULTIPLIER)


def sketch_value(index: int) -> float:
    """Seconds: the value within 2 % of every wait in bucket ``index``."""
    return 2 * SKETCH_GAMMA**index / (SKETCH_GAMMA + 1)


def bucket_index(seconds: float) -> int:
    """The schema 2 latency bucket a delivery latency falls in."""
    for index, bound in enumerate(LATENCY_BOUNDS):
        if seconds <= bound:
            return index
    return len(LATENCY_BOUNDS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly:
    flag: str
    """``starved_consumer``, ``growing_backlog``, ``redelivery_storm``, ``slow_consumer``,
    ``hot_replica``, ``expiry_storm``, ..."""
    address: str = ''
    subscription: str = ''
    replica: str = ''
    severity: str = 'warning'
    """``warning`` or ``critical``."""
    detail: str = ''
    value: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AnalyticsSummary:
    """What the analytics job hands the operator after each analysis: one HASH per cluster
    (``store.keys.ANALYTICS_SUMMARY``), read by the operator."""

    generated_at_ms: int
    window_start_ms: int
    window_end_ms: int
    records: int
    """Metric records the analysis was computed from."""
    current_replicas: int
    recommended_replicas: int
    reason: str
    anomalies: tuple[Anomaly, ...] = ()

    def to_fields(self) -> dict[str, str]:
        """The HASH fields stored at ``store.keys.ANALYTICS_SUMMARY``."""
        return {'v': str(SUMMARY_SCHEMA_VERSION), 'summary': json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> 'AnalyticsSummary':
        """Parse the HASH; ValueError on another schema version or a malformed summary."""
        if fields.get('v') != str(SUMMARY_SCHEMA_VERSION):
            raise ValueError(
                f'analytics summary schema {fields.get("v")!r} is not {SUMMARY_SCHEMA_VERSION}'
            )
        try:
            raw = json.loads(fields['summary'])
            anomalies = tuple(Anomaly(**item) for item in raw.pop('anomalies', ()))
            return cls(**raw, anomalies=anomalies)
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f'malformed analytics summary: {exc}') from exc
