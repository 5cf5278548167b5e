"""
Reconciling a BrokerCluster: its children (created, corrected, also by the drift check), its
status from the Deployment and a Redis probe, and the analytics job's summary (issue #6).
"""

import logging
import secrets
from collections.abc import Mapping
from typing import Any

from shoal_broker.errors import StoreUnavailable
from shoal_operator import analytics, conditions, k8s, manifests, status
from shoal_operator.manifests import naming, security
from shoal_operator.models import API_VERSION, BrokerCluster, describe
from shoal_operator.runtime import ClusterUnavailable, Runtime, now

logger = logging.getLogger(__name__)


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body['metadata']
    return {
        'apiVersion': body['apiVersion'],
        'kind': body['kind'],
        'name': meta['name'],
        'uid': meta.get('uid', ''),
        'controller': True,
        'blockOwnerDeletion': True,
    }


async def apply_cluster(runtime: Runtime, body: Mapping[str, Any]) -> BrokerCluster:
    """Create or correct every child object of the cluster (also the drift check), with the Redis
    URL rendered from ``spec.redis`` when it is not the user's Secret. A child of
    an optional kind the API server does not serve is left out, said once per new problem in
    a Warning Event and the log, and on the ChildrenApplied condition while it lasts."""
    cluster = BrokerCluster.from_body(body, default_image=runtime.settings.broker_image)
    kube = runtime.api()
    owner = owner_reference(body)
    not_served = []
    redis_url = None
    if cluster.redis.rendered:
        try:
            redis_url = await runtime.redis_url(cluster)
        except ClusterUnavailable:  # reported on the RedisConnected condition; the rest applies
            pass
    # the management password is made once and kept: tools holding it keep working
    management = naming.management_secret(cluster)
    password = await kube.secret_value(cluster.meta.namespace, management, 'password')
    password = password or secrets.token_urlsafe(24)
    namespace, uid = cluster.meta.namespace, cluster.meta.uid
    for manifest in manifests.build_all(cluster, redis_url, password):
        manifest['metadata']['ownerReferences'] = [owner]
        runtime.absent.discard((namespace, manifest['kind'], manifest['metadata']['name'], uid))
        try:
            await kube.apply(manifest)
        except k8s.KindNotServed as exc:
            if exc.kind not in manifests.OPTIONAL_KINDS:
                raise
            field = manifests.OPTIONAL_KINDS[exc.kind]
            not_served.append(f'{exc.description}: install its CRD or turn {field} off')
    for api_version, kind, name in manifests.switched_off(cluster):
        # deleted once per run, not every pass: what this run deleted or found absent stays so
        # until this run creates it again (a restart deletes once more)
        if (namespace, kind, name, uid) not in runtime.absent:
            await kube.delete(api_version, kind, namespace, name)  # a 404 is absent too
            runtime.absent.add((namespace, kind, name, uid))
    reported = set(runtime.kinds_not_served.get(cluster.meta.uid, ()))
    for condition in (body.get('status') or {}).get('conditions') or []:  # before a restart
        if condition.get('type') == 'ChildrenApplied' and condition.get('status') == 'False':
            reported.update(str(condition.get('message')).split('; '))
    for message in not_served:
        if message not in reported:
            logger.warning('BrokerCluster %s: %s', describe(body), message)
            await kube.post_event(body, 'Warning', 'KindNotServed', message)
    runtime.kinds_not_served[cluster.meta.uid] = not_served
    return cluster


async def observe_cluster(
    runtime: Runtime, body: Mapping[str, Any], cluster: BrokerCluster
) -> dict[str, Any]:
    """The cluster's status from its Deployment, a Redis probe and the Secrets its pods mount;
    a Warning Event for each such Secret newly found missing or incomplete."""
    kube = runtime.api()
    previous = body.get('status') or {}
    deployment = await kube.get('apps/v1', 'Deployment', cluster.meta.namespace,
                                naming.child(cluster))  # fmt: skip
    secret_problems = await _secret_problems(runtime, body, cluster, previous)
    redis_info, redis_error, declared = None, '', None
    try:
        registry = await runtime.registry(cluster, fresh=True)  # once per cluster per pass
        redis_info = await registry.info()
        declared = await registry.subscription_count()
    except (StoreUnavailable, ClusterUnavailable) as exc:
        redis_error = str(exc)
    new = status.cluster_status(
        cluster, deployment=deployment, redis=redis_info, redis_error=redis_error,
        declared_subscriptions=declared, previous=previous.get('conditions') or [], now=now(),
        secret_problems=secret_problems,
        kinds_not_served=runtime.kinds_not_served.get(cluster.meta.uid, []),
    )  # fmt: skip
    new.update(
        selector=naming.selector(cluster),
        image=cluster.image,
        bindingSecret=naming.child(cluster, 'connection'),
        endpoints=[{
            'name': scheme, 'host': naming.service_host(cluster), 'port': port,
            'url': f'{scheme}://{naming.service_host(cluster)}:{port}',
        } for scheme, port in security.client_ports(cluster).items()],
    )  # fmt: skip
    return new


async def _secret_problems(
    runtime: Runtime, body: Mapping[str, Any], cluster: BrokerCluster, previous: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """What is wrong with the Secrets the pods mount, reported once per new problem.

    The Deployment is applied all the same (``apply_cluster`` does not wait for them): its pods
    wait in ContainerCreating and start by themselves once the Secret is there, which is how
    Kubernetes treats a missing Secret volume and what a Secret created a moment after the
    cluster needs (cert-manager, external-secrets); during a rollout the old pods keep serving
    (``maxUnavailable: 0``). Every pass of the observer checks again, so the condition clears
    when the Secret appears."""
    kube = runtime.api()
    namespace = cluster.meta.namespace
    found = {mount.secret: await kube.secret_keys(namespace, mount.secret)
             for mount in security.secret_mounts(cluster)}  # fmt: skip
    problems = security.secret_problems(cluster, found)
    reported = set(runtime.secret_warnings.get(cluster.meta.uid, ()))
    for condition in previous.get('conditions') or []:  # posted before the operator restarted
        if condition.get('type') == 'SecretsFound' and condition.get('status') == 'False':
            reported.update(str(condition.get('message')).split('; '))
    for reason, message in problems:
        if message not in reported:
            await kube.post_event(body, 'Warning', reason, message)
    runtime.secret_warnings[cluster.meta.uid] = {message for _, message in problems}
    return problems


async def close_the_loop(
    runtime: Runtime, body: Mapping[str, Any], cluster: BrokerCluster, new: dict[str, Any]
) -> None:
    """Report the analytics job's latest summary on ``new`` (the cluster's next status), post
    Events for a summary not seen before and apply its replica recommendation if asked to."""
    try:
        summary = await (await runtime.registry(cluster)).analytics_summary()
    except (StoreUnavailable, ClusterUnavailable):
        return
    except ValueError as exc:
        logger.warning('unusable analytics summary for %s: %s', describe(body), exc)
        return
    if summary is None:
        return
    previous = body.get('status') or {}
    new['analytics'] = analytics.section(summary)
    new['conditions'] = conditions.merged(new.get('conditions') or [], [
        analytics.anomalies_condition(summary, generation=cluster.meta.generation,
                                      previous=previous.get('conditions') or [], now=now()),
    ])  # fmt: skip
    kube = runtime.api()
    if analytics.is_new(summary, previous):
        for type_, reason, message in analytics.events(summary):
            await kube.post_event(body, type_, reason, message)
    replicas = None if cluster.meta.paused else analytics.replicas_to_apply(cluster, summary)
    if replicas is not None:
        await kube.patch(API_VERSION, 'BrokerCluster', cluster.meta.namespace, cluster.meta.name,
                         {'spec': {'replicas': replicas}})  # fmt: skip
        await kube.post_event(
            body,
            'Normal',
            'ScaledFromAnalytics',
            f'replicas {cluster.replicas} -> {replicas}: {summary.reason}',
        )
