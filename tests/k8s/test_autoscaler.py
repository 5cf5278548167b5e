"""The HorizontalPodAutoscaler builder and ``spec.autoscaling`` (no API server): it scales the
BrokerCluster through its scale subresource, carries each target asked for in the API server's
canonical quantities, lets replicas leave one at a time, and refuses two writers of replicas."""

from typing import Any

import pytest

from shoal_operator import autoscaling, manifests
from shoal_operator.manifests import autoscaler, workload
from shoal_operator.models import BrokerCluster, InvalidSpec


def model(**spec: Any) -> BrokerCluster:
    body = {'metadata': {'name': 'shoal', 'namespace': 'msg', 'uid': 'u1', 'generation': 3},
            'spec': {'redis': {'secretName': 'redis'}, 'auth': {'allowAnonymous': True},
                     **spec}}  # fmt: skip
    return BrokerCluster.from_body(body, default_image='img:1')


def hpa(**autoscaling: Any) -> dict[str, Any]:
    built = autoscaler.horizontal_pod_autoscaler(model(autoscaling={'enabled': True,
                                                                    **autoscaling}))  # fmt: skip
    assert built is not None
    return dict(built)


def test_only_an_enabled_autoscaling_renders_an_hpa() -> None:
    assert autoscaler.horizontal_pod_autoscaler(model()) is None
    assert autoscaler.horizontal_pod_autoscaler(model(autoscaling={'fromAnalytics': True})) is None
    off = [kind for _, kind, _ in manifests.switched_off(model(autoscaling={'enabled': False}))]
    assert 'HorizontalPodAutoscaler' in off
    on = model(autoscaling={'enabled': True})
    assert 'HorizontalPodAutoscaler' in [m['kind'] for m in manifests.build_all(on)]
    assert 'HorizontalPodAutoscaler' not in [k for _, k, _ in manifests.switched_off(on)]


def test_the_hpa_scales_the_broker_cluster_on_cpu_by_default() -> None:
    built = hpa(minReplicas=2, maxReplicas=8)
    assert built['apiVersion'] == 'autoscaling/v2'
    assert built['metadata']['name'] == 'shoal'
    assert built['metadata']['namespace'] == 'msg'
    spec = built['spec']
    assert spec['scaleTargetRef'] == {'apiVersion': 'shoal.dev/v1alpha1', 'kind': 'BrokerCluster',
                                      'name': 'shoal'}  # fmt: skip
    assert (spec['minReplicas'], spec['maxReplicas']) == (2, 8)
    assert spec['metrics'] == [{'type': 'Resource', 'resource': {
        'name': 'cpu', 'target': {'type': 'Utilization', 'averageUtilization': 70}}}]  # fmt: skip
    assert spec['behavior'] == {'scaleDown': {
        'stabilizationWindowSeconds': 300,
        'policies': [{'type': 'Pods', 'value': 1, 'periodSeconds': 60}],
    }}  # fmt: skip


def test_connections_and_external_metrics_are_targets_beside_cpu() -> None:
    spec = hpa(
        targetCPUUtilizationPercentage=60,
        targetConnectionsPerReplica=2000,
        externalMetrics=[
            {'name': 'shoal_messages_enqueued_rate', 'matchLabels': {'job': 'shoal'},
             'averageValue': '5000'},
            {'name': 'shoal_backlog_messages', 'value': '0.5'},
        ],
    )['spec']  # fmt: skip
    cpu, connections, enqueued, backlog = spec['metrics']
    assert cpu['resource']['target']['averageUtilization'] == 60
    assert connections == {'type': 'Pods', 'pods': {
        'metric': {'name': 'shoal_connections'},
        'target': {'type': 'AverageValue', 'averageValue': '2k'}}}  # fmt: skip
    assert enqueued == {'type': 'External', 'external': {
        'metric': {'name': 'shoal_messages_enqueued_rate',
                   'selector': {'matchLabels': {'job': 'shoal'}}},
        'target': {'type': 'AverageValue', 'averageValue': '5k'}}}  # fmt: skip
    assert backlog['external'] == {'metric': {'name': 'shoal_backlog_messages'},
                                   'target': {'type': 'Value', 'value': '500m'}}  # fmt: skip


@pytest.mark.parametrize(('written', 'canonical'), [
    ('1000', '1k'), ('1500', '1500'), ('2000000', '2M'), ('0.5', '500m'), ('1.5k', '1500'),
    ('12k', '12k'), ('0', '0'), ('100', '100'), ('0.0000000001', '1n'), ('1000m', '1'),
])  # fmt: skip
def test_quantities_are_written_as_the_api_server_writes_them_back(
    written: str, canonical: str
) -> None:
    assert autoscaling.canonical_quantity(written) == canonical


def test_replicas_leave_one_per_drain_bound_and_the_window_is_the_spec_s() -> None:
    slow = model(autoscaling={'enabled': True, 'scaleDownStabilizationSeconds': 600},
                 scaleDown={'drainSeconds': 60, 'shutdownGraceSeconds': 40})  # fmt: skip
    built = autoscaler.horizontal_pod_autoscaler(slow)
    assert built is not None
    grace = workload.deployment(slow)['spec']['template']['spec']['terminationGracePeriodSeconds']
    assert built['spec']['behavior']['scaleDown'] == {
        'stabilizationWindowSeconds': 600,
        'policies': [{'type': 'Pods', 'value': 1, 'periodSeconds': grace}],
    }
    assert grace == 105


def test_the_deployment_follows_spec_replicas_which_the_hpa_writes() -> None:
    """The HPA writes spec.replicas through /scale; the Deployment follows it, HPA or not."""
    scaled = model(replicas=5, autoscaling={'enabled': True, 'minReplicas': 2, 'maxReplicas': 8})
    assert workload.deployment(scaled)['spec']['replicas'] == 5


@pytest.mark.parametrize(('autoscaling', 'message'), [
    ({'enabled': True, 'fromAnalytics': True}, 'choose one'),
    ({'enabled': True, 'minReplicas': 4, 'maxReplicas': 3}, 'must not exceed'),
    ({'enabled': True, 'externalMetrics': [{'name': 'm'}]}, 'exactly one of'),
    ({'enabled': True, 'externalMetrics': [{'name': 'm', 'value': '1', 'averageValue': '1'}]},
     'exactly one of'),
])  # fmt: skip
def test_contradicting_autoscaling_is_an_invalid_spec(
    autoscaling: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSpec, match=message):
        model(autoscaling=autoscaling)


def test_a_quantity_the_builder_cannot_write_is_an_invalid_spec() -> None:
    with pytest.raises(InvalidSpec, match='not a decimal quantity'):
        model(autoscaling={'enabled': True, 'externalMetrics': [{'name': 'm', 'value': '1Ki'}]})
