"""
The replica recommendation: enough replicas for the busy minutes at the target utilisation.

Sized on the 95th percentile of the cluster's per-window transfer rate (not the peak: one burst
should not double a cluster), plus one replica when a backlog grows while the replicas are busy.
A backlog that grows while replicas idle is consumer-bound; more replicas would not help, so it is
named in the reason and left to the anomaly flags. Clamping to min/max is the operator's job.
"""

import dataclasses
import math
from collections.abc import Sequence

from shoal_analytics.params import AnalysisParams
from shoal_analytics.units import entity_name
from shoal_broker.metrics.records import Anomaly


@dataclasses.dataclass(frozen=True)
class Recommendation:
    replicas: int
    reason: str
    p95_transfers_per_s: float
    utilisation: float


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def recommend(
    window_rates: Sequence[float], current: int, growing_backlogs: int, params: AnalysisParams
) -> Recommendation:
    """Replicas to run, given the cluster's transfers per second of each complete window."""
    if not window_rates:
        reason = 'no complete window to judge; keep the current replicas'
        return Recommendation(current, reason, 0, 0)
    p95 = percentile(window_rates, 0.95)
    usable = params.capacity_per_replica * params.target_utilisation
    needed = max(1, math.ceil(p95 / usable))
    utilisation = p95 / (params.capacity_per_replica * current) if current else math.inf
    reason = (
        f'p95 load {p95:.0f} transfers/s needs {needed} replica(s) at '
        f'{params.target_utilisation:.0%} of {params.capacity_per_replica:.0f}/s each'
    )
    if growing_backlogs and utilisation > params.target_utilisation:
        needed = max(needed, current + 1)
        reason += f'; {growing_backlogs} backlog(s) grow while replicas are busy: one more'
    elif growing_backlogs:
        reason += f'; {growing_backlogs} backlog(s) grow while replicas idle: consumer-bound'
    return Recommendation(needed, reason, p95, utilisation)


def headline(advice: Recommendation, current: int, anomalies: Sequence[Anomaly]) -> str:
    """What to do, first: consumers for the entities whose consumers are absent or fall behind
    (more brokers would not help them), then the broker count."""

    def names(*flags: str, critical: bool | None = None) -> list[str]:
        found = [
            entity_name(a.address, a.subscription)
            for a in anomalies
            if a.flag in flags and (critical is None or (a.severity == 'critical') == critical)
        ]
        return list(dict.fromkeys(found))

    def listed(items: list[str]) -> str:
        return ', '.join(items[:3]) + (f' and {len(items) - 3} more' if len(items) > 3 else '')

    actions = []
    absent = names('growing_backlog', critical=True)
    if absent:
        actions.append(f'Attach consumers to {listed(absent)}')
    behind = [n for n in names('growing_backlog', 'slow_consumer') if n not in absent]
    if behind:
        actions.append(f'add consumers to {listed(behind)}' if actions
                       else f'Add consumers to {listed(behind)}')  # fmt: skip
    if advice.replicas > current:
        actions.append(f'scale brokers to {advice.replicas}')
    elif advice.replicas < current and not actions:
        actions.append(f'scale brokers down to {advice.replicas}')
    if not actions:
        return f'No action needed: {current} broker(s) carry the load'
    text = '; '.join(actions)
    return text[0].upper() + text[1:]
