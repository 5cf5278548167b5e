"""The operator against kmock and a real Redis: a change of a BrokerCluster's ``spec.broker``
(a setting changed, one dropped, one added) reaches the ConfigMap and rolls the pods (the pod
template's config checksum changes); scaling and the periodic drift check leave the template
alone. Labels and annotations removed from ``spec.podTemplate`` leave the Deployment; those
others put there stay."""

from typing import Any

from kubeemulator import Kube, cluster_body

from shoal_broker import settings as broker
from shoal_operator.manifests import config
from shoal_operator.models import BrokerCluster


async def deployment(kube: Kube) -> dict[str, Any] | None:
    return await kube.get('deployments', 'shoal', api_version='apps/v1')


def checksum(found: dict[str, Any]) -> str:
    return str(found['spec']['template']['metadata']['annotations'][config.CONFIG_CHECKSUM])


async def settled(kube: Kube) -> dict[str, Any] | None:
    """The BrokerCluster once the operator's handler is done with its latest generation."""
    body = await kube.get('brokerclusters', 'shoal') or {}
    observed = (body.get('status') or {}).get('observedGeneration')
    return body if observed == body['metadata']['generation'] else None


async def test_a_settings_change_rolls_the_pods_and_nothing_else_does(
    operator: Kube, store_url: str
) -> None:
    await operator.redis_secret(store_url)
    await operator.create(
        'brokerclusters', cluster_body(broker={'logLevel': 'DEBUG', 'maxDeliveryAttempts': 5})
    )
    first = await operator.eventually(lambda: deployment(operator), 'the Deployment')
    before = checksum(first)
    created = await operator.get('configmaps', 'shoal-config', api_version='v1') or {}
    assert broker.ENV_METRICS_HEARTBEAT not in created['data']  # unset: the broker's default

    await operator.patch(
        'brokerclusters', 'shoal',
        {'spec': {'broker': {'logLevel': 'INFO', 'maxDeliveryAttempts': None,
                             'metricsHeartbeatSeconds': 20}}},
    )  # fmt: skip

    async def rolled() -> dict[str, Any] | None:
        found = await deployment(operator)
        return found if found is not None and checksum(found) != before else None

    changed = await operator.eventually(rolled, 'a new config checksum in the pod template')
    configmap = await operator.get('configmaps', 'shoal-config', api_version='v1') or {}
    assert configmap['data'][broker.ENV_LOG_LEVEL] == 'INFO'
    assert broker.ENV_MAX_DELIVERY_ATTEMPTS not in configmap['data']  # a dropped setting goes
    assert configmap['data'][broker.ENV_METRICS_HEARTBEAT] == '20'
    body = await operator.eventually(lambda: settled(operator), 'the update reconciled')
    assert checksum(changed) == config.config_checksum(
        BrokerCluster.from_body(body, default_image='shoal:test')
    )

    # scaling changes the Deployment but not its pod template
    await operator.patch('brokerclusters', 'shoal', {'spec': {'replicas': 3}})

    async def scaled() -> dict[str, Any] | None:
        found = await deployment(operator)
        return found if found is not None and found['spec']['replicas'] == 3 else None

    assert checksum(await operator.eventually(scaled, 'three replicas')) == checksum(changed)

    # with nothing changed, the reconciles of the drift check leave the Deployment unpatched
    await operator.eventually(lambda: settled(operator), 'the scaling reconciled')
    await operator.observer_passes(1)
    steady = await deployment(operator) or {}
    await operator.observer_passes(2)
    again = await deployment(operator) or {}
    assert again['metadata']['generation'] == steady['metadata']['generation']
    assert checksum(again) == checksum(changed)


def template_metadata(found: dict[str, Any]) -> dict[str, dict[str, str]]:
    meta = found['spec']['template']['metadata']
    return {'labels': meta.get('labels') or {}, 'annotations': meta.get('annotations') or {}}


async def test_pod_metadata_removed_from_the_spec_leaves_the_deployment_and_others_stays(
    operator: Kube, store_url: str
) -> None:
    await operator.redis_secret(store_url)
    extras = {
        'labels': {'team': 'billing', 'tier': 'gold'},
        'annotations': {'example.com/owner': 'ann'},
    }
    await operator.create('brokerclusters', cluster_body(podTemplate=extras))

    async def carrying_extras() -> dict[str, Any] | None:
        found = await deployment(operator)
        meta = template_metadata(found) if found is not None else None
        wanted = meta is not None and meta['labels'].get('team') == 'billing'
        return found if wanted and meta['annotations'].get('example.com/owner') == 'ann' else None

    first = await operator.eventually(carrying_extras, 'the podTemplate label and annotation')
    before = checksum(first)
    # someone else (kubectl, another controller) labels and annotates the Deployment's pods
    others = {
        'labels': {'example.com/cost-centre': '42'},
        'annotations': {'kubectl.kubernetes.io/restartedAt': '2026-11-21T09:00:00Z'},
    }
    await operator.patch('deployments', 'shoal', {'spec': {'template': {'metadata': others}}},
                         api_version='apps/v1')  # fmt: skip

    removal = {'labels': {'team': None}, 'annotations': None}
    await operator.patch('brokerclusters', 'shoal', {'spec': {'podTemplate': removal}})

    async def without_extras() -> dict[str, Any] | None:
        found = await deployment(operator)
        meta = template_metadata(found) if found is not None else None
        gone = meta is not None and 'team' not in meta['labels']
        return found if gone and 'example.com/owner' not in meta['annotations'] else None

    after = template_metadata(await operator.eventually(without_extras, 'the extras removed'))
    assert after['labels']['tier'] == 'gold'  # still in the spec
    assert after['labels']['example.com/cost-centre'] == '42'
    assert after['annotations']['kubectl.kubernetes.io/restartedAt'] == '2026-11-21T09:00:00Z'
    assert after['labels']['app.kubernetes.io/instance'] == 'shoal'  # the operator's own stay
    assert after['annotations'][config.CONFIG_CHECKSUM] == before  # no settings change, same sum

    # a drift pass neither brings the removed keys back nor strips the others' keys
    await operator.eventually(lambda: settled(operator), 'the removal reconciled')
    await operator.observer_passes(1)
    steady = template_metadata(await deployment(operator) or {})
    assert steady == after
