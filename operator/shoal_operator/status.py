"""
Status of each resource kind, computed from what was observed.

Pure: the observations (the registry's ``EntityState``, the Deployment, Redis' answer) and the
previous status come in, the whole new status goes out; the clock is a parameter. ``worth_writing``
is the throttle: live numbers are rewritten only when they moved enough (exact figures are in
Prometheus), so sampling does not churn etcd.
"""

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from shoal_broker.store.declarations import EntityState, RedisInfo
from shoal_operator import conditions
from shoal_operator.conditions import Condition
from shoal_operator.models import BrokerCluster, ManagementPolicy, Queue, SharedSubscription

BACKLOG_CHANGE = 0.1
"""Relative backlog change that is worth a status write (besides any crossing of zero)."""
AGE_SCALE = (0, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400, 172800, 604800)
"""The steps ``backlog.oldestMessageAgeSeconds`` is written on (0 s, 10 s, 30 s, 1 min, 2 min,
5 min, 10 min, 30 min, 1 h, 2 h, 6 h, 12 h, 1 d, 2 d, 1 week, then whole weeks): the status
says "at least this old", and a message that waits a day moves it 12 times, not once a minute
(the exact age is the broker's ``shoal_oldest_message_age_seconds`` metric)."""


def entity_conditions(
    *,
    generation: int,
    previous: Sequence[Any],
    now: datetime.datetime,
    problem: tuple[str, str] | None,
    provisioned: tuple[str, str] | None,
    paused: bool,
    observe_only: bool,
    at_limit: bool | None = None,
) -> list[Condition]:
    """Conditions of a Queue or SharedSubscription.

    ``problem`` (reason, message) is what keeps it from being usable (cluster missing, Redis down,
    invalid spec, conflict); ``provisioned`` (reason, message) describes the write that was done.
    """

    def make(type_: str, ok: bool | None, reason: str, message: str = '') -> Condition:
        return conditions.make_condition(
            type_, ok, reason=reason, message=message, generation=generation,
            previous=previous, now=now,
        )  # fmt: skip

    cluster_problem = problem is not None and problem[0] in (
        'ClusterNotFound',
        'RedisUnavailable',
        'NamespaceNotAllowed',
    )
    updates = [
        make('ClusterAvailable', not cluster_problem, problem[0] if cluster_problem and problem
             else 'ClusterReachable', problem[1] if cluster_problem and problem else ''),
        make('ReconcilePaused', paused, 'PauseAnnotation' if paused else 'NotPaused'),
    ]  # fmt: skip
    if provisioned is not None:
        updates.append(make('Provisioned', True, *provisioned))
    elif problem is not None and not cluster_problem:
        updates.append(make('Provisioned', False, *problem))
    if at_limit is not None:
        updates.append(make('ConsumersAtLimit', at_limit, 'AtLimit' if at_limit else 'BelowLimit'))
    blockers = [problem] if problem is not None else []
    merged = conditions.merged(previous, updates)
    ok_reason = 'Observed' if observe_only else 'Provisioned'
    if paused:
        ok_reason = 'ReconcilePaused'
    summary = conditions.ready(
        blockers, generation=generation, previous=previous, now=now, ok_reason=ok_reason
    )
    return conditions.merged(merged, [summary])


def subscription_live(sub: SharedSubscription, state: EntityState, now: datetime.datetime
                      ) -> dict[str, Any]:  # fmt: skip
    """The live part of a SharedSubscription's status."""
    consumers: dict[str, Any] = {'active': state.consumers, 'replicas': state.consumer_replicas}
    if sub.max_consumers is not None:
        consumers['max'] = sub.max_consumers
    if state.consumers_per_replica or state.delivered:
        consumers['perReplica'] = per_replica(state)
    return {
        'consumers': consumers,
        'backlog': _backlog(state, now),
        **_exclusive(state),
    }


def per_replica(state: EntityState) -> list[dict[str, Any]]:
    """Each replica's consumers and share of the deliveries, so a replica whose consumers get
    nothing shows."""
    total = sum(state.delivered.values())
    replicas = sorted(set(state.consumers_per_replica) | set(state.delivered))
    return [
        {
            'replica': replica,
            'consumers': state.consumers_per_replica.get(replica, 0),
            'delivered': state.delivered.get(replica, 0),
            'deliveredShare': round(state.delivered.get(replica, 0) / total, 3) if total else 0.0,
        }
        for replica in replicas
    ]


def queue_live(queue: Queue, state: EntityState, now: datetime.datetime) -> dict[str, Any]:
    backlog = _backlog(state, now)
    backlog.update(ready=state.ready, inFlight=state.in_flight)
    return {'address': queue.address, 'backlog': backlog, **_exclusive(state)}


def _exclusive(state: EntityState) -> dict[str, Any]:
    """An exclusive entity's consumer receiving and those standing by, next in line first; a
    declared exclusive one with no consumer clears them (``None`` removes a field on a merge
    patch)."""
    if state.line:
        return {'exclusive': {'active': state.line[0], 'standby': list(state.line[1:])}}
    return {'exclusive': {'active': None, 'standby': []}} if state.policy.exclusive else {}


def _backlog(state: EntityState, now: datetime.datetime) -> dict[str, Any]:
    backlog: dict[str, Any] = {'messages': state.backlog, 'sampledAt': conditions.timestamp(now)}
    if state.oldest_age_seconds is not None:
        backlog['oldestMessageAgeSeconds'] = coarse_age(state.oldest_age_seconds)
    return backlog


def coarse_age(seconds: float) -> int:
    """``seconds`` rounded down to its step of ``AGE_SCALE``."""
    week = AGE_SCALE[-1]
    if seconds >= week:
        return int(seconds // week) * week
    return max(step for step in AGE_SCALE if step <= max(seconds, 0))


def at_limit(sub: SharedSubscription, state: EntityState) -> bool | None:
    if sub.max_consumers is None or sub.management_policy is ManagementPolicy.OBSERVE_ONLY:
        return None
    return state.consumers >= sub.max_consumers


def worth_writing(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a sampled status differs enough from the stored one to be written."""
    for section in ('consumers', 'address', 'linkName', 'brokerId', 'exclusive'):
        if section in new and old.get(section) != new[section]:
            return True
    if any(key in old and key not in new for key in LIVE_OPTIONAL):
        return True
    before, after = old.get('backlog') or {}, new.get('backlog') or {}
    was, now = int(before.get('messages', -1)), int(after.get('messages', 0))
    if (was == 0) != (now == 0) or was < 0:
        return True
    if abs(now - was) > BACKLOG_CHANGE * max(was, 1):
        return True
    old_age = before.get('oldestMessageAgeSeconds')
    new_age = after.get('oldestMessageAgeSeconds')
    if (old_age is None) != (new_age is None):
        return True
    return old_age is not None and new_age is not None and float(old_age) != float(new_age)


LIVE_SECTIONS = ('consumers', 'backlog')
"""The sampled sections of a Queue's or SharedSubscription's status, whose keys come and go
(``backlog.oldestMessageAgeSeconds`` with the backlog, ``consumers.max`` with the limit)."""


LIVE_OPTIONAL = ('exclusive',)
"""Sampled keys of a Queue's or SharedSubscription's status that come and go whole: the line of
an entity exclusive by the brokers' ``SHOAL_EXCLUSIVE_ADDRESSES`` alone is shown while it has
consumers, and removed once they are gone."""


CLUSTER_SECTIONS = ('redis',)
"""The BrokerCluster's status section whose keys come and go (``latencyMs`` and
``serverVersion`` only while Redis answers)."""

CLUSTER_OPTIONAL = ('subscriptions',)
"""The BrokerCluster's status keys written only while known (the declared count needs Redis)."""


def as_patch(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    sections: Sequence[str] = LIVE_SECTIONS,
    optional: Sequence[str] = (),
) -> dict[str, Any]:
    """The merge patch that makes the stored status ``old`` say ``new``: a merge patch never
    removes a key it leaves out, so a key of one of ``sections``, or an ``optional`` key, that
    ``old`` has and ``new`` no longer has is given as null (which removes it); nothing else
    changes (other writers' keys are left alone)."""
    patch = dict(new)
    for key in optional:
        if key in old and key not in new:
            patch[key] = None
    for section in sections:
        before, after = old.get(section), new.get(section)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            gone = {key: None for key in before if key not in after}
            if gone:
                patch[section] = {**after, **gone}
    return patch


def cluster_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``as_patch`` for a BrokerCluster's status."""
    return as_patch(old, new, CLUSTER_SECTIONS, CLUSTER_OPTIONAL)


def cluster_status(
    cluster: BrokerCluster,
    *,
    deployment: Mapping[str, Any] | None,
    redis: RedisInfo | None,
    redis_error: str,
    declared_subscriptions: int | None,
    previous: Sequence[Any],
    now: datetime.datetime,
    secret_problems: Sequence[tuple[str, str]] = (),
    kinds_not_served: Sequence[str] = (),
) -> dict[str, Any]:
    """A BrokerCluster's status from its Deployment, a Redis probe, what is wrong with the
    Secrets its pods mount (``security.secret_problems``) and the optional children left out
    because the API server does not serve their kind (they do not make it unready)."""
    observed = (deployment or {}).get('status') or {}
    replicas = int(observed.get('replicas') or 0)
    ready_replicas = int(observed.get('readyReplicas') or 0)
    updated = int(observed.get('updatedReplicas') or 0)
    generation = cluster.meta.generation

    def make(type_: str, ok: bool | None, reason: str, message: str = '') -> Condition:
        return conditions.make_condition(
            type_, ok, reason=reason, message=message, generation=generation,
            previous=previous, now=now,
        )  # fmt: skip

    connected = redis is not None
    available = connected and ready_replicas > 0
    # a Deployment whose controller has not seen its latest template yet (a settings change just
    # applied) still reports the old rollout's counts: it is progressing all the same
    behind = int(observed.get('observedGeneration') or 0) < int(
        ((deployment or {}).get('metadata') or {}).get('generation') or 0
    )
    progressing = deployment is not None and (
        behind or updated < cluster.replicas or ready_replicas < cluster.replicas
    )
    blockers: list[tuple[str, str]] = []
    if not connected:
        blockers.append(('RedisUnavailable', redis_error or 'Redis did not answer'))
    blockers.extend(secret_problems)
    if cluster.replicas > 0 and ready_replicas == 0:
        blockers.append(('NoReplicaReady', f'0 of {cluster.replicas} broker replicas are ready'))
    updates = [
        make('RedisConnected', connected, 'Pong' if connected else 'RedisUnavailable',
             '' if connected else redis_error),
        make('Available', available, 'ReplicasReady' if available else 'Unavailable',
             f'{ready_replicas} of {cluster.replicas} replicas ready'),
        make('Progressing', progressing, 'RollingOut' if progressing else 'Stable',
             f'{updated} of {cluster.replicas} replicas run the current pod template'),
        make('SecretsFound', not secret_problems,
             secret_problems[0][0] if secret_problems else 'Found',
             '; '.join(message for _, message in secret_problems)),
        make('ReconcilePaused', cluster.meta.paused,
             'PauseAnnotation' if cluster.meta.paused else 'NotPaused'),
        make('ChildrenApplied', not kinds_not_served,
             'KindNotServed' if kinds_not_served else 'Applied', '; '.join(kinds_not_served)),
    ]  # fmt: skip
    summary = conditions.ready(
        blockers, generation=generation, previous=previous, now=now, ok_reason='Available',
        ok_message=f'{ready_replicas} of {cluster.replicas} replicas ready',
    )  # fmt: skip
    status: dict[str, Any] = {
        'observedGeneration': generation,
        'replicas': replicas,
        'readyReplicas': ready_replicas,
        'conditions': conditions.merged(conditions.merged(previous, updates), [summary]),
        'redis': {'connected': connected},
    }
    if redis is not None:
        status['redis'].update(latencyMs=redis.latency_ms, serverVersion=redis.server_version)
    if declared_subscriptions is not None:
        status['subscriptions'] = {'declared': declared_subscriptions}
    return status
