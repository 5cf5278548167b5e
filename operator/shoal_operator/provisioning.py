"""
What a Queue or SharedSubscription means in Redis, and what deleting one should do.

Pure: models in, the broker's own vocabulary out (``SubscriptionKey``,
``SubscriptionDeclaration`` from ``shoal_broker``), so the operator and the broker agree on ids
and link names by construction. Selectors are checked with the broker's own parser, so a selector
the operator accepts is one every replica accepts.
"""

import dataclasses
import datetime
import enum

from shoal_broker import selector as selectors
from shoal_broker.errors import BrokerError
from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.store.declarations import OnDeletion, SubscriptionDeclaration
from shoal_operator.models import DeletionPolicy, InvalidSpec, Queue, SharedSubscription


def subscription_key(sub: SharedSubscription) -> SubscriptionKey:
    return SubscriptionKey(
        name=sub.subscription_name,
        scope=Scope.CLIENT if sub.client_id else Scope.GLOBAL,
        client_id=sub.client_id or '',
        durable=sub.durable,
    )


def key_of(subscription_id: str) -> SubscriptionKey | None:
    """The key whose ``id`` is ``subscription_id``; None when it does not parse back exactly
    (a ClientID with a colon is ambiguous)."""
    lifetime, _, rest = subscription_id.partition(':')
    scope, _, rest = rest.partition(':')
    owner, _, name = rest.partition(':')
    if lifetime not in ('durable', 'volatile') or scope not in tuple(Scope):
        return None
    key = SubscriptionKey(name=name, scope=Scope(scope), durable=lifetime == 'durable',
                          client_id='' if scope == Scope.GLOBAL else owner)  # fmt: skip
    return key if key.id == subscription_id else None


def check_selector(sub: SharedSubscription) -> None:
    """Raise ``InvalidSpec`` with the parser's message for a selector the broker would refuse."""
    if sub.selector is None:
        return
    try:
        selectors.compile(sub.selector)
    except BrokerError as exc:
        raise InvalidSpec(f'invalid selector: {exc}') from exc


def declaration(sub: SharedSubscription) -> SubscriptionDeclaration:
    check_selector(sub)
    return SubscriptionDeclaration(
        key=subscription_key(sub),
        topic=sub.topic,
        selector=sub.selector,
        max_consumers=sub.max_consumers,
        owner=sub.meta.owner,
        generation=sub.meta.generation,
        policy=sub.policy,
        on_deletion=on_deletion(sub),
    )


def on_deletion(entity: Queue | SharedSubscription) -> OnDeletion:
    """The deletion policy filed with the declaration, for a deletion no running operator sees:
    ``shoal.dev/force-delete`` leaves Redis alone, as it does for a live deletion."""
    if entity.meta.force_delete:
        return OnDeletion.RETAIN
    return OnDeletion(entity.deletion_policy.value)


class Release(enum.StrEnum):
    """Why the finalizer goes without touching Redis."""

    FORCED = 'ForceDeleted'
    CLUSTER_GONE = 'ClusterGone'
    REDIS_TIMEOUT = 'RedisUnreachable'
    PAUSED = 'ReconcilePaused'


@dataclasses.dataclass(frozen=True, slots=True)
class DeletionContext:
    policy: DeletionPolicy
    force: bool
    paused: bool
    cluster_present: bool
    """The BrokerCluster exists and is not being deleted."""
    unreachable_since: datetime.datetime | None
    """When Redis was first found unreachable during this deletion; None while it answers."""
    timeout_seconds: int


def escape_hatch(context: DeletionContext, now: datetime.datetime) -> Release | None:
    """Whether the finalizer should be released without acting on Redis (never wedge a
    namespace): forced, paused, the cluster is gone, or Redis has been unreachable too long."""
    if context.force:
        return Release.FORCED
    if context.paused:
        return Release.PAUSED
    if not context.cluster_present:
        return Release.CLUSTER_GONE
    if context.unreachable_since is not None:
        waited = (now - context.unreachable_since).total_seconds()
        if waited >= context.timeout_seconds:
            return Release.REDIS_TIMEOUT
    return None
