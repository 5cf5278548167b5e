"""
Closing the loop with the analytics job (issue #6): its summary on a BrokerCluster's status.

Pure. The job writes one ``AnalyticsSummary`` per Redis (``shoal_broker.metrics.records``); this
module turns it into the status section, the ``AnomaliesDetected`` condition, the Events to post
for a summary not seen before, and, when ``spec.autoscaling.fromAnalytics`` is set, the replica
count to apply: the recommendation bounded by ``minReplicas``/``maxReplicas``.
"""

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from shoal_broker.metrics.records import AnalyticsSummary, Anomaly
from shoal_operator import conditions
from shoal_operator.conditions import Condition
from shoal_operator.models import BrokerCluster


def generated_at(summary: AnalyticsSummary) -> str:
    moment = datetime.datetime.fromtimestamp(summary.generated_at_ms / 1000, datetime.UTC)
    return conditions.timestamp(moment)


def section(summary: AnalyticsSummary) -> dict[str, Any]:
    """``status.analytics``."""
    return {
        'recommendedReplicas': summary.recommended_replicas,
        'reason': summary.reason,
        'generatedAt': generated_at(summary),
        'anomalies': [_anomaly(a) for a in summary.anomalies],
    }


def _anomaly(anomaly: Anomaly) -> dict[str, Any]:
    found: dict[str, Any] = {'flag': anomaly.flag, 'severity': anomaly.severity}
    for field in ('address', 'subscription', 'replica', 'detail'):
        value = getattr(anomaly, field)
        if value:
            found[field] = value
    if anomaly.value:
        found['value'] = anomaly.value
    return found


def describe(anomaly: Anomaly) -> str:
    where = anomaly.subscription or anomaly.address or anomaly.replica or 'the cluster'
    detail = f': {anomaly.detail}' if anomaly.detail else ''
    return f'{anomaly.flag} ({anomaly.severity}) on {where}{detail}'


def anomalies_condition(
    summary: AnalyticsSummary, *, generation: int, previous: Sequence[Any], now: datetime.datetime
) -> Condition:
    found = bool(summary.anomalies)
    return conditions.make_condition(
        'AnomaliesDetected', found,
        reason=summary.anomalies[0].flag if found else 'NoAnomalies',
        message='; '.join(describe(a) for a in summary.anomalies),
        generation=generation, previous=previous, now=now,
    )  # fmt: skip


def is_new(summary: AnalyticsSummary, previous_status: Mapping[str, Any]) -> bool:
    """Whether this summary has not been reported on the status yet."""
    seen = (previous_status.get('analytics') or {}).get('generatedAt')
    return seen != generated_at(summary)


def events(summary: AnalyticsSummary) -> list[tuple[str, str, str]]:
    """(type, reason, message) to post for a new summary."""
    posted = [('Warning', 'Anomaly', describe(a)) for a in summary.anomalies]
    posted.append(
        (
            'Normal',
            'ReplicasRecommended',
            f'{summary.recommended_replicas} replicas recommended: {summary.reason}',
        )
    )
    return posted


def replicas_to_apply(cluster: BrokerCluster, summary: AnalyticsSummary) -> int | None:
    """The replica count to set on the cluster, or None to leave it."""
    scaling = cluster.autoscaling
    if not scaling.from_analytics or summary.recommended_replicas <= 0:
        return None
    bounded = min(max(summary.recommended_replicas, scaling.min_replicas), scaling.max_replicas)
    return None if bounded == cluster.replicas else bounded
