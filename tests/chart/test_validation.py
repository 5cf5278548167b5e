"""
Every documented values variant renders, lints clean (strict) for the oldest supported Kubernetes
(Chart.yaml's kubeVersion), and every manifest validates: built-in kinds against the OpenAPI
schemas of the oldest supported version and of 1.30 (kubernetes-validate, strict: unknown fields
rejected), Shoal's own custom resources as the API server admits them (defaults applied, then the
CRD's schema and CEL rules: crdrules), and the Spark operator's and Prometheus operator's against
schemas of the fields we set (tests/chart/schemas/). The HorizontalPodAutoscaler the operator
builds for the autoscaled example cluster validates against both Kubernetes versions too.
"""

import json
from pathlib import Path

import crdrules
import helm_python
import jsonschema
import kubernetes_validate
from chartrender import CHART_DIR, VARIANTS, Manifest, find, render
from crdcheck import load_crds, oldest_kubernetes
from crdrules import defaulted, resource_schema

from shoal_operator.manifests import autoscaler
from shoal_operator.models import BrokerCluster

KUBE_VERSIONS = (oldest_kubernetes(), '1.30.0')
WORKLOADS = {'Deployment', 'StatefulSet'}
SCHEMAS = Path(__file__).parent / 'schemas'
THIRD_PARTY = {
    ('monitoring.coreos.com/v1', 'ServiceMonitor'): 'servicemonitor-v1.json',
    ('monitoring.coreos.com/v1', 'PrometheusRule'): 'prometheusrule-v1.json',
    ('sparkoperator.k8s.io/v1beta2', 'ScheduledSparkApplication'):
        'scheduledsparkapplication-v1beta2.json',
}  # fmt: skip


def schema_errors(manifest: Manifest) -> list[str]:
    """Every reason the API server would refuse MANIFEST (empty: valid)."""
    key = (manifest['apiVersion'], manifest['kind'])
    if key in THIRD_PARTY:
        schema = json.loads((SCHEMAS / THIRD_PARTY[key]).read_text())
        return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)]
    if manifest['apiVersion'].startswith('shoal.dev/'):
        return crdrules.admission_errors(load_crds()[manifest['kind']], manifest)
    errors = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f'{version} {list(error.path)}: {error.message}')
    return errors


def test_every_manifest_of_every_variant_is_valid(variant: str) -> None:
    manifests = render(VARIANTS[variant])
    assert manifests
    problems = {
        f'{m["kind"]}/{m["metadata"]["name"]}': errors
        for m in manifests
        for errors in [schema_errors(m)]
        if errors
    }
    assert problems == {}


def test_the_chart_supports_the_kubernetes_versions_the_readme_states() -> None:
    """1.28 and later: Helm refuses to install on a version outside kubeVersion, and the issue's
    platform team runs kube-apiserver 1.28."""
    assert oldest_kubernetes() == '1.28.0'
    readme = (CHART_DIR.parents[1] / 'README.md').read_text()
    assert '**Supported Kubernetes versions: 1.28 and later**' in readme


def test_every_variant_lints_clean(variant: str) -> None:
    report = helm_python.lint(
        CHART_DIR,
        VARIANTS[variant],
        strict=True,
        namespace='shoal-system',
        kube_version=f'v{oldest_kubernetes()}',
    )
    findings = [m for m in report['messages'] if m['severity'] >= 2]
    assert (findings, report['errors']) == ([], [])


def test_names_are_unique_per_kind_and_namespace(variant: str) -> None:
    manifests = render(VARIANTS[variant])
    keys = [(m['kind'], m['metadata'].get('namespace'), m['metadata']['name']) for m in manifests]
    assert len(keys) == len(set(keys))


def test_example_broker_cluster_is_valid_against_the_crd() -> None:
    every_field = {
        'serviceMonitor': {'enabled': True, 'labels': {'release': 'prom'}},
        'exampleCluster': {
            'resources': {'requests': {'cpu': '200m'}},
            'autoscaling': {'fromAnalytics': True, 'minReplicas': 2, 'maxReplicas': 4},
        },
    }
    anonymous = {'exampleCluster': {'auth': {'allowAnonymous': True, 'usersSecretName': ''}}}
    for values in ({}, every_field, anonymous):
        (cluster,) = find(render(values), 'BrokerCluster')
        assert schema_errors(cluster) == []


def test_the_example_cluster_is_closed_to_anonymous_clients_by_default() -> None:
    (cluster,) = find(render(), 'BrokerCluster')
    assert cluster['spec']['auth'] == {'allowAnonymous': False, 'usersSecretName': 'shoal-users'}
    # what the CEL rules are here for: with the users Secret gone, the API server refuses it
    del cluster['spec']['auth']['usersSecretName']
    assert schema_errors(cluster) == [
        'auth.usersSecretName is required unless auth.allowAnonymous is true (a cluster without '
        'users and without ANONYMOUS accepts no client)'
    ]


def test_the_validators_catch_what_they_are_here_for() -> None:
    """The checks above can fail: a wrong type and an unknown field are reported."""
    manifests = render({'analytics': {'enabled': True, 'runner': 'sparkOperator'}})
    (deployment,) = find(manifests, 'Deployment')
    deployment['spec']['replicas'] = 'one'
    assert schema_errors(deployment)
    (ssa,) = find(manifests, 'ScheduledSparkApplication')
    ssa['spec']['template']['driver']['cpus'] = 1
    assert schema_errors(ssa)


def test_pull_secrets_reach_every_pod() -> None:
    values = {
        'imagePullSecrets': [{'name': 'registry'}],
        'analytics': {'enabled': True},
    }
    cronjob_variant = render(values)
    operator_variant = render({**values, 'analytics': {'enabled': True, 'runner': 'sparkOperator'}})
    pods = [m['spec']['template']['spec'] for m in cronjob_variant if m['kind'] in WORKLOADS]
    pods += [m['spec'] for m in cronjob_variant if m['kind'] == 'Pod']
    pods += [
        m['spec']['jobTemplate']['spec']['template']['spec']
        for m in cronjob_variant
        if m['kind'] == 'CronJob'
    ]
    assert len(pods) == 4  # operator, Redis, helm test, analytics job
    for pod in pods:
        assert pod['imagePullSecrets'] == [{'name': 'registry'}]
    (app,) = find(operator_variant, 'ScheduledSparkApplication')
    assert app['spec']['template']['imagePullSecrets'] == ['registry']


def test_the_hpa_the_operator_builds_for_the_autoscaled_chart_cluster_is_valid() -> None:
    (cluster,) = find(render(VARIANTS['autoscaled-example-cluster']), 'BrokerCluster')
    assert schema_errors(cluster) == []
    served = defaulted(resource_schema(load_crds()['BrokerCluster']), cluster)
    hpa = autoscaler.horizontal_pod_autoscaler(BrokerCluster.from_body(served, default_image='i'))
    assert hpa is not None
    assert hpa['spec']['scaleTargetRef']['name'] == cluster['metadata']['name']
    assert [m['type'] for m in hpa['spec']['metrics']] == ['Resource', 'Pods', 'External']
    assert schema_errors(dict(hpa)) == []
