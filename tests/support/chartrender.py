"""
The Helm chart rendered offline with helm-python-sdk (Helm's own engine: no cluster, no helm
binary), and the values variants the README documents. Used by tests/chart/.
"""

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from helm_python import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / 'charts' / 'shoal'
RELEASE = 'rel'
NAMESPACE = 'shoal-system'

# The documented values variants (README "Installing with Helm"); {} is the default install.
VARIANTS: dict[str, dict[str, Any]] = {
    'default': {},
    'cluster-rbac': {'rbac': {'scope': 'cluster'}},
    'namespaced-rbac-several': {'rbac': {'watchNamespaces': ['team-a', 'team-b']}},
    'existing-redis': {'redis': {'enabled': False, 'existingSecret': {'name': 'my-redis'}}},
    'redis-sentinel': {'redis': {'mode': 'sentinel'}},
    'redis-sentinel-open-hard-network-policy': {
        'redis': {'mode': 'sentinel', 'auth': {'enabled': False}, 'podAntiAffinity': 'hard',
                  'replicas': 1, 'sentinel': {'replicas': 5, 'quorum': 3}},
        'networkPolicy': {'enabled': True},
    },
    'service-monitor': {'serviceMonitor': {'enabled': True, 'labels': {'release': 'prom'}},
                        'grafanaDashboard': {'enabled': True}},
    'network-policy': {'networkPolicy': {'enabled': True}, 'analytics': {'enabled': True}},
    'spark-cronjob': {'analytics': {'enabled': True, 'runner': 'cronJob'}},
    'spark-operator': {'analytics': {'enabled': True, 'runner': 'sparkOperator'}},
    'spark-operator-network-policy-existing-redis': {
        'analytics': {'enabled': True, 'runner': 'sparkOperator'},
        'networkPolicy': {'enabled': True},
        'redis': {'enabled': False, 'existingSecret': {'name': 'my-redis', 'key': 'uri'}},
    },
    'spark-submit': {'analytics': {'enabled': True, 'runner': 'sparkSubmit'}},
    'spark-submit-network-policy-pull-secrets': {
        'analytics': {'enabled': True, 'runner': 'sparkSubmit'},
        'networkPolicy': {'enabled': True},
        'imagePullSecrets': [{'name': 'registry'}],
    },
    'no-example-cluster': {'exampleCluster': {'enabled': False}},
    'anonymous-example-cluster': {'exampleCluster': {'auth': {'allowAnonymous': True}}},
    'autoscaled-example-cluster': {'exampleCluster': {'autoscaling': {
        'enabled': True, 'minReplicas': 2, 'maxReplicas': 4, 'targetConnectionsPerReplica': 2000,
        'externalMetrics': [{'name': 'shoal_messages_enqueued_rate',
                             'matchLabels': {'job': 'shoal'}, 'averageValue': '5k'}]}}},
    'external-broker-with-credentials': {
        'exampleCluster': {'enabled': False},
        'tests': {'brokerUrl': 'amqps://broker.example:5671', 'credentialsSecret': 'creds'},
    },
}  # fmt: skip

Manifest = dict[str, Any]


@cache
def chart() -> Chart:
    return Chart.load(CHART_DIR)


def render_raw(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path → rendered text, for release RELEASE in NAMESPACE."""
    return chart().render(values or {}, name=RELEASE, namespace=NAMESPACE)


def render(values: dict[str, Any] | None = None) -> list[Manifest]:
    """Every non-empty YAML document rendered (NOTES.txt is not YAML)."""
    documents: list[Manifest] = []
    for path, text in sorted(render_raw(values).items()):
        if not path.endswith('NOTES.txt'):
            documents.extend(d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d)
    return documents


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m['kind'] == kind and (name is None or m['metadata']['name'] == name)
    ]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f'{len(found)} {kind} {name or ""} rendered, expected one'
    return found[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec['containers'] if c['name'] == name]
    return found


def env(container_: dict[str, Any]) -> dict[str, Any]:
    """name → value (a string, or the valueFrom mapping)."""
    return {e['name']: e.get('value', e.get('valueFrom')) for e in container_.get('env', [])}
