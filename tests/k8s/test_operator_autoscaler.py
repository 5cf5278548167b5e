"""The operator owns a BrokerCluster's HorizontalPodAutoscaler (kmock, real Redis): created with
an ownerReference when ``spec.autoscaling.enabled``, updated when the spec changes, repaired when
changed behind its back, deleted when autoscaling is switched off or removed; and the replicas
the HPA writes through the scale subresource reach the Deployment."""

from typing import Any

from kubeemulator import Kube, cluster_body

HPA = ('horizontalpodautoscalers', 'shoal')
AUTOSCALING = 'autoscaling/v2'


async def hpa_when(kube: Kube, check: Any, what: str) -> dict[str, Any] | None:
    """The HPA (None when there is none) once ``check`` holds for it."""

    async def probe() -> tuple[dict[str, Any] | None] | None:
        body = await kube.get(*HPA, api_version=AUTOSCALING)
        return (body,) if check(body) else None

    (found,) = await kube.eventually(probe, what)
    return found


async def hpa_present(kube: Kube, check: Any, what: str) -> dict[str, Any]:
    found = await hpa_when(kube, lambda b: b is not None and check(b), what)
    assert found is not None
    return found


async def change(kube: Kube, spec: dict[str, Any]) -> None:
    """Patch the cluster's spec and wait until the operator has reconciled that generation."""
    await kube.patch('brokerclusters', 'shoal', {'spec': spec})

    async def seen() -> bool:
        body = await kube.get('brokerclusters', 'shoal') or {}
        generation = body['metadata'].get('generation')
        return bool((body.get('status') or {}).get('observedGeneration') == generation)

    await kube.eventually(seen, f'the operator at the generation of {spec}')


async def test_the_operator_creates_updates_and_deletes_the_hpa(
    operator: Kube, store_url: str
) -> None:
    kube = operator
    await kube.redis_secret(store_url)
    scaling = {'enabled': True, 'minReplicas': 2, 'maxReplicas': 5}
    await kube.create('brokerclusters', cluster_body(autoscaling=scaling))
    hpa = await hpa_present(kube, lambda b: True, 'the HPA created')
    cluster = await kube.get('brokerclusters', 'shoal')
    assert cluster is not None
    [owner] = hpa['metadata']['ownerReferences']
    assert (owner['kind'], owner['name'], owner['uid']) == (
        'BrokerCluster', 'shoal', cluster['metadata']['uid'])  # fmt: skip
    assert owner['controller'] is True
    spec = hpa['spec']
    assert spec['scaleTargetRef'] == {'apiVersion': 'shoal.dev/v1alpha1', 'kind': 'BrokerCluster',
                                      'name': 'shoal'}  # fmt: skip
    assert (spec['minReplicas'], spec['maxReplicas']) == (2, 5)
    assert [m['type'] for m in spec['metrics']] == ['Resource']

    # the spec changes: bounds, a connections target, and the replicas the HPA writes through
    # /scale (a merge patch of spec.replicas here: kmock has no scale subresource logic). One
    # patch: kmock keeps the resourceVersion, and kopf can miss a quick run of spec changes.
    await change(
        kube,
        {'replicas': 4, 'autoscaling': {'maxReplicas': 8, 'targetConnectionsPerReplica': 1000}},
    )
    hpa = await hpa_present(kube, lambda b: b['spec']['maxReplicas'] == 8, 'the HPA updated')
    assert hpa['spec']['metrics'][1] == {'type': 'Pods', 'pods': {
        'metric': {'name': 'shoal_connections'},
        'target': {'type': 'AverageValue', 'averageValue': '1k'}}}  # fmt: skip

    async def followed() -> bool:
        deployment = await kube.get('deployments', 'shoal', api_version='apps/v1') or {}
        return bool((deployment.get('spec') or {}).get('replicas') == 4)

    await kube.eventually(followed, 'the Deployment at the replicas the HPA wrote')

    # changed behind the operator's back: the drift check puts it back
    await kube.patch(*HPA, {'spec': {'minReplicas': 1}}, api_version=AUTOSCALING)
    await hpa_present(kube, lambda b: b['spec']['minReplicas'] == 2, 'repaired')

    await change(kube, {'autoscaling': {'enabled': False}})
    await hpa_when(kube, lambda b: b is None, 'the HPA deleted when switched off')


async def test_the_hpa_goes_with_spec_autoscaling(operator: Kube, store_url: str) -> None:
    kube = operator
    await kube.redis_secret(store_url)
    await kube.create('brokerclusters', cluster_body(autoscaling={'enabled': True}))
    await hpa_present(kube, lambda b: True, 'the HPA created')
    await change(kube, {'autoscaling': None})
    await hpa_when(kube, lambda b: b is None, 'the HPA deleted with spec.autoscaling')


async def test_an_hpa_with_analytics_replicas_is_refused_and_none_is_created(
    operator: Kube, store_url: str
) -> None:
    kube = operator
    await kube.redis_secret(store_url)
    both = {'enabled': True, 'fromAnalytics': True}
    await kube.create('brokerclusters', cluster_body(autoscaling=both))

    async def refused() -> bool:
        return 'InvalidSpec' in await kube.event_reasons('shoal')

    await kube.eventually(refused, 'an InvalidSpec event')
    assert await kube.get(*HPA, api_version=AUTOSCALING) is None
