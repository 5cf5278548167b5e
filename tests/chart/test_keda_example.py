"""
examples/keda/scaledobject.yaml, consumers scaled on Shoal's backlog with KEDA's Prometheus
scaler: every ScaledObject validates against KEDA's own CRD schema (tests/chart/schemas/,
strict: a field KEDA does not know is an error, where the API server would drop it silently),
its Prometheus triggers carry what that scaler reads, and each query, run by promtool over the
chart's recording rules and the series two broker replicas export, gives one sample: the backlog
of the queue or subscription it names, nothing else's.
"""

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chartrender import CHART_DIR, ROOT
from exposition import exported_series
from processes import BrokerProcess

EXAMPLE = ROOT / 'examples' / 'keda' / 'scaledobject.yaml'
SCHEMA = Path(__file__).parent / 'schemas' / 'keda-scaledobject-v1alpha1.json'
RULES = CHART_DIR / 'files' / 'prometheus-rules.yaml'
PROMETHEUS_SCALER = {
    'serverAddress', 'query', 'queryParameters', 'threshold', 'activationThreshold', 'namespace',
    'customHeaders', 'ignoreNullValues', 'unsafeSsl', 'awsRegion', 'timeout', 'identityOwner',
    'authModes',
}  # fmt: skip
"""The trigger metadata KEDA's Prometheus scaler reads (pkg/scalers/prometheus_scaler.go)."""


def scaled_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def strict(schema: Any) -> Any:
    """KEDA's schema with unknown fields refused (the API server prunes them: a typo would be
    dropped without a word) and the x-kubernetes-* keys left out."""
    if isinstance(schema, dict):
        found = {k: strict(v) for k, v in schema.items() if not k.startswith('x-kubernetes-')}
        if found.get('type') == 'object' and 'properties' in found:
            found.setdefault('additionalProperties', False)
        return found
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    return schema


def schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(strict(json.loads(SCHEMA.read_text())))
    return [f'{list(e.path)}: {e.message}' for e in validator.iter_errors(doc)]


def queries() -> dict[str, str]:
    return {doc['metadata']['name']: trigger['metadata']['query']
            for doc in scaled_objects() for trigger in doc['spec']['triggers']}  # fmt: skip


def test_every_scaled_object_is_valid_against_keda_s_crd_schema() -> None:
    docs = scaled_objects()
    assert [d['kind'] for d in docs] == ['ScaledObject', 'ScaledObject']
    for doc in docs:
        assert doc['apiVersion'] == 'keda.sh/v1alpha1'
        assert schema_errors(doc) == []


def test_the_schema_check_catches_a_misspelt_field_and_a_wrong_type() -> None:
    doc = copy.deepcopy(scaled_objects()[0])
    doc['spec']['maxReplicas'] = 20  # KEDA's field is maxReplicaCount
    doc['spec']['triggers'][0]['metadata']['threshold'] = 1000  # metadata values are strings
    errors = schema_errors(doc)
    assert any("'maxReplicas' was unexpected" in e for e in errors), errors
    assert any('1000 is not of type' in e for e in errors), errors


def test_the_triggers_carry_what_the_prometheus_scaler_reads() -> None:
    for doc in scaled_objects():
        for trigger in doc['spec']['triggers']:
            assert trigger['type'] == 'prometheus'
            metadata = trigger['metadata']
            assert {'serverAddress', 'query', 'threshold'} <= set(metadata) <= PROMETHEUS_SCALER
            assert float(metadata['threshold']) > 0
            assert float(metadata.get('activationThreshold', '0')) >= 0
            assert metadata['query'].startswith('sum(')  # one sample, or none when absent


def test_the_queries_read_recorded_or_exported_series(broker: BrokerProcess) -> None:
    recorded = {r['record'] for g in yaml.safe_load(RULES.read_text())['groups']
                for r in g['rules'] if 'record' in r}  # fmt: skip
    names = {n for q in queries().values() for n in re.findall(r'shoal[:_][a-z_:]+', q)}
    assert names == {'shoal:backlog_messages:max', 'shoal_declared_info'}
    assert names - recorded - exported_series(broker) == set()


def backlog(pod: str, address: str, subscription: str, value: int, job: str = 'shoal',
            namespace: str = 'apps') -> dict[str, str]:  # fmt: skip
    labels = (f'namespace="{namespace}",job="{job}",pod="{pod}",address="{address}",'
              f'subscription="{subscription}"')  # fmt: skip
    return {'series': f'shoal_backlog_messages{{{labels}}}', 'values': f'{value}x5'}


def declared(pod: str, address: str, subscription: str, cr_name: str) -> dict[str, str]:
    labels = (
        f'namespace="apps",job="shoal",pod="{pod}",address="{address}",'
        f'subscription="{subscription}",cr_namespace="apps",cr_name="{cr_name}"'
    )
    return {'series': f'shoal_declared_info{{{labels}}}', 'values': '1x5'}


BILLING = 'durable:global:*:billing'
SERIES = [
    # every replica reports the cluster-wide backlog: the recording rule takes it once
    backlog('shoal-a', 'orders', 'queue', 1200), backlog('shoal-b', 'orders', 'queue', 1250),
    backlog('shoal-a', 'invoices', BILLING, 740), backlog('shoal-b', 'invoices', BILLING, 730),
    # what the queries must leave out: another queue, subscription, cluster and namespace
    backlog('shoal-a', 'payments', 'queue', 9000),
    backlog('shoal-a', 'invoices', 'durable:global:*:audit', 5000),
    backlog('other-a', 'orders', 'queue', 7000, job='other'),
    backlog('shoal-a', 'orders', 'queue', 3000, namespace='staging'),
    declared('shoal-a', 'invoices', BILLING, 'billing'),
    declared('shoal-b', 'invoices', BILLING, 'billing'),
    declared('shoal-a', 'invoices', 'durable:global:*:audit', 'audit'),
    declared('shoal-a', 'billing', 'queue', 'billing'),  # a Queue of the same name
]  # fmt: skip


def promtool_test(tmp_path: Path, expected: dict[str, float]) -> subprocess.CompletedProcess[str]:
    shutil.copy(RULES, tmp_path / 'rules.yaml')
    tests = {
        'rule_files': ['rules.yaml'],
        'evaluation_interval': '1m',
        'tests': [{
            'interval': '1m',
            'input_series': SERIES,
            'promql_expr_test': [
                {'expr': queries()[name], 'eval_time': '4m',
                 'exp_samples': [{'labels': '{}', 'value': value}]}
                for name, value in expected.items()
            ],
        }],
    }  # fmt: skip
    (tmp_path / 'keda.test.yaml').write_text(yaml.safe_dump(tests, sort_keys=False))
    binary = shutil.which('promtool')
    assert binary, "promtool is not installed (make test installs Debian's prometheus package)"
    return subprocess.run([binary, 'test', 'rules', 'keda.test.yaml'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_each_query_gives_the_backlog_of_what_it_names_once(tmp_path: Path) -> None:
    tested = promtool_test(tmp_path, {'orders-consumers': 1250, 'billing-consumers': 740})
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize('wrong', [{'orders-consumers': 2450}, {'billing-consumers': 1470}])
def test_the_query_test_fails_on_a_backlog_counted_per_replica(
    tmp_path: Path, wrong: dict[str, float]
) -> None:
    """The promtool test can fail: the sum over both replicas' reports is not what it expects."""
    tested = promtool_test(tmp_path, wrong)
    assert tested.returncode != 0
