"""
values.schema.json turns mistakes into install-time errors naming the key: typos, wrong types,
values outside their enum or range, and the one cross-field rule (no Redis at all).
"""

from typing import Any

import pytest
import yaml
from chartrender import CHART_DIR, VARIANTS, chart
from helm_python import HelmValuesError

PASSED_THROUGH = {'resources'}

BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    'unknown top-level key': ({'operatr': {}}, "additional properties 'operatr' not allowed"),
    'unknown nested key': ({'redis': {'persistance': {}}}, "'persistance' not allowed"),
    'rbac scope': ({'rbac': {'scope': 'global'}}, '/rbac/scope'),
    'namespace not a DNS label': ({'rbac': {'watchNamespaces': ['Team_A']}}, 'watchNamespaces'),
    'replicas as a string': ({'exampleCluster': {'replicas': 'two'}}, '/exampleCluster/replicas'),
    'negative replicas': ({'exampleCluster': {'replicas': -1}}, 'minimum'),
    'no redis at all': ({'redis': {'enabled': False}}, '/redis/existingSecret/name'),
    'appendfsync': ({'redis': {'appendfsync': 'sometimes'}}, '/redis/appendfsync'),
    'two analytics runs at once': ({'analytics': {'concurrencyPolicy': 'Allow'}}, 'Forbid'),
    'unknown runner': ({'analytics': {'runner': 'sparkSubmitter'}}, '/analytics/runner'),
    'spark memory': ({'analytics': {'driver': {'memory': '1 GB'}}}, '/analytics/driver/memory'),
    'pull policy': ({'operator': {'image': {'pullPolicy': 'Sometimes'}}}, 'pullPolicy'),
    'log level': ({'operator': {'logLevel': 'verbose'}}, '/operator/logLevel'),
    'scrape interval': ({'serviceMonitor': {'interval': 'thirty'}}, '/serviceMonitor/interval'),
    'port out of range': ({'networkPolicy': {'apiServer': {'ports': [70000]}}}, 'maximum'),
    'relative lake path': ({'analytics': {'lake': {'mountPath': 'data'}}}, 'mountPath'),
    'test URL not AMQP': ({'tests': {'brokerUrl': 'http://x'}}, '/tests/brokerUrl'),
    'no users and no ANONYMOUS': ({'exampleCluster': {'auth': {'usersSecretName': ''}}},
                                  '/exampleCluster/auth/usersSecretName'),
    'users Secret not a name': ({'exampleCluster': {'auth': {'usersSecretName': 'My_Users'}}},
                                '/exampleCluster/auth/usersSecretName'),
    'anonymous as a string': ({'exampleCluster': {'auth': {'allowAnonymous': 'yes'}}},
                              '/exampleCluster/auth/allowAnonymous'),
    'credentials not a name': ({'tests': {'credentialsSecret': 'Creds!'}},
                               '/tests/credentialsSecret'),
}  # fmt: skip


@pytest.mark.parametrize(('values', 'message'), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_are_rejected_with_the_key_named(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmValuesError, match=message.replace('/', '.')):
        chart().validate_schema(values)
    # Rendering (what helm install does) refuses them too.
    with pytest.raises(HelmValuesError):
        chart().render(values, name='rel', namespace='shoal-system')


def test_every_documented_variant_passes_the_schema(variant: str) -> None:
    chart().validate_schema(VARIANTS[variant])


def test_values_yaml_comments_every_key() -> None:
    """Each key has a comment on the line above; Kubernetes objects passed through as they are
    (resources) are documented by the comment on their own key."""
    text = (CHART_DIR / 'values.yaml').read_text()
    lines = text.splitlines()
    uncommented: list[str] = []

    def walk(node: yaml.Node, path: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            where = f'{path}.{key.value}'.lstrip('.')
            if not lines[key.start_mark.line - 1].strip().startswith('#'):
                uncommented.append(where)
            if key.value not in PASSED_THROUGH:
                walk(value, where)

    walk(yaml.compose(text), '')
    assert uncommented == []
