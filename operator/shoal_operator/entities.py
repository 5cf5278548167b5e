"""
Reconciling a Queue or SharedSubscription: declaring it in its cluster's Redis, and sampling its
live numbers for the status (with drift repair: declared again when it went missing).
"""

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store.declarations import EntityState, ProvisionConflict, Provisioned
from shoal_broker.store.registry import Registry
from shoal_operator import conditions, k8s, metrics, provisioning, status
from shoal_operator.models import (
    API_VERSION,
    InvalidSpec,
    ManagementPolicy,
    Queue,
    SharedSubscription,
    describe,
)
from shoal_operator.runtime import ClusterUnavailable, Runtime, now

Entity = Queue | SharedSubscription
logger = logging.getLogger(__name__)
AT_LIMIT = 'consumersAtLimit'
"""Key of a sample: whether a subscription is at its consumer limit (for the condition)."""


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
            state = await _state(entity, registry)
            provisioned = ('Observed', 'exists in Redis') if state.exists else None
            problem = None if state.exists else ('NotFound', 'not in Redis (ObserveOnly)')
            return _outcome(generation, previous, problem, provisioned, paused=False,
                            observe_only=True, extra=identity)  # fmt: skip
        if isinstance(entity, SharedSubscription):
            result = await registry.declare_subscription(
                provisioning.declaration(entity), recreate=entity.recreate_on_change
            )
        else:
            result = await registry.declare_queue(
                entity.address, entity.meta.owner, entity.policy,
                provisioning.on_deletion(entity),
            )  # fmt: skip
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


async def _state(entity: Entity, registry: Registry) -> EntityState:
    if isinstance(entity, SharedSubscription):
        return await registry.subscription_state(provisioning.subscription_key(entity))
    return await registry.queue_state(entity.address)


async def sample_all(
    runtime: Runtime, kind: str, bodies: Sequence[Mapping[str, Any]]
) -> list[tuple[Mapping[str, Any], dict[str, Any] | None]]:
    """Live numbers for the status of each resource (None when nothing can be sampled now), with
    drift repair (a declared entity missing from Redis is declared again). The cluster comes
    from the watch's inventory and its Redis URL from the once-per-pass read (``Runtime``), and
    the Redis reads of every resource on one Redis are batched (``Registry.states``)."""
    found: dict[int, EntityState] = {}
    targets: list[tuple[Mapping[str, Any], Entity, Registry] | None] = []
    batches: dict[int, tuple[Registry, list[int]]] = {}
    for i, body in enumerate(bodies):
        try:
            entity = parse(kind, body)
            cluster = await runtime.cluster(entity.cluster, entity.meta.namespace)
            registry = await runtime.registry(cluster)
        except (InvalidSpec, ValueError, ClusterUnavailable, StoreUnavailable, k8s.ApiError
                ) as exc:  # fmt: skip
            logger.debug('no sample of %s %s: %s', kind, describe(body), exc)
            targets.append(None)
            continue
        targets.append((body, entity, registry))
        batches.setdefault(id(registry), (registry, []))[1].append(i)
    for registry, members in batches.values():
        queues = [e.address for _, e, _ in _each(targets, members) if isinstance(e, Queue)]
        subs = [provisioning.subscription_key(e) for _, e, _ in _each(targets, members)
                if isinstance(e, SharedSubscription)]  # fmt: skip
        try:
            queue_states, sub_states = await registry.states(queues, subs)
        except StoreUnavailable as exc:
            logger.debug('no sample from a Redis: %s', exc)
            continue
        for i in members:
            entity = targets[i][1]  # type: ignore[index]  # members are parsed
            if isinstance(entity, SharedSubscription):
                found[i] = sub_states[provisioning.subscription_key(entity).id]
            else:
                found[i] = queue_states[entity.address]
    samples: list[tuple[Mapping[str, Any], dict[str, Any] | None]] = []
    for i, body in enumerate(bodies):
        target = targets[i]
        if target is None or i not in found:
            samples.append((body, None))
            continue
        samples.append((body, await _live(runtime, kind, body, *target[1:], found[i])))
    return samples


def _each(
    targets: Sequence[tuple[Mapping[str, Any], Entity, Registry] | None], members: Sequence[int]
) -> list[tuple[Mapping[str, Any], Entity, Registry]]:
    return [t for t in (targets[i] for i in members) if t is not None]


async def _live(
    runtime: Runtime,
    kind: str,
    body: Mapping[str, Any],
    entity: Entity,
    registry: Registry,
    state: EntityState,
) -> dict[str, Any] | None:
    try:
        managed = entity.management_policy is ManagementPolicy.MANAGED and not entity.meta.paused
        provisioned = conditions.is_true((body.get('status') or {}).get('conditions') or [],
                                         'Provisioned')  # fmt: skip
        drifted = state.policy != entity.policy  # e.g. a policy removed from Redis by hand
        if managed and provisioned and (not state.exists or not state.owner or drifted):
            # removed, released or changed behind our back: declared again, unless the resource
            # is being deleted (its deletion policy decides) or gone since this pass began
            if not await _repair(runtime, kind, body):
                return None
            state = await _state(entity, registry)
    except (StoreUnavailable, ProvisionConflict, k8s.ApiError) as exc:
        logger.debug('no sample of %s %s: %s', kind, describe(body), exc)
        return None
    if isinstance(entity, SharedSubscription):
        live = status.subscription_live(entity, state, now())
        limit = status.at_limit(entity, state)
        if limit is not None:
            live[AT_LIMIT] = limit
        return live
    return status.queue_live(entity, state, now())


async def _repair(runtime: Runtime, kind: str, body: Mapping[str, Any]) -> bool:
    """Declare the entity again from a fresh read of its resource, under the lock its deletion
    takes (``Runtime.entity_lock``); False when the resource is gone or being deleted."""
    meta = body.get('metadata') or {}
    namespace, name = str(meta.get('namespace')), str(meta.get('name'))
    async with runtime.entity_lock((kind, namespace, name)):
        fresh = await runtime.api().get(API_VERSION, kind, namespace, name)
        if fresh is None or (fresh.get('metadata') or {}).get('deletionTimestamp'):
            return False
        await provision(runtime, kind, fresh)
    return True


def limit_conditions(body: Mapping[str, Any], at_limit: bool) -> list[Any] | None:
    """The conditions with ``ConsumersAtLimit`` set, or None when it already says so, when the
    resource is paused (its conditions are left as the pause left them), or when kopf's handler
    has yet to write the conditions for what ``body`` says (``_handled``)."""
    entity = SharedSubscription.from_body(body)
    previous = (body.get('status') or {}).get('conditions') or []
    if entity.meta.paused or not _handled(body, entity.meta.paused):
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


def _handled(body: Mapping[str, Any], paused: bool) -> bool:
    """Whether the conditions in ``body`` are the handler's answer to its spec and pause.

    The conditions list is replaced whole by a merge patch, so a list read before the handler's
    patch and written after it would undo the handler's write (a resume left saying
    ``ReconcilePaused``, with no later handler run to mend it). A spec change shows as a
    generation the status has not observed; a pause or resume, which moves no generation, as a
    ``ReconcilePaused`` condition that disagrees with the annotation."""
    meta = body.get('metadata') or {}
    found = body.get('status') or {}
    if found.get('observedGeneration') != meta.get('generation', found.get('observedGeneration')):
        return False
    for condition in found.get('conditions') or []:
        if condition.get('type') == 'ReconcilePaused':
            return bool(condition.get('status') == str(paused))
    return False
