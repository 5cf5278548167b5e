"""
What the operator creates for a BrokerCluster is accepted by every supported Kubernetes version:
each built-in child of the example cluster (and of a minimal one, and of the autoscaled example
with its HorizontalPodAutoscaler), as the API server hands the
cluster over (defaults applied), validates against the OpenAPI schemas of the oldest supported
version and of 1.30 (kubernetes-validate, strict: a field that version lacks is an error).
"""

import copy
import pathlib
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crdcheck import load_crds, oldest_kubernetes
from crdrules import defaulted, resource_schema

from shoal_operator import manifests
from shoal_operator.models import BrokerCluster

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSIONS = (oldest_kubernetes(), '1.30.0')
EXAMPLE = yaml.safe_load((ROOT / 'examples/brokercluster.yaml').read_text())
AUTOSCALED = yaml.safe_load((ROOT / 'examples/brokercluster-autoscaled.yaml').read_text())
MINIMAL = {'apiVersion': 'shoal.dev/v1alpha1', 'kind': 'BrokerCluster',
           'metadata': {'name': 'shoal'},
           'spec': {'redis': {'secretName': 'r'}, 'auth': {'usersSecretName': 'u'}}}  # fmt: skip


def children(body: dict[str, Any]) -> list[dict[str, Any]]:
    body = defaulted(resource_schema(load_crds()['BrokerCluster']), copy.deepcopy(body))
    body['metadata'].update(namespace='msg', uid='u1', generation=1)
    built = manifests.build_all(BrokerCluster.from_body(body, default_image='img:1'))
    return [m for m in built if m['apiVersion'] != 'monitoring.coreos.com/v1']


@pytest.mark.parametrize('version', VERSIONS)
@pytest.mark.parametrize(
    'body', [EXAMPLE, MINIMAL, AUTOSCALED], ids=['example', 'minimal', 'autoscaled']
)
def test_every_built_in_child_is_valid_for_every_supported_version(
    body: dict[str, Any], version: str
) -> None:
    problems = {}
    for child in children(body):
        try:
            kubernetes_validate.validate(child, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems[child['kind']] = f'{list(error.path)}: {error.message}'
    assert problems == {}


def test_the_version_check_refuses_a_field_the_version_lacks() -> None:
    (deployment,) = [c for c in children(EXAMPLE) if c['kind'] == 'Deployment']
    pod = deployment['spec']['template']['spec']
    pod['containers'][0]['securityContext']['appArmorProfile'] = {'type': 'RuntimeDefault'}
    with pytest.raises(kubernetes_validate.ValidationError, match='appArmorProfile'):
        kubernetes_validate.validate(deployment, '1.28.0', strict=True)
    kubernetes_validate.validate(deployment, '1.30.0', strict=True)  # appArmorProfile: 1.30


@pytest.mark.parametrize('version', VERSIONS)
def test_the_hpa_is_checked_and_a_field_autoscaling_v2_lacks_is_refused(version: str) -> None:
    (hpa,) = [c for c in children(AUTOSCALED) if c['kind'] == 'HorizontalPodAutoscaler']
    kubernetes_validate.validate(hpa, version, strict=True)
    hpa['spec']['metrics'][0]['resource']['target']['averageUtilisation'] = 70
    with pytest.raises(kubernetes_validate.ValidationError, match='averageUtilisation'):
        kubernetes_validate.validate(hpa, version, strict=True)
