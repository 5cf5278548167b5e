"""
Deleting a Queue or SharedSubscription: acting on its deletion policy, the escape hatches that
release the finalizer without touching Redis, and releasing what a deleted resource left behind.

A finalizer is put only where the operator's permissions outlive the resource
(``Settings.permissions_outlive``): with namespaced RBAC the Role granting them is deleted with
the namespace, possibly before the operator could remove the finalizer, and the namespace would
wait forever. Without one, the policy is carried out when the deletion is seen (``on_deleted``),
with the Redis the operator last reached the cluster through, and what has to wait (consumers
attached, Redis down) is retried every observer pass (``retry_pending``): nothing the operator
does can hold a deletion. What an earlier run could not finish is found on the Redis side
(``settle_orphans``): a declaration whose resource no longer exists is deleted, deleted once
empty or released, as the deletion policy filed with it in Redis says.
"""

import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Any

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store.declarations import OnDeletion, Removal
from shoal_broker.store.registry import Registry
from shoal_operator import conditions, k8s, metrics, provisioning
from shoal_operator.entities import parse
from shoal_operator.models import (
    API_VERSION,
    BrokerCluster,
    DeletionPolicy,
    InvalidSpec,
    ManagementPolicy,
    Queue,
    SharedSubscription,
    describe,
)
from shoal_operator.runtime import ClusterUnavailable, Key, Runtime, Settings, now

logger = logging.getLogger(__name__)


def acts_on_redis(spec: Mapping[str, Any]) -> bool:
    """Whether deleting the resource removes something from Redis."""
    policy = str(spec.get('deletionPolicy', DeletionPolicy.RETAIN.value))
    managed = spec.get('managementPolicy', ManagementPolicy.MANAGED.value) == 'Managed'
    return bool(managed and policy != DeletionPolicy.RETAIN.value)


def needs_finalizer(spec: Mapping[str, Any], namespace: str, settings: Settings) -> bool:
    """Only deletion that acts on Redis holds the resource (kopf adds/removes the finalizer),
    and only where the operator's permissions outlive it."""
    return acts_on_redis(spec) and settings.permissions_outlive(namespace)


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
    """Act on the deletion policy; returns the result and since when the deletion has been
    held up by something only time resolves (Redis unreachable, or consumers still attached to
    a cluster that is being deleted)."""
    meta = body.get('metadata') or {}
    async with runtime.entity_lock((kind, str(meta.get('namespace')), str(meta.get('name')))):
        return await _remove(runtime, kind, body, unreachable_since)


async def _remove(
    runtime: Runtime,
    kind: str,
    body: Mapping[str, Any],
    unreachable_since: datetime.datetime | None,
) -> tuple[DeletionResult, datetime.datetime | None]:
    entity = parse(kind, body)
    cluster, registry = await _cluster(runtime, entity)
    context = provisioning.DeletionContext(
        policy=entity.deletion_policy,
        force=entity.meta.force_delete,
        paused=entity.meta.paused,
        cluster_present=cluster is not None,
        unreachable_since=unreachable_since,
        timeout_seconds=cluster.finalizer_timeout_seconds if cluster else 0,
    )
    hatch = provisioning.escape_hatch(context, now())
    if hatch is provisioning.Release.REDIS_TIMEOUT and registry is not None:
        hatch = provisioning.Release.CLUSTER_GONE  # its consumers did not leave in time
    if hatch is not None or cluster is None:
        release = hatch or provisioning.Release.CLUSTER_GONE
        metrics.FINALIZERS_RELEASED.labels(release.value).inc()
        return DeletionResult(True, f'left in Redis: {release.value}', released=release), None
    only_if_empty = entity.deletion_policy is DeletionPolicy.DELETE_IF_EMPTY
    try:
        if registry is None:
            registry = await _redis(runtime, cluster, entity)
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
        # while its cluster is being deleted the wait is bounded like an unreachable Redis
        since = (unreachable_since or now()) if registry is not None else None
        return DeletionResult(
            False, why, blocked=('NotEmpty' if only_if_empty else 'ConsumersAttached', why)
        ), since
    return DeletionResult(True, f'{removal.value} in Redis'), None


async def _cluster(
    runtime: Runtime, entity: Queue | SharedSubscription
) -> tuple[BrokerCluster | None, Registry | None]:
    """The entity's cluster; for one that is gone or being deleted, the cluster and Redis this
    run last saw (``kubectl delete -f`` of a whole app deletes the cluster and maybe the Secret
    naming Redis first), with that Redis; (None, None) when there is nothing to act on."""
    try:
        return await runtime.cluster(entity.cluster, entity.meta.namespace), None
    except ClusterUnavailable as exc:
        if exc.reason != 'ClusterNotFound':
            return None, None
    except k8s.ApiError:  # e.g. 403: the namespace's Role is gone with the namespace
        pass
    try:
        return runtime.remembered(entity.cluster) or (None, None)
    except ClusterUnavailable:
        return None, None


async def _redis(runtime: Runtime, cluster: BrokerCluster, entity: Queue | SharedSubscription
                 ) -> Registry:  # fmt: skip
    """The cluster's Redis. When the Secret naming it can no longer be read (deleted before the
    resources, or with their namespace, in whatever order the namespace controller picks), the
    Redis this run last reached the cluster through: the policy is carried out the same in
    every order, and the finalizer is not released for want of a Secret."""
    try:
        return await runtime.registry(cluster)
    except (k8s.ApiError, ClusterUnavailable):
        remembered = runtime.remembered(entity.cluster)
        if remembered is None:
            raise
        return remembered[1]


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
        cluster, registry = await _cluster(runtime, entity)
        if cluster is None:
            raise ClusterUnavailable('ClusterNotFound', 'its BrokerCluster does not exist')
        registry = registry or await _redis(runtime, cluster, entity)
        if isinstance(entity, SharedSubscription):
            await registry.remove_subscription(
                provisioning.subscription_key(entity), entity.meta.owner, delete=False
            )
        else:
            await registry.remove_queue(entity.address, entity.meta.owner, delete=False)
    except (InvalidSpec, ValueError, ClusterUnavailable, StoreUnavailable, k8s.ApiError) as exc:
        logger.info('%s %s left declared in Redis: %s', kind, describe(body), exc)


async def on_deleted(runtime: Runtime, kind: str, body: Mapping[str, Any]) -> None:
    """A resource is gone: release its declaration (Retain, or a finalizer already done), or,
    when it had no finalizer to wait on, carry out its deletion policy now or later."""
    meta = body.get('metadata') or {}
    spec = body.get('spec') or {}
    namespace = str(meta.get('namespace'))
    if not acts_on_redis(spec) or needs_finalizer(spec, namespace, runtime.settings):
        await release(runtime, kind, body)
        return
    await _carry_out(runtime, (kind, namespace, str(meta.get('name'))), dict(body), None)


async def retry_pending(runtime: Runtime) -> None:
    """One more try for each deletion policy still to carry out (from the observer's pass)."""
    for key, (body, since) in list(runtime.pending_deletions.items()):
        await _carry_out(runtime, key, body, since)


async def _carry_out(
    runtime: Runtime, key: Key, body: dict[str, Any], since: datetime.datetime | None
) -> None:
    kind = key[0]
    try:
        result, since = await remove(runtime, kind, body, since)
    except (InvalidSpec, ValueError, k8s.ApiError) as exc:
        logger.info('%s %s left in Redis: %s', kind, describe(body), exc)
        runtime.pending_deletions.pop(key, None)
        return
    if result.done:
        runtime.pending_deletions.pop(key, None)
        logger.info('%s %s deleted: %s', kind, describe(body), result.message)
        if result.released is not None:
            await release(runtime, kind, body)
        return
    if key not in runtime.pending_deletions:
        logger.info('%s %s is removed from Redis once it can be: %s', kind, describe(body),
                    result.message)  # fmt: skip
    runtime.pending_deletions[key] = (body, since)


async def settle_orphans(runtime: Runtime) -> None:
    """Carry out the deletion policy of every declaration, in each Redis this run reached, whose
    resource is in a watched namespace and no longer exists (deleted without a finalizer while
    no operator could act on it, or still waiting when the operator stopped). The policy is the
    one filed with the declaration (``Registry.on_deletion``), so the entity is deleted, deleted
    once empty or released exactly as deleting the live resource would; what has to wait
    (consumers attached, messages waiting) stays declared for the next pass. A GET confirms the
    resource is gone before anything is removed."""
    for registry in runtime.reached():
        try:
            declared = await registry.declared()
            policies = await registry.on_deletion()
        except StoreUnavailable:
            continue
        for field, owner in sorted(declared.items()):
            namespace, _, name = owner.partition('/')
            kind = 'Queue' if field.startswith('queue:') else 'SharedSubscription'
            key = (kind, namespace, name)
            if (not name or not runtime.watches(namespace) or key in runtime.inventory
                    or key in runtime.pending_deletions):  # fmt: skip
                continue
            policy = policies.get(field, OnDeletion.RETAIN)
            try:
                if await runtime.api().get(API_VERSION, kind, namespace, name) is not None:
                    continue
                removal = await _remove_field(registry, field, owner, policy)
            except (k8s.ApiError, StoreUnavailable) as exc:
                logger.debug('orphan %s of %s left: %s', field, owner, exc)
                continue
            if removal is Removal.IN_USE:
                logger.debug('orphan %s of %s waits (%s): in use', field, owner, policy.value)
                continue
            logger.info('%s %s (%s): %s %s no longer exists', field, removal.value,
                        policy.value, kind, owner)  # fmt: skip


async def _remove_field(registry: Registry, field: str, owner: str, policy: OnDeletion) -> Removal:
    delete = policy is not OnDeletion.RETAIN
    only_if_empty = policy is OnDeletion.DELETE_IF_EMPTY
    entity_kind, _, ident = field.partition(':')
    if entity_kind == 'queue':
        return await registry.remove_queue(ident, owner, delete=delete, only_if_empty=only_if_empty)
    key = provisioning.key_of(ident)
    if key is None:
        return Removal.MISSING
    return await registry.remove_subscription(
        key, owner, delete=delete, only_if_empty=only_if_empty
    )
