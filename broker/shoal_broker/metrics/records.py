"""
The metric record: one per entity (queue or subscription) per interval, per replica.

The schema shared by the broker, which appends records to a bounded Redis stream, and the
analytics package, which reads that stream into Spark. Pure (stdlib only) so both can import it.
Counts are deltas over the interval; ``consumers`` and ``backlog`` are gauges at its end;
``latency_buckets`` counts accepted deliveries per fixed upper bound (seconds, ``LATENCY_BOUNDS``,
the last bucket is +Inf), so percentiles can be estimated from summed histograms. A schema 1
record's buckets end at 30 s (``LATENCY_BOUNDS_V1``); it is still read, with its own bounds, and
the number of its buckets tells it apart.
"""

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

SCHEMA_VERSION = 2
LATENCY_BOUNDS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0,
                                     300.0, 900.0, 3600.0)  # fmt: skip
"""Up to the Prometheus histogram's top finite bucket (an hour), so a wait of minutes is told."""
LATENCY_BOUNDS_V1 = LATENCY_BOUNDS[:9]
"""Schema 1's bounds: its +Inf bucket holds every wait beyond 30 s."""
BOUNDS_BY_VERSION = {1: LATENCY_BOUNDS_V1, 2: LATENCY_BOUNDS}
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
    latency_buckets: tuple[int, ...] = (0,) * (len(LATENCY_BOUNDS) + 1)
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
        latency: Sequence[int] | None,
    ) -> 'MetricRecord':
        """A record from a replica's tallies; unknown count names are refused."""
        unknown = set(counts) - set(COUNTS)
        if unknown:
            raise ValueError(f'unknown counts {sorted(unknown)}')
        record = cls(
            ts_ms=ts_ms, interval_ms=interval_ms, replica=replica, address=address,
            subscription=subscription, consumers=consumers, backlog=backlog,
            latency_buckets=tuple(latency) if latency else (0,) * (len(LATENCY_BOUNDS) + 1),
        )  # fmt: skip
        changes: dict[str, Any] = dict(counts)
        return dataclasses.replace(record, **changes)

    def to_fields(self) -> dict[str, str]:
        """Stream entry fields (all strings)."""
        version = 1 if len(self.latency_buckets) == len(LATENCY_BOUNDS_V1) + 1 else SCHEMA_VERSION
        fields = {'v': str(version)}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            fields[field.name] = json.dumps(list(value)) if isinstance(value, tuple) else str(value)
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> 'MetricRecord':
        """Parse stream entry fields (schema 1 or 2: its buckets as they were written); ValueError
        on another schema version or bad values."""
        bounds = {str(v): b for v, b in BOUNDS_BY_VERSION.items()}.get(fields.get('v', ''))
        if bounds is None:
            raise ValueError(f'metric record schema {fields.get("v")!r} is not 1 or 2')
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = fields.get(field.name)
            if raw is None:
                continue
            if field.name == 'latency_buckets':
                buckets = tuple(int(x) for x in json.loads(raw))
                if len(buckets) != len(bounds) + 1:
                    raise ValueError('latency_buckets has the wrong number of buckets')
                values[field.name] = buckets
            elif field.type in ('int', int):
                values[field.name] = int(raw)
            else:
                values[field.name] = raw
        return cls(**values)  # type: ignore[arg-type]  # each field's type is checked above


def bucket_index(seconds: float) -> int:
    """The latency bucket a delivery latency falls in."""
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
