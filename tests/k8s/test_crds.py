"""The CRDs: every example is accepted, invalid resources are rejected with their message
(defaults applied, then the OpenAPI schema with jsonschema and CEL rules with cel-python, as the
API server does: crdrules), and the chart's copy is identical."""

import pathlib
from typing import Any

import pytest
import yaml
from crdcheck import load_crds
from crdrules import admission_errors, defaulted, resource_schema

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRDS = load_crds()


def schema_of(kind: str) -> dict[str, Any]:
    return resource_schema(CRDS[kind])


def validate(doc: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return admission_errors(CRDS[doc['kind']], doc, old)


def test_the_chart_carries_an_identical_copy_of_the_crds() -> None:
    ours = {p.name: p.read_bytes() for p in (ROOT / 'crds').glob('*.yaml')}
    chart = {p.name: p.read_bytes() for p in (ROOT / 'charts/shoal/crds').glob('*.yaml')}
    assert ours == chart


@pytest.mark.parametrize('path', sorted((ROOT / 'examples').glob('*.yaml')), ids=lambda p: p.name)
def test_every_example_is_valid(path: pathlib.Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        assert validate(doc) == []


def cluster(**spec: Any) -> dict[str, Any]:
    return {'kind': 'BrokerCluster', 'metadata': {'name': 'b'},
            'spec': {'redis': {'secretName': 'r'}, **spec}}  # fmt: skip


def sub(**spec: Any) -> dict[str, Any]:
    return {'apiVersion': 'shoal.dev/v1alpha1', 'kind': 'SharedSubscription',
            'metadata': {'name': 'audit'},
            'spec': {'clusterRef': {'name': 'shoal'}, 'topic': 'prices',
                     'subscriptionName': 'audit', **spec}}  # fmt: skip


def queue(**spec: Any) -> dict[str, Any]:
    return {'apiVersion': 'shoal.dev/v1alpha1', 'kind': 'Queue', 'metadata': {'name': 'orders'},
            'spec': {'clusterRef': {'name': 'shoal'}, **spec}}  # fmt: skip


@pytest.mark.parametrize('doc', [
    sub(delivery={'maxDeliveryAttempts': 1, 'deadLetterAddress': 'audit-dlq'},
        retention={'maxAgeSeconds': 3600}),
    sub(delivery={'maxDeliveryAttempts': 1000}),
    queue(delivery={'deadLetterAddress': 'orders-dlq'},
          retention={'maxMessages': 3, 'overflow': 'DropOldest', 'maxAgeSeconds': 60}),
    queue(retention={'maxMessages': 3}),
    queue(duplicateDetection={'enabled': True, 'window': 1000, 'windowSeconds': 60,
                              'idProperty': '_AMQ_DUPL_ID'}),
    queue(duplicateDetection={'enabled': False}),
    sub(duplicateDetection={'enabled': True}),
    queue(delivery={'redeliveryDelay': 200, 'redeliveryMultiplier': 2,
                    'maxRedeliveryDelay': 60000}),
    sub(delivery={'redeliveryDelay': 500, 'redeliveryMultiplier': 1.5}),
    queue(delivery={'redeliveryDelay': 0, 'maxRedeliveryDelay': 0}),
    queue(lastValue={'enabled': True, 'property': 'device'}),
    queue(lastValue={'enabled': False}),
    cluster(auth={'allowAnonymous': True},
            broker={'lastValueAddresses': 'prices.*,devices', 'lastValueProperty': 'device'}),
    queue(delivery={'exclusive': True}),
    queue(delivery={'groupRebalance': True}),
    sub(delivery={'exclusive': True}, maxConsumers=3),
    sub(delivery={'exclusive': False}, maxConsumers=1),
    cluster(auth={'allowAnonymous': True}, broker={'exclusiveAddresses': ['orders.*', 'fx']}),
], ids=['subscription', 'attempts-only', 'queue', 'max-messages-only', 'duplicates',
        'duplicates-off', 'subscription-duplicates', 'redelivery', 'subscription-redelivery',
        'redelivery-off', 'last-value', 'last-value-off', 'last-value-settings',
        'exclusive-queue', 'group-rebalance', 'exclusive-subscription', 'not-exclusive-single',
        'exclusive-addresses'])  # fmt: skip
def test_delivery_and_retention_policies_are_accepted(doc: dict[str, Any]) -> None:
    assert validate(doc) == []


@pytest.mark.parametrize(('doc', 'message'), [
    (sub(scope='ClientId'), 'clientId is required when scope=ClientId'),
    (sub(clientId='app-1'), 'clientId is required when scope=ClientId'),
    (sub(durable=False), 'non-durable subscriptions can only use deletionPolicy=Delete'),
    (sub(subscriptionName='audit|global'), "does not match '^[^|\\\\s]+$'"),
    (sub(maxConsumers=0), '0 is less than the minimum of 1'),
    (sub(deletionPolicy='Sometimes'), "'Sometimes' is not one of"),
    (cluster(auth={'allowAnonymous': True}, autoscaling={'minReplicas': 5, 'maxReplicas': 2}),
     'autoscaling.minReplicas must not exceed autoscaling.maxReplicas'),
    (cluster(auth={'allowAnonymous': True}, autoscaling={'enabled': True, 'fromAnalytics': True}),
     'autoscaling.enabled (a HorizontalPodAutoscaler) and autoscaling.fromAnalytics both set'),
    (cluster(auth={'allowAnonymous': True},
             autoscaling={'enabled': True, 'externalMetrics': [{'name': 'm'}]}),
     'an external metric needs exactly one of averageValue and value'),
    (cluster(auth={'allowAnonymous': True}, autoscaling={'enabled': True, 'externalMetrics': [
        {'name': 'm', 'value': '1', 'averageValue': '2'}]}),
     'an external metric needs exactly one of averageValue and value'),
    (cluster(auth={'allowAnonymous': True}, autoscaling={'enabled': True, 'externalMetrics': [
        {'name': 'm', 'value': '1Ki'}]}),
     'does not match'),
    (cluster(auth={'allowAnonymous': True}, autoscaling={'targetCPUUtilizationPercentage': 0}),
     '0 is less than the minimum of 1'),
    ({'kind': 'BrokerCluster', 'metadata': {'name': 'b'}, 'spec': {}}, "'redis' is a required"),
    (cluster(), 'auth.usersSecretName is required unless auth.allowAnonymous is true'),
    (cluster(auth={'allowAnonymous': False}), 'auth.usersSecretName is required unless'),
    (cluster(auth={'usersSecretName': ''}), "'' should be non-empty"),
    (cluster(auth={'allowAnonymous': True}, tls={'clientAuth': 'Required'}),
     "'secretName' is a required property"),
    (cluster(auth={'allowAnonymous': True}, tls={'secretName': 't', 'clientAuth': 'Optional'}),
     'tls.clientCASecretName is required when tls.clientAuth is Optional or Required'),
    (cluster(auth={'allowAnonymous': True}, tls={'secretName': 't', 'clientAuth': 'required'}),
     "'required' is not one of"),
    ({'kind': 'Queue', 'metadata': {'name': 'q'}, 'spec': {'clusterRef': {}}},
     "'name' is a required property"),
    (sub(delivery={'maxDeliveryAttempts': 0}), '0 is less than the minimum of 1'),
    (sub(delivery={'maxDeliveryAttempts': 1001}), '1001 is greater than the maximum of 1000'),
    (sub(delivery={'deadLetterAddress': 'dead letters'}), "'dead letters' does not match"),
    (sub(retention={'maxAgeSeconds': 0}), '0 is less than the minimum of 1'),
    (queue(retention={'maxMessages': 0}), '0 is less than the minimum of 1'),
    (queue(retention={'maxMessages': 3, 'overflow': 'DropNewest'}), "'DropNewest' is not one of"),
    (queue(retention={'overflow': 'DropOldest'}), 'overflow needs maxMessages'),
    (queue(delivery={'maxDeliveryAttempts': 1001}), '1001 is greater than the maximum of 1000'),
    (queue(delivery={'redeliveryDelay': -1}), '-1 is less than the minimum of 0'),
    (sub(delivery={'redeliveryDelay': 86400001}), 'is greater than the maximum of 86400000'),
    (queue(delivery={'redeliveryMultiplier': 0.5}), '0.5 is less than the minimum of 1'),
    (sub(delivery={'redeliveryMultiplier': 'double'}), "'double' is not of type 'number'"),
    (queue(delivery={'redeliveryDelay': 1000, 'maxRedeliveryDelay': 500}),
     'maxRedeliveryDelay must be 0 or at least redeliveryDelay'),
    (sub(delivery={'redeliveryDelay': 1000, 'maxRedeliveryDelay': 999}),
     'maxRedeliveryDelay must be 0 or at least redeliveryDelay'),
    (cluster(auth={'allowAnonymous': True}, broker={'redeliveryMultiplier': 101}),
     '101 is greater than the maximum of 100'),
    (queue(duplicateDetection={'window': 10}), "'enabled' is a required property"),
    (queue(delivery={'exclusive': 'yes'}), "'yes' is not of type 'boolean'"),
    (sub(delivery={'groupRebalance': 'yes'}), "'yes' is not of type 'boolean'"),
    (sub(delivery={'exclusive': True}, maxConsumers=1),
     'an exclusive subscription needs maxConsumers of at least 2'),
    (cluster(auth={'allowAnonymous': True}, broker={'exclusiveAddresses': ['a,b']}),
     "'a,b' does not match"),
    (cluster(auth={'allowAnonymous': True}, broker={'duplicateWindow': 0}),
     '0 is less than the minimum of 1'),
    (cluster(auth={'allowAnonymous': True}, broker={'duplicateIdProperty': 'a b'}),
     "'a b' does not match"),
    (queue(duplicateDetection={'enabled': False, 'window': 10}),
     'window, windowSeconds and idProperty need enabled: true'),
    (sub(duplicateDetection={'enabled': True, 'window': 0}), '0 is less than the minimum of 1'),
    (queue(duplicateDetection={'enabled': True, 'windowSeconds': 604801}),
     '604801 is greater than the maximum of 604800'),
    (queue(duplicateDetection={'enabled': True, 'idProperty': 'a b'}), "'a b' does not match"),
    (queue(lastValue={'property': 'device'}), "'enabled' is a required property"),
    (queue(lastValue={'enabled': False, 'property': 'device'}), 'property needs enabled: true'),
    (queue(lastValue={'enabled': True, 'property': 'a b'}), "'a b' does not match"),
    (queue(lastValue={'enabled': True, 'property': ''}), "'' should be non-empty"),
    (cluster(auth={'allowAnonymous': True}, broker={'lastValueAddresses': 'a, b'}),
     "'a, b' does not match"),
    (cluster(auth={'allowAnonymous': True}, broker={'metricsHeartbeatSeconds': -1}),
     '-1 is less than the minimum of 0'),
    (cluster(auth={'allowAnonymous': True}, broker={'metricsHeartbeatSeconds': 3601}),
     '3601 is greater than the maximum of 3600'),
    (cluster(auth={'allowAnonymous': True}, broker={'metricsHeartbeatSeconds': '30s'}),
     "'30s' is not of type 'integer'"),
    (cluster(auth={'allowAnonymous': True}, broker={'storeHoldSeconds': -1}),
     '-1 is less than the minimum of 0'),
    (cluster(auth={'allowAnonymous': True}, broker={'storeHoldSeconds': 3601}),
     '3601 is greater than the maximum of 3600'),
    (cluster(auth={'allowAnonymous': True}, scaleDown={'connectionDrainSeconds': 601}),
     '601 is greater than the maximum of 600'),
    (cluster(auth={'allowAnonymous': True}, scaleDown={'connectionDrainSeconds': -1}),
     '-1 is less than the minimum of 0'),
    (cluster(auth={'allowAnonymous': True}, broker={'tracing': {'sampleRatio': 1.5}}),
     '1.5 is greater than the maximum of 1'),
    (cluster(auth={'allowAnonymous': True}, broker={'tracing': {'otlpEndpoint': 'collector:4318'}}),
     "'collector:4318' does not match"),
])  # fmt: skip
def test_invalid_resources_are_rejected_with_their_message(doc: dict[str, Any], message: str
                                                           ) -> None:  # fmt: skip
    errors = validate(doc)
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(('change', 'message'), [
    ({'topic': 'other'}, 'topic is immutable'),
    ({'subscriptionName': 'other'}, 'subscriptionName is immutable'),
    ({'clusterRef': {'name': 'other'}}, 'clusterRef is immutable'),
    ({'selector': "a = 2"}, 'set selectorChangePolicy=Recreate'),
])  # fmt: skip
def test_updates_breaking_a_transition_rule_are_rejected(change: dict[str, Any], message: str
                                                         ) -> None:  # fmt: skip
    old = sub(selector='a = 1')
    new = sub(selector='a = 1')
    new['spec'].update(change)
    assert any(message in e for e in validate(new, old)), validate(new, old)


def test_the_rules_of_a_field_an_update_adds_still_apply() -> None:
    old = cluster(auth={'usersSecretName': 'users'})
    new = cluster(
        auth={'usersSecretName': 'users'}, tls={'secretName': 't', 'clientAuth': 'Required'}
    )
    assert validate(new, old) == [
        'tls.clientCASecretName is required when tls.clientAuth is Optional or Required'
    ]


def test_a_selector_change_under_recreate_is_accepted() -> None:
    old = sub(selector='a = 1', selectorChangePolicy='Recreate')
    new = sub(selector='a = 2', selectorChangePolicy='Recreate')
    assert validate(new, old) == []


@pytest.mark.parametrize('spec', [
    {'auth': {'usersSecretName': 'users'}},
    {'auth': {'allowAnonymous': True}},
    {'auth': {'usersSecretName': 'users'}, 'tls': {'secretName': 'tls'}},
    {'auth': {'usersSecretName': 'users'},
     'tls': {'secretName': 'tls', 'clientAuth': 'Required', 'clientCASecretName': 'ca'}},
])  # fmt: skip
def test_clusters_someone_can_log_into_are_accepted(spec: dict[str, Any]) -> None:
    assert validate(cluster(**spec)) == []


def test_a_cluster_defaults_to_no_anonymous_clients_and_no_client_certificates() -> None:
    schema = schema_of('BrokerCluster')
    spec = defaulted(schema, cluster(tls={'secretName': 't'}))['spec']
    assert spec['auth'] == {'allowAnonymous': False}
    assert spec['tls']['clientAuth'] == 'None'


@pytest.mark.parametrize('metrics', [
    {'metricsHeartbeatSeconds': 30},
    {'metricsHeartbeatSeconds': 0},
    {'metricsIntervalSeconds': 60, 'metricsHeartbeatSeconds': 10},
    {'metricsIntervalSeconds': 10, 'metricsHeartbeatSeconds': 3600},
], ids=['default', 'every-interval', 'below-the-interval', 'hourly'])  # fmt: skip
def test_any_heartbeat_within_bounds_is_accepted_whatever_the_interval(
    metrics: dict[str, int],
) -> None:
    """The broker writes a record every interval when the heartbeat is at or below it, so no
    rule orders the two."""
    assert validate(cluster(auth={'allowAnonymous': True}, broker=metrics)) == []


@pytest.mark.parametrize('hold', [0, 30, 3600])
def test_a_store_hold_within_bounds_is_accepted(hold: int) -> None:
    assert validate(cluster(auth={'allowAnonymous': True}, broker={'storeHoldSeconds': hold})) == []


def test_a_stored_cluster_gains_no_metrics_setting_from_the_schema() -> None:
    """No default: the API server adds nothing to clusters stored before the field, so their
    ConfigMap and pod template stay as they were and the brokers keep their own defaults."""
    stored = cluster(auth={'allowAnonymous': True}, broker={'metricsIntervalSeconds': 10})
    spec = defaulted(schema_of('BrokerCluster'), stored)['spec']
    assert spec['broker'] == {'metricsIntervalSeconds': 10}


def test_the_connection_drain_has_no_default_so_existing_clusters_keep_their_pods() -> None:
    """A schema default would reach every stored BrokerCluster, its ConfigMap and pod template:
    an operator upgrade would roll every cluster's pods."""
    spec = defaulted(schema_of('BrokerCluster'), cluster(scaleDown={}))['spec']
    assert spec['scaleDown'] == {'drainSeconds': 5, 'shutdownGraceSeconds': 20}
    assert validate(cluster(auth={'allowAnonymous': True}, scaleDown={'connectionDrainSeconds': 0}
                            )) == []  # fmt: skip
