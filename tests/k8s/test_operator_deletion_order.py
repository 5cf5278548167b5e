"""The Secret naming Redis deleted before, together with, or after the resources it serves,
with cluster-wide RBAC (a finalizer holds each Queue and SharedSubscription): ``deletionPolicy:
Delete`` is carried out every time before the finalizer goes, with the Redis the operator last
reached the cluster through once the Secret is gone."""

import asyncio
import uuid
from typing import Any

import kopf
import pytest
import redis
from kubeemulator import Kube, cluster_body, subscription_body

from shoal_broker.store import keys
from shoal_broker.store.layout import kind_of
from shoal_operator import deletion, entities, k8s
from shoal_operator.runtime import Runtime, Settings

FINALIZER = 'shoal.dev/finalizer'


@pytest.fixture
def operator_settings() -> Settings:
    return Settings(broker_image='shoal:test', observe_seconds=0.5, retry_seconds=0.5,
                    own_namespace='shoal-system')  # fmt: skip


@pytest.fixture
def rbac_values() -> dict[str, Any]:
    return {'rbac': {'scope': 'cluster'}}


def definition_key(name: str) -> str:
    return keys.SubscriptionKeys.of(f'durable:global:*:{name}').definition


@pytest.mark.parametrize('secret', ['before', 'with', 'after'])
async def test_delete_is_honoured_whenever_the_secret_goes(
    operator: Kube, store_url: str, rds: redis.Redis, address: str, secret: str
) -> None:
    kube = operator
    billing = f'billing-{uuid.uuid4().hex[:8]}'
    await kube.redis_secret(store_url)
    await kube.create('brokerclusters', cluster_body())
    spec = {'clusterRef': {'name': 'shoal'}, 'queueName': f'{address}-q',
            'deletionPolicy': 'Delete'}  # fmt: skip
    await kube.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'}, 'spec': spec})
    await kube.create('sharedsubscriptions',
                      subscription_body(billing, address, deletionPolicy='Delete'))  # fmt: skip
    resources = [('queues', 'orders'), ('sharedsubscriptions', billing)]
    for plural, name in resources:

        async def held(p: str = plural, n: str = name) -> bool:
            body = await kube.get(p, n) or {}
            ready = any(c.get('type') == 'Ready' and c.get('status') == 'True'
                        for c in (body.get('status') or {}).get('conditions') or [])  # fmt: skip
            return ready and FINALIZER in (body['metadata'].get('finalizers') or [])

        await kube.eventually(held, f'{plural}/{name} Ready and held by the finalizer')
    assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-q')) == 'queue'
    assert rds.exists(definition_key(billing))

    async def delete_resources() -> None:
        for plural, name in resources:
            await kube.delete(plural, name)

    async def delete_secret() -> None:
        await kube.delete('secrets', 'redis', api_version='v1')

    if secret == 'before':
        await delete_secret()
        await kube.eventually(lambda: _gone(kube, 'secrets', 'redis', 'v1'), 'the Secret gone')
        await kube.observer_passes(2)  # the operator has found the Secret gone
        await delete_resources()
    elif secret == 'with':
        await asyncio.gather(delete_secret(), delete_resources())
    else:
        await delete_resources()
        await delete_secret()
    # the BrokerCluster stays: what releases each finalizer is the policy carried out, not the
    # cluster going away
    for plural, name in resources:
        await kube.eventually(lambda p=plural, n=name: _gone(kube, p, n), f'{plural}/{name} gone')
    assert rds.hget(keys.ADDRESSES, f'{address}-q') is None
    assert not rds.exists(definition_key(billing))
    for _, name in resources:
        reasons = await kube.event_reasons(name)
        assert 'FinalizerReleased' not in reasons
        assert 'Deprovisioned' in reasons
    await kube.delete('brokerclusters', 'shoal')


async def _gone(kube: Kube, plural: str, name: str, api_version: str | None = None) -> bool:
    found = await (kube.get(plural, name, api_version=api_version) if api_version
                   else kube.get(plural, name))  # fmt: skip
    return found is None


async def test_drift_repair_leaves_a_resource_deleted_after_the_pass_began(
    kube: Kube, store_url: str, rds: redis.Redis, address: str
) -> None:
    """An observer pass samples the resources it listed when it began. One deleted meanwhile,
    its deletion policy carried out, reads as drifted (missing from Redis): the repair reads the
    resource afresh and declares nothing for one that is gone or being deleted."""
    await kube.redis_secret(store_url)
    await kube.create('brokerclusters', cluster_body())
    runtime = Runtime(Settings())
    runtime.kube = k8s.Kube(kopf.ConnectionInfo(server=str(kube.emulator.url)))
    try:
        listed = []
        for name, finalizers in (('gone', []), ('going', ['example.com/held']), ('kept', [])):
            spec = {'clusterRef': {'name': 'shoal'}, 'queueName': f'{address}-{name}',
                    'deletionPolicy': 'Delete'}  # fmt: skip
            meta = {'name': name, 'finalizers': finalizers}
            await kube.create('queues', {'kind': 'Queue', 'metadata': meta, 'spec': spec})
            body = await kube.get('queues', name)
            assert body is not None
            outcome = await entities.provision(runtime, 'Queue', body)
            listed.append({**body, 'status': outcome.status})  # as the pass listed it
            assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-{name}')) == 'queue'
        for name in ('gone', 'going'):
            await kube.delete('queues', name)
        going = await kube.get('queues', 'going')
        assert going is not None
        assert going['metadata'].get('deletionTimestamp')
        for body in listed:  # each deletion policy carried out; 'kept' lost behind our back
            result, _ = await deletion.remove(runtime, 'Queue', body, None)
            assert result.done, result
        samples = await entities.sample_all(runtime, 'Queue', listed)
        assert [live is not None for _, live in samples] == [False, False, True]
        assert rds.hget(keys.ADDRESSES, f'{address}-gone') is None
        assert rds.hget(keys.ADDRESSES, f'{address}-going') is None
        assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-kept')) == 'queue'  # repaired
    finally:
        await runtime.close()
