"""
The HorizontalPodAutoscaler of a BrokerCluster with ``spec.autoscaling.enabled``.

It scales the BrokerCluster itself through its scale subresource (not the Deployment): the HPA
writes ``spec.replicas``, and the operator carries that into the Deployment as it does any
replica count, so there is one writer of each field. Pods leave one at a time, at most one per
drain bound, so each departing replica's clients have moved before the next one goes.

Quantities are written in the API server's canonical form (``1000`` comes back as ``1k``:
``autoscaling.canonical_quantity``), so an unchanged HPA reads back equal to what is applied and
no pass patches it for nothing.
"""

from shoal_operator.autoscaling import canonical_quantity
from shoal_operator.manifests import naming
from shoal_operator.manifests.config import Manifest
from shoal_operator.models import API_VERSION, BrokerCluster

API = 'autoscaling/v2'
KIND = 'HorizontalPodAutoscaler'
CONNECTIONS_METRIC = 'shoal_connections'
"""The broker's gauge of open AMQP connections, as the Prometheus adapter serves it per pod."""
MAX_POLICY_PERIOD = 1800
"""The API's bound on ``behavior.*.policies[].periodSeconds``."""


def _target(average: str | None, value: str | None) -> dict[str, str]:
    if average is not None:
        return {'type': 'AverageValue', 'averageValue': average}
    assert value is not None  # autoscaling: exactly one of them
    return {'type': 'Value', 'value': value}


def horizontal_pod_autoscaler(cluster: BrokerCluster) -> Manifest | None:
    scaling = cluster.autoscaling
    if not scaling.enabled:
        return None
    metrics: list[dict[str, object]] = [{
        'type': 'Resource',
        'resource': {'name': 'cpu', 'target': {'type': 'Utilization',
                                               'averageUtilization': scaling.cpu_utilization}},
    }]  # fmt: skip
    if scaling.connections_per_replica is not None:
        metrics.append({'type': 'Pods', 'pods': {
            'metric': {'name': CONNECTIONS_METRIC},
            'target': _target(canonical_quantity(str(scaling.connections_per_replica)), None),
        }})  # fmt: skip
    for external in scaling.external:
        metric: dict[str, object] = {'name': external.name}
        if external.match_labels:
            metric['selector'] = {'matchLabels': dict(external.match_labels)}
        metrics.append({'type': 'External', 'external': {
            'metric': metric, 'target': _target(external.average_value, external.value),
        }})  # fmt: skip
    # a replica's pod is gone within its termination grace period (as the Deployment sets it):
    # the next may leave after that, and not sooner than a minute
    grace = cluster.termination_grace_seconds
    period = min(max(60, grace), MAX_POLICY_PERIOD)
    return {
        'apiVersion': API,
        'kind': KIND,
        'metadata': naming.metadata(cluster, naming.child(cluster)),
        'spec': {
            'scaleTargetRef': {'apiVersion': API_VERSION, 'kind': 'BrokerCluster',
                               'name': cluster.meta.name},
            'minReplicas': scaling.min_replicas,
            'maxReplicas': scaling.max_replicas,
            'metrics': metrics,
            'behavior': {'scaleDown': {
                'stabilizationWindowSeconds': scaling.scale_down_stabilization_seconds,
                'policies': [{'type': 'Pods', 'value': 1, 'periodSeconds': period}],
            }},
        },
    }  # fmt: skip
