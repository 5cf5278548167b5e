"""Least privilege both ways, per RBAC variant of the chart: the operator, watching what the
variant lets it watch, goes through everything it does (children created, drift repaired,
optional children switched off, status and conditions, finalizers, Events) and then

- every request it made is allowed by the variant's rendered roles (the operator fixture
  checks this for every test that runs it), and
- every grant of those roles was used by at least one of its requests."""

from typing import Any

import pytest
import rbac
import redis
from kubeemulator import WATCHED, Kube, cluster_body, condition, subscription_body

from shoal_broker.store import keys
from shoal_broker.store.registry import Registry
from shoal_operator.runtime import Settings

CHILDREN = [('v1', 'configmaps', 'shoal-config'), ('v1', 'secrets', 'shoal-connection'),
            ('apps/v1', 'deployments', 'shoal'), ('v1', 'services', 'shoal'),
            ('policy/v1', 'poddisruptionbudgets', 'shoal'),
            ('autoscaling/v2', 'horizontalpodautoscalers', 'shoal'),
            ('networking.k8s.io/v1', 'networkpolicies', 'shoal'),
            ('monitoring.coreos.com/v1', 'servicemonitors', 'shoal')]  # fmt: skip
MANAGED_BY = 'app.kubernetes.io/managed-by'


@pytest.fixture(params=['namespaced', 'cluster'])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def operator_settings(mode: str) -> Settings:
    namespaces = WATCHED if mode == 'namespaced' else ()
    return Settings(broker_image='shoal:test', observe_seconds=0.5, retry_seconds=0.5,
                    namespaces=namespaces, own_namespace='shoal-system')  # fmt: skip


@pytest.fixture
def rbac_values(mode: str) -> dict[str, Any]:
    if mode == 'namespaced':
        return {'rbac': {'watchNamespaces': list(WATCHED)}}
    return {'rbac': {'scope': 'cluster'}}


def ready(body: dict[str, Any] | None) -> bool:
    return condition(body, 'Ready').get('status') == 'True'


async def test_the_operator_uses_every_grant_and_nothing_else(
    operator: Kube, store_url: str, rds: redis.Redis, rbac_values: dict[str, Any],
    address: str,
) -> None:  # fmt: skip
    kube = operator
    billing = f'billing-{address[-8:]}'  # subscription names are Redis-wide: one per test
    registry = Registry.from_url(store_url)
    try:  # a declaration whose Queue is gone: the operator checks the Queue is gone (get)
        await registry.declare_queue(f'{address}-ghost', 'default/ghost')
    finally:
        await registry.close()
    await kube.redis_secret(store_url)
    optional = {
        'metrics': {'serviceMonitor': {'enabled': True}},
        'networkPolicy': {'enabled': True},
        'autoscaling': {'enabled': True},
    }
    await kube.create('brokerclusters', cluster_body(**optional))
    queue = {
        'clusterRef': {'name': 'shoal'},
        'queueName': f'{address}-q',
        'deletionPolicy': 'Delete',
    }
    await kube.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'}, 'spec': queue})
    await kube.create('sharedsubscriptions', subscription_body(
        billing, address, maxConsumers=2, deletionPolicy='Delete'))  # fmt: skip
    for plural, name in [('queues', 'orders'), ('sharedsubscriptions', billing)]:
        await kube.eventually(lambda p=plural, n=name: _ready(kube, p, n), f'{plural}/{name}')

    # a cluster the watch has not brought (here: there is none) is read from the API server
    stray = {'clusterRef': {'name': 'missing'}, 'queueName': f'{address}-stray'}
    await kube.create('queues', {'kind': 'Queue', 'metadata': {'name': 'stray'}, 'spec': stray})

    async def not_found() -> bool:
        found = condition(await kube.get('queues', 'stray'), 'ClusterAvailable')
        return found.get('reason') == 'ClusterNotFound'

    await kube.eventually(not_found, 'the stray Queue ClusterNotFound')

    # drift: each child changed behind the operator's back is patched back
    for api_version, plural, name in CHILDREN:
        await kube.eventually(lambda a=api_version, p=plural, n=name: kube.get(p, n, api_version=a),
                              f'{plural}/{name}')  # fmt: skip
        await kube.patch(plural, name, {'metadata': {'labels': {MANAGED_BY: 'someone'}}},
                         api_version=api_version)  # fmt: skip
    for api_version, plural, name in CHILDREN:

        async def repaired(a: str = api_version, p: str = plural, n: str = name) -> bool:
            body = await kube.get(p, n, api_version=a) or {}
            return bool(body['metadata']['labels'][MANAGED_BY] == 'shoal-operator')

        await kube.eventually(repaired, f'{plural}/{name} repaired')

    # optional children switched off are deleted
    off = {'metrics': {'serviceMonitor': {'enabled': False}}, 'networkPolicy': {'enabled': False},
           'autoscaling': {'enabled': False}}  # fmt: skip
    await kube.patch('brokerclusters', 'shoal', {'spec': off})
    for api_version, plural, name in CHILDREN[-3:]:

        async def deleted(a: str = api_version, p: str = plural, n: str = name) -> bool:
            return await kube.get(p, n, api_version=a) is None

        await kube.eventually(deleted, f'{plural}/{name} deleted')

    # deletion acting on Redis (finalizers)
    await kube.delete('queues', 'orders')
    await kube.delete('sharedsubscriptions', billing)
    for plural, name in [('queues', 'orders'), ('sharedsubscriptions', billing)]:

        async def gone(p: str = plural, n: str = name) -> bool:
            return await kube.get(p, n) is None

        await kube.eventually(gone, f'{plural}/{name} gone')

    async def released() -> bool:
        return rds.hget(keys.PROVISIONED, keys.provisioned_queue(f'{address}-ghost')) is None

    await kube.eventually(released, 'the orphan released')
    used = {need.grant for need, _ in rbac.operator_accesses(kube.emulator)}
    granted = rbac.granted(rbac.operator_roles(rbac_values))
    assert granted - used == set(), f'granted by {rbac_values} but never used'


async def _ready(kube: Kube, plural: str, name: str) -> bool:
    return ready(await kube.get(plural, name))
