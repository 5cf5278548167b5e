"""
Every documented values variant renders, lints clean (strict), and every manifest validates:
built-in kinds against the Kubernetes 1.30 OpenAPI schemas (kubernetes-validate, strict: unknown
fields rejected), Shoal's own custom resources against the CRD in crds/, and the Spark operator's
and Prometheus operator's against schemas of the fields we set (tests/chart/schemas/).
"""

import copy
import json
from pathlib import Path
from typing import Any

import crdrules
import helm_python
import jsonschema
import kubernetes_validate
import yaml
from chartrender import CHART_DIR, ROOT, VARIANTS, Manifest, find, render

KUBE_VERSION = '1.30.0'
WORKLOADS = {'Deployment', 'StatefulSet'}
SCHEMAS = Path(__file__).parent / 'schemas'
THIRD_PARTY = {
    ('monitoring.coreos.com/v1', 'ServiceMonitor'): 'servicemonitor-v1.json',
    ('monitoring.coreos.com/v1', 'PrometheusRule'): 'prometheusrule-v1.json',
    ('sparkoperator.k8s.io/v1beta2', 'ScheduledSparkApplication'):
        'scheduledsparkapplication-v1beta2.json',
}  # fmt: skip


def own_crd_schema(kind: str) -> dict[str, Any] | None:
    """The openAPIV3Schema of our CRD for KIND from crds/, strict where the CRD does not opt out
    of pruning; None when crds/ (written on the operator's branch) has no such CRD yet."""
    for path in sorted((ROOT / 'crds').glob('*.yaml')):
        crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        if crd.get('kind') == 'CustomResourceDefinition' and crd['spec']['names']['kind'] == kind:
            (version,) = [v for v in crd['spec']['versions'] if v.get('storage')]
            schema: dict[str, Any] = version['schema']['openAPIV3Schema']
            return _no_unknown_fields(schema)
    return None


def _no_unknown_fields(schema: Any) -> Any:
    """What the API server's pruning does to unknown fields, as a validation error instead."""
    if isinstance(schema, dict):
        schema = {k: _no_unknown_fields(v) for k, v in schema.items()}
        if (
            schema.get('type') == 'object'
            and 'properties' in schema
            and 'additionalProperties' not in schema
            and not schema.get('x-kubernetes-preserve-unknown-fields')
        ):
            schema['additionalProperties'] = False
        if 'metadata' in schema.get('properties', {}):
            schema['properties']['metadata'] = {'type': 'object'}
    elif isinstance(schema, list):
        schema = [_no_unknown_fields(v) for v in schema]
    return schema


def schema_errors(manifest: Manifest) -> list[str]:
    """Every reason the API server would refuse MANIFEST (empty: valid)."""
    key = (manifest['apiVersion'], manifest['kind'])
    if key in THIRD_PARTY:
        schema = json.loads((SCHEMAS / THIRD_PARTY[key]).read_text())
        return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)]
    if manifest['apiVersion'].startswith('shoal.dev/'):
        own = own_crd_schema(manifest['kind'])
        assert own is not None, f'crds/ has no {manifest["kind"]} CRD'
        return [
            f'{list(e.absolute_path)}: {e.message}'
            for e in jsonschema.Draft7Validator(own).iter_errors(manifest)
        ]
    try:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f'{list(error.path)}: {error.message}']
    return []


def test_every_manifest_of_every_variant_is_valid(variant: str) -> None:
    manifests = render(VARIANTS[variant])
    assert manifests
    problems = {
        f'{m["kind"]}/{m["metadata"]["name"]}': errors
        for m in manifests
        if m['kind'] != 'BrokerCluster'
        for errors in [schema_errors(m)]
        if errors
    }
    assert problems == {}


def test_every_variant_lints_clean(variant: str) -> None:
    report = helm_python.lint(
        CHART_DIR, VARIANTS[variant], strict=True, namespace='shoal-system', kube_version='v1.30.0'
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
        assert cel_errors(cluster) == []


def cel_errors(cluster: Manifest) -> list[str]:
    """The CRD's CEL rules CLUSTER breaks, after the API server's defaulting."""
    schema = own_crd_schema('BrokerCluster')
    assert schema is not None
    return crdrules.cel_errors(schema, crdrules.defaulted(schema, copy.deepcopy(cluster)), None)


def test_the_example_cluster_is_closed_to_anonymous_clients_by_default() -> None:
    (cluster,) = find(render(), 'BrokerCluster')
    assert cluster['spec']['auth'] == {'allowAnonymous': False, 'usersSecretName': 'shoal-users'}
    # what the CEL rules are here for: with the users Secret gone, the API server refuses it
    del cluster['spec']['auth']['usersSecretName']
    assert cel_errors(cluster) == [
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
