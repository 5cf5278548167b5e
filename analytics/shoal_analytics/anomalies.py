"""
Anomaly flags from the (small, collected) per-entity and per-replica indicators.

Each flag needs its minimum sample count first. Severities rank: ``critical`` only for what loses
messages or stops their delivery (a growing backlog no consumer attached to in the whole lookback,
messages expiring); ``warning`` for what delays or diverts them (slow consumers, redelivery,
dead letters, starved consumers, a hot replica); ``info`` for what is worth knowing (an uneven
split of a subscription over replicas). Details speak human units (``units.py``).
"""

from collections.abc import Iterable, Mapping
from typing import Any

from shoal_analytics.params import AnalysisParams
from shoal_analytics.units import count, duration, entity_name, rate
from shoal_broker.metrics.records import LATENCY_BOUNDS, LATENCY_BOUNDS_V1, Anomaly

Row = Mapping[str, Any]
TOP_BOUND_MS = LATENCY_BOUNDS[-1] * 1000
"""The percentiles' largest answer: a rank in the +Inf bucket answers this bound."""
V1_TOP_MS = LATENCY_BOUNDS_V1[-1] * 1000
"""A rank among schema 1 records' waits beyond their largest bound answers this one."""


SEVERITY_RANK = {'critical': 0, 'warning': 1, 'info': 2}


def is_capped(ms: float) -> bool:
    """Whether a percentile is a bound old records' waits went beyond (``quantiles``: exactly
    the +Inf bucket's answer; a sketch's own values are never exactly a bound)."""
    return ms in (TOP_BOUND_MS, V1_TOP_MS)


def capped(ms: float) -> str:
    """'≥ ' for a latency only known to be at least this (the rank fell beyond a largest bound)."""
    return '≥ ' if is_capped(ms) else ''


def _where(row: Row) -> dict[str, str]:
    return {'address': row['address'], 'subscription': row['subscription']}


def _number(row: Row, name: str) -> float:
    value = row.get(name)
    return 0.0 if value is None or value != value else float(value)  # None or NaN


def entity_anomalies(entities: Iterable[Row], params: AnalysisParams) -> list[Anomaly]:
    """Growing backlogs, redelivery and expiry storms, dead letters, slow consumers."""
    found: list[Anomaly] = []
    for row in entities:
        where = _where(row)
        present = _number(row, 'consumers_max') > 0 or _number(row, 'consumers') > 0
        if row['backlog_growing']:
            if present:
                drain = 'consumers attached but falling behind: add consumers or speed them up'
            else:
                drain = 'no consumer attached in the whole lookback: delivery has stopped'
            found.append(Anomaly(
                flag='growing_backlog', **where, severity='warning' if present else 'critical',
                detail=f'backlog {count(row["backlog"])} grows '
                       f'{rate(row["backlog_slope_per_s"])} '
                       f'({row["backlog_growing_fraction"]:.0%} of samples); {drain}',
                value=float(row['backlog_slope_per_s']),
            ))  # fmt: skip
        delivered = int(_number(row, 'delivered'))
        ratio = row['redelivery_ratio']
        if (
            delivered >= params.min_deliveries
            and ratio is not None
            and ratio > params.redelivery_ratio
        ):
            found.append(Anomaly(
                flag='redelivery_storm', **where, severity='warning',
                detail=f'{ratio:.1%} of {count(delivered)} deliveries were released or modified',
                value=float(ratio),
            ))  # fmt: skip
        enqueued = int(_number(row, 'enqueued'))
        ratio = row['expiry_ratio']
        if enqueued >= params.min_enqueued and ratio is not None and ratio > params.expiry_ratio:
            found.append(Anomaly(
                flag='expiry_storm', **where, severity='critical',
                detail=f'{ratio:.1%} of {count(enqueued)} enqueued messages expired unread',
                value=float(ratio),
            ))  # fmt: skip
        dead = int(_number(row, 'dead_lettered'))
        if dead >= params.min_dead_letters:
            found.append(Anomaly(
                flag='dead_letters', **where, severity='warning',
                detail=f'{count(dead)} messages dead-lettered ({dead_letter_reasons(row)})',
                value=float(dead),
            ))  # fmt: skip
        accepted = int(_number(row, 'accepted'))
        p99 = row['p99_ms']
        if accepted >= params.min_deliveries and p99 is not None and p99 > params.latency_slo_ms:
            consumers = (
                'consumers attached all along'
                if _number(row, 'consumer_presence') >= 1
                else 'consumers attached part of the time'
            )
            found.append(Anomaly(
                flag='slow_consumer', **where, severity='warning',
                detail=f'p99 wait {capped(p99)}{duration(p99 / 1000)} over the '
                       f'{duration(params.latency_slo_ms / 1000)} objective '
                       f'({count(accepted)} acknowledged; {consumers})',
                value=float(p99),
            ))  # fmt: skip
    return found


def dead_letter_reasons(row: Row) -> str:
    """Why an entity's messages were dead-lettered: a rejection always dead-letters, so what is
    not a rejection went past the maximum delivery attempts."""
    dead = int(_number(row, 'dead_lettered'))
    rejected = min(int(_number(row, 'rejected')), dead)
    reasons = [f'{count(rejected)} rejected'] if rejected else []
    if dead - rejected:
        reasons.append(f'{count(dead - rejected)} past max delivery attempts')
    return ', '.join(reasons) or 'reason unknown'


def share_anomalies(
    shares: Iterable[Row], params: AnalysisParams, hot_replicas: Iterable[str] = ()
) -> list[Anomaly]:
    """A queue or subscription whose deliveries split unevenly over the replicas serving it,
    unless its busiest replica is flagged hot already (that one flag explains every split)."""
    hot = set(hot_replicas)
    by_entity: dict[tuple[str, str], list[Row]] = {}
    for row in shares:
        by_entity.setdefault((row['address'], row['subscription']), []).append(row)
    found = []
    for (address, subscription), rows in sorted(by_entity.items()):
        delivered = sum(int(r['delivered']) for r in rows)
        if len(rows) < 2 or delivered < params.min_deliveries:
            continue
        high = max(rows, key=lambda r: float(r['share']))
        low = min(rows, key=lambda r: float(r['share']))
        if float(high['share']) < params.share_skew_ratio * float(low['share']):
            continue
        if high['replica'] in hot:
            continue
        split = ' / '.join(f'{r["replica"]} {float(r["share"]):.0%}' for r in
                           sorted(rows, key=lambda r: -float(r['share'])))  # fmt: skip
        found.append(Anomaly(
            flag='uneven_share', address=address, subscription=subscription,
            replica=str(high['replica']), severity='info',
            detail=f'deliveries split {split} over {len(rows)} replicas',
            value=float(high['share']),
        ))  # fmt: skip
    return found


def ranked(anomalies: Iterable[Anomaly]) -> list[Anomaly]:
    """Most severe first, then by entity."""
    return sorted(
        anomalies, key=lambda a: (SEVERITY_RANK.get(a.severity, 3), a.address, a.subscription)
    )


def fairness_anomalies(fairness: Iterable[Row]) -> list[Anomaly]:
    """Consumers on one replica starved while those of another are served."""
    return [
        Anomaly(
            flag='starved_consumer',
            address=row['address'],
            subscription=row['subscription'],
            replica=row['least_served_replica'],
            severity='warning',
            detail=f'consumers on {row["least_served_replica"]} of '
            f'{entity_name(row["address"], row["subscription"])} got '
            f'{count(row["min_per_consumer"])} deliveries each against a mean of '
            f'{count(row["mean_per_consumer"])} (Gini {row["gini"]:.2f})',
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
            severity='warning',
            detail=f"{row['share']:.0%} of the cluster's transfers against an even "
            f'{even:.0%} over {len(rows)} replicas',
            value=float(row['share']),
        )
        for row in rows
        if row['share'] is not None and row['share'] > hot
    ]
