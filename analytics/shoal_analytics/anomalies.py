"""
Anomaly flags from the (small, collected) per-entity and per-replica indicators.

Each flag needs its minimum sample count first; ``critical`` marks a value four times past its
threshold (or a growing backlog nobody consumes), ``warning`` anything else flagged.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from shoal_analytics.params import AnalysisParams
from shoal_broker.metrics.records import LATENCY_BOUNDS, LATENCY_BOUNDS_V1, Anomaly

Row = Mapping[str, Any]
TOP_BOUND_MS = LATENCY_BOUNDS[-1] * 1000
"""The percentiles' largest answer: a rank in the +Inf bucket answers this bound."""
V1_TOP_MS = LATENCY_BOUNDS_V1[-1] * 1000
"""A rank among schema 1 records' waits beyond their largest bound answers this one."""


def is_capped(ms: float) -> bool:
    """Whether a percentile is a bound the waits went beyond (``quantiles.quantile_ms``): the
    +Inf bucket's, or schema 1's 30 s (an interpolated 30 s is a wait of at least 30 s too)."""
    return ms >= TOP_BOUND_MS or ms == V1_TOP_MS


def capped(ms: float) -> str:
    """'≥ ' for a latency only known to be at least this (the rank fell beyond a largest bound)."""
    return '≥ ' if is_capped(ms) else ''


def _severity(value: float, threshold: float) -> str:
    return 'critical' if value >= 4 * threshold else 'warning'


def entity_anomalies(entities: Iterable[Row], params: AnalysisParams) -> list[Anomaly]:
    """Growing backlogs, redelivery and expiry storms, slow consumers."""
    found: list[Anomaly] = []
    for row in entities:
        where = {'address': row['address'], 'subscription': row['subscription']}
        if row['backlog_growing']:
            drain = 'nobody consumes' if not row['consumers'] else 'consumers fall behind'
            found.append(Anomaly(
                flag='growing_backlog', **where,
                severity='critical' if not row['consumers'] else 'warning',
                detail=f'backlog {row["backlog"]} grows {row["backlog_slope_per_s"]:.1f} msg/s '
                       f'({row["backlog_growing_fraction"]:.0%} of samples); {drain}',
                value=float(row['backlog_slope_per_s']),
            ))  # fmt: skip
        delivered = row['delivered'] or 0
        ratio = row['redelivery_ratio']
        limit = params.redelivery_ratio
        if delivered >= params.min_deliveries and ratio is not None and ratio > limit:
            found.append(Anomaly(
                flag='redelivery_storm', **where, severity=_severity(ratio, limit),
                detail=f'{ratio:.1%} of {delivered} deliveries were released or modified',
                value=float(ratio),
            ))  # fmt: skip
        enqueued = row['enqueued'] or 0
        ratio = row['expiry_ratio']
        if enqueued >= params.min_enqueued and ratio is not None and ratio > params.expiry_ratio:
            found.append(Anomaly(
                flag='expiry_storm', **where, severity=_severity(ratio, params.expiry_ratio),
                detail=f'{ratio:.1%} of {enqueued} enqueued messages expired', value=float(ratio),
            ))  # fmt: skip
        accepted = row['accepted'] or 0
        p99 = row['p99_ms']
        if accepted >= params.min_deliveries and p99 is not None and p99 > params.latency_slo_ms:
            found.append(Anomaly(
                flag='slow_consumer', **where, severity=_severity(p99, params.latency_slo_ms),
                detail=f'p99 latency {capped(p99)}{p99:.0f} ms over the '
                       f'{params.latency_slo_ms:.0f} ms SLO '
                       f'({accepted} settled deliveries)',
                value=float(p99),
            ))  # fmt: skip
    return found


def fairness_anomalies(fairness: Iterable[Row]) -> list[Anomaly]:
    """Consumers on one replica starved while those of another are served."""
    return [
        Anomaly(
            flag='starved_consumer',
            address=row['address'],
            subscription=row['subscription'],
            replica=row['least_served_replica'],
            severity='critical' if row['min_per_consumer'] == 0 else 'warning',
            detail=f'consumers on {row["least_served_replica"]} got '
            f'{row["min_per_consumer"]:.0f} deliveries each against a mean of '
            f'{row["mean_per_consumer"]:.0f} (Gini {row["gini"]:.2f})',
            value=float(row['min_per_consumer']),
        )
        for row in fairness
        if row['starved']
    ]


def replica_anomalies(shares: Iterable[Row], params: AnalysisParams) -> list[Anomaly]:
    """A replica carrying well over its even share of the cluster's transfers."""
    rows = list(shares)
    total = sum(int(row['transfers'] or 0) for row in rows)
    if len(rows) < 2 or total < params.min_transfers:
        return []
    even = 1 / len(rows)
    hot = params.hot_share_factor * even
    return [
        Anomaly(
            flag='hot_replica',
            replica=row['replica'],
            severity='critical' if row['share'] >= 2 * hot else 'warning',
            detail=f"{row['share']:.0%} of the cluster's transfers against an even "
            f'{even:.0%} over {len(rows)} replicas',
            value=float(row['share']),
        )
        for row in rows
        if row['share'] is not None and row['share'] > hot
    ]
