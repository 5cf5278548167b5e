"""
The reconcile steps behind each kopf handler: read the model, act through ``k8s`` and the store
registry, and return the new status. Decisions are delegated to the pure modules (``manifests``,
``provisioning``, ``status``); outcomes are plain values and exceptions that ``handlers`` turns into
kopf's terms (status patches, retries, events).
"""

import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store.registry import EntityState, ProvisionConflict, Provisioned, Removal
from shoal_operator import analytics, conditions, manifests, metrics, provisioning, status
from shoal_operator.manifests import naming
from shoal_operator.models import (
    API_VERSION,
    BrokerCluster,
    DeletionPolicy,
    InvalidSpec,
    ManagementPolicy,
    Queue,
    SharedSubscription,
)
from shoal_operator.runtime import ClusterUnavailable, Runtime

Entity = Queue | SharedSubscription
logger = logging.getLogger(__name__)
AT_LIMIT = 'consumersAtLimit'
"""Key of a sample: whether a subscription is at its consumer limit (for the condition)."""


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


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


# -- BrokerCluster --------------------------------------------------------------------------------


async def apply_cluster(runtime: Runtime, body: Mapping[str, Any]) -> BrokerCluster:
    """Create or correct every child object of the cluster (also the drift check)."""
    cluster = BrokerCluster.from_body(body, default_image=runtime.settings.broker_image)
    kube = runtime.api()
    owner = owner_reference(body)
    for manifest in manifests.build_all(cluster):
        manifest['metadata']['ownerReferences'] = [owner]
        await kube.apply(manifest)
    for api_version, kind, name in manifests.switched_off(cluster):
        await kube.delete(api_version, kind, cluster.meta.namespace, name)
    return cluster


async def observe_cluster(
    runtime: Runtime, cluster: BrokerCluster, previous: Mapping[str, Any]
) -> dict[str, Any]:
    """The cluster's status from its Deployment and a Redis probe."""
    kube = runtime.api()
    deployment = await kube.get('apps/v1', 'Deployment', cluster.meta.namespace,
                                naming.child(cluster))  # fmt: skip
    redis_info, redis_error, declared = None, '', None
    try:
        registry = await runtime.registry(cluster)
        redis_info = await registry.info()
        declared = await registry.subscription_count()
    except (StoreUnavailable, ClusterUnavailable) as exc:
        redis_error = str(exc)
    new = status.cluster_status(
        cluster, deployment=deployment, redis=redis_info, redis_error=redis_error,
        declared_subscriptions=declared, previous=previous.get('conditions') or [], now=now(),
    )  # fmt: skip
    new.update(
        selector=naming.selector(cluster),
        image=cluster.image,
        bindingSecret=naming.child(cluster, 'connection'),
        endpoints=[{
            'name': 'amqp', 'host': naming.service_host(cluster), 'port': naming.AMQP_PORT,
            'url': f'amqp://{naming.service_host(cluster)}:{naming.AMQP_PORT}',
        }],
    )  # fmt: skip
    return new


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
        logger.warning('unusable analytics summary for %s: %s', entity_name(body), exc)
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


# -- Queue and SharedSubscription -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    status: dict[str, Any]
    retry: bool = False
    """Something may resolve by itself (cluster appears, Redis returns): try again later."""
    problem: tuple[str, str] | None = None
    provisioned: Provisioned | None = None
    """What the write to Redis did (None when nothing was written)."""


_WRITES = {
    Provisioned.CREATED: 'created in Redis',
    Provisioned.ADOPTED: 'adopted: it existed in Redis and is now declared by this resource',
    Provisioned.UPDATED: 'updated in Redis',
    Provisioned.UNCHANGED: 'Redis holds the declared definition',
    Provisioned.RECREATED: 'recreated with the new topic or selector; its backlog was dropped',
}


def parse(kind: str, body: Mapping[str, Any]) -> Entity:
    return Queue.from_body(body) if kind == 'Queue' else SharedSubscription.from_body(body)


async def provision(runtime: Runtime, kind: str, body: Mapping[str, Any]) -> Outcome:
    """Declare the queue or subscription in its cluster's Redis; the status says how it went."""
    previous = (body.get('status') or {}).get('conditions') or []
    generation = int((body.get('metadata') or {}).get('generation') or 1)
    try:
        entity = parse(kind, body)
    except (InvalidSpec, ValueError) as exc:
        return _outcome(generation, previous, ('InvalidSpec', str(exc)), None, paused=False)
    identity = _identity(entity)
    if entity.meta.paused:
        return _outcome(generation, previous, None, None, paused=True, extra=identity)
    observe_only = entity.management_policy is ManagementPolicy.OBSERVE_ONLY
    try:
        if isinstance(entity, SharedSubscription):
            provisioning.check_selector(entity)
        cluster = await runtime.cluster(entity.cluster, entity.meta.namespace)
        registry = await runtime.registry(cluster)
        if observe_only:
            state = await _state(runtime, entity, registry)
            provisioned = ('Observed', 'exists in Redis') if state.exists else None
            problem = None if state.exists else ('NotFound', 'not in Redis (ObserveOnly)')
            return _outcome(generation, previous, problem, provisioned, paused=False,
                            observe_only=True, extra=identity)  # fmt: skip
        if isinstance(entity, SharedSubscription):
            result = await registry.declare_subscription(
                provisioning.declaration(entity), recreate=entity.recreate_on_change
            )
        else:
            result = await registry.declare_queue(entity.address, entity.meta.owner)
        metrics.PROVISIONED.labels(kind, result.value).inc()
        outcome = _outcome(generation, previous, None, ('Provisioned', _WRITES[result]),
                           paused=False, extra=identity)  # fmt: skip
        return dataclasses.replace(outcome, provisioned=result)
    except InvalidSpec as exc:
        reason = 'InvalidSelector' if 'selector' in str(exc) else 'InvalidSpec'
        return _outcome(generation, previous, (reason, str(exc)), None, paused=False,
                        extra=identity)  # fmt: skip
    except ClusterUnavailable as exc:
        return _outcome(generation, previous, (exc.reason, str(exc)), None, paused=False,
                        extra=identity, retry=True)  # fmt: skip
    except ProvisionConflict as exc:
        return _outcome(generation, previous, ('Conflict', str(exc)), None, paused=False,
                        extra=identity, retry=True)  # fmt: skip
    except StoreUnavailable as exc:
        return _outcome(generation, previous, ('RedisUnavailable', str(exc)), None,
                        paused=False, extra=identity, retry=True)  # fmt: skip


def _identity(entity: Entity) -> dict[str, Any]:
    if isinstance(entity, SharedSubscription):
        return {'linkName': entity.link_name,
                'brokerId': provisioning.subscription_key(entity).id}  # fmt: skip
    return {'address': entity.address}


def _outcome(
    generation: int,
    previous: Sequence[Any],
    problem: tuple[str, str] | None,
    provisioned: tuple[str, str] | None,
    *,
    paused: bool,
    observe_only: bool = False,
    extra: Mapping[str, Any] | None = None,
    retry: bool = False,
) -> Outcome:
    conds = status.entity_conditions(
        generation=generation, previous=previous, now=now(), problem=problem,
        provisioned=provisioned, paused=paused, observe_only=observe_only,
    )  # fmt: skip
    new = {'observedGeneration': generation, 'conditions': conds, **(extra or {})}
    return Outcome(new, retry=retry, problem=problem)


async def _state(runtime: Runtime, entity: Entity, registry: Any) -> EntityState:
    if isinstance(entity, SharedSubscription):
        state: EntityState = await registry.subscription_state(
            provisioning.subscription_key(entity)
        )
    else:
        state = await registry.queue_state(entity.address)
    return state


async def sample(runtime: Runtime, kind: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Live numbers for the status (and drift repair: a declared entity missing from Redis is
    declared again); None when nothing can be sampled now."""
    try:
        entity = parse(kind, body)
        cluster = await runtime.cluster(entity.cluster, entity.meta.namespace)
        registry = await runtime.registry(cluster)
        state = await _state(runtime, entity, registry)
        managed = entity.management_policy is ManagementPolicy.MANAGED and not entity.meta.paused
        provisioned = conditions.is_true((body.get('status') or {}).get('conditions') or [],
                                         'Provisioned')  # fmt: skip
        if managed and provisioned and (not state.exists or not state.owner):
            await provision(runtime, kind, body)  # removed or released behind our back
            state = await _state(runtime, entity, registry)
    except (
        InvalidSpec,
        ValueError,
        ClusterUnavailable,
        StoreUnavailable,
        ProvisionConflict,
    ) as exc:
        logger.debug('no sample of %s %s: %s', kind, entity_name(body), exc)
        return None
    if isinstance(entity, SharedSubscription):
        live = status.subscription_live(entity, state, now())
        limit = status.at_limit(entity, state)
        if limit is not None:
            live[AT_LIMIT] = limit
        return live
    return status.queue_live(entity, state, now())


# -- deletion -------------------------------------------------------------------------------------


def needs_finalizer(spec: Mapping[str, Any]) -> bool:
    """Only deletion that acts on Redis holds the resource (kopf adds/removes the finalizer)."""
    policy = str(spec.get('deletionPolicy', DeletionPolicy.RETAIN.value))
    managed = spec.get('managementPolicy', ManagementPolicy.MANAGED.value) == 'Managed'
    return bool(managed and policy != DeletionPolicy.RETAIN.value)


@dataclasses.dataclass(frozen=True, slots=True)
class DeletionResult:
    done: bool
    message: str
    released: provisioning.Release | None = None
    blocked: tuple[str, str] | None = None
    """(reason, message) for the DeletionBlocked condition while waiting."""


async def remove(
    runtime: Runtime,
    kind: str,
    body: Mapping[str, Any],
    unreachable_since: datetime.datetime | None,
) -> tuple[DeletionResult, datetime.datetime | None]:
    """Act on the deletion policy; returns the result and when Redis was first unreachable."""
    entity = parse(kind, body)
    cluster: BrokerCluster | None = None
    try:
        cluster = await runtime.cluster(entity.cluster, entity.meta.namespace)
    except ClusterUnavailable:
        cluster = None
    context = provisioning.DeletionContext(
        policy=entity.deletion_policy,
        force=entity.meta.force_delete,
        paused=entity.meta.paused,
        cluster_present=cluster is not None,
        unreachable_since=unreachable_since,
        timeout_seconds=cluster.finalizer_timeout_seconds if cluster else 0,
    )
    hatch = provisioning.escape_hatch(context, now())
    if hatch is not None or cluster is None:
        release = hatch or provisioning.Release.CLUSTER_GONE
        metrics.FINALIZERS_RELEASED.labels(release.value).inc()
        return DeletionResult(True, f'left in Redis: {release.value}', released=release), None
    only_if_empty = entity.deletion_policy is DeletionPolicy.DELETE_IF_EMPTY
    try:
        registry = await runtime.registry(cluster)
        if isinstance(entity, SharedSubscription):
            removal = await registry.remove_subscription(
                provisioning.subscription_key(entity), entity.meta.owner, delete=True,
                only_if_empty=only_if_empty,
            )  # fmt: skip
        else:
            removal = await registry.remove_queue(
                entity.address, entity.meta.owner, delete=True, only_if_empty=only_if_empty
            )
    except (StoreUnavailable, ClusterUnavailable) as exc:
        since = unreachable_since or now()
        return DeletionResult(False, str(exc), blocked=('RedisUnavailable', str(exc))), since
    if removal is Removal.IN_USE:
        why = ('messages are waiting or consumers are attached' if only_if_empty
               else 'consumers are attached')  # fmt: skip
        return DeletionResult(
            False, why, blocked=('NotEmpty' if only_if_empty else 'ConsumersAttached', why)
        ), None
    return DeletionResult(True, f'{removal.value} in Redis'), None


def blocked_conditions(body: Mapping[str, Any], reason: str, message: str) -> list[Any]:
    previous = (body.get('status') or {}).get('conditions') or []
    generation = int((body.get('metadata') or {}).get('generation') or 1)
    blocked = conditions.make_condition(
        'DeletionBlocked', True, reason=reason, message=message, generation=generation,
        previous=previous, now=now(),
    )  # fmt: skip
    return conditions.merged(previous, [blocked])


async def release(runtime: Runtime, kind: str, body: Mapping[str, Any]) -> None:
    """A deleted resource's entity stays in Redis (Retain, or a released finalizer): drop the
    declaration so apps may manage it again. Best effort: a later resource adopts it anyway."""
    try:
        entity = parse(kind, body)
        if entity.management_policy is not ManagementPolicy.MANAGED or entity.meta.paused:
            return
        cluster = await runtime.cluster(entity.cluster, entity.meta.namespace)
        registry = await runtime.registry(cluster)
        if isinstance(entity, SharedSubscription):
            await registry.remove_subscription(
                provisioning.subscription_key(entity), entity.meta.owner, delete=False
            )
        else:
            await registry.remove_queue(entity.address, entity.meta.owner, delete=False)
    except (InvalidSpec, ValueError, ClusterUnavailable, StoreUnavailable) as exc:
        logger.info('%s %s left declared in Redis: %s', kind, entity_name(body), exc)


def entity_name(body: Mapping[str, Any]) -> str:
    meta = body.get('metadata') or {}
    return f'{meta.get("namespace")}/{meta.get("name")}'


def limit_conditions(body: Mapping[str, Any], at_limit: bool) -> list[Any] | None:
    """The conditions with ``ConsumersAtLimit`` set, or None when it already says so (or the
    resource is paused: its conditions are left as the pause left them)."""
    entity = SharedSubscription.from_body(body)
    previous = (body.get('status') or {}).get('conditions') or []
    if entity.meta.paused:
        return None
    if any(c.get('type') == 'ConsumersAtLimit' and c.get('status') == str(at_limit)
           for c in previous):  # fmt: skip
        return None
    updated = conditions.make_condition(
        'ConsumersAtLimit', at_limit, reason='AtLimit' if at_limit else 'BelowLimit',
        message=f'maxConsumers is {entity.max_consumers}', generation=entity.meta.generation,
        previous=previous, now=now(),
    )  # fmt: skip
    return conditions.merged(previous, [updated])
