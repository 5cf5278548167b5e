"""
What a declaration of a queue or shared subscription is, and what the registry answers about one:
the types the operator's pure core, the CLI and the registry (``registry.py``) share.

This module imports no redis, so the operator's status and provisioning logic depend on these
types without depending on a Redis client (the import-linter contract "The operator's pure core
does no I/O").
"""

import dataclasses
import enum

from shoal_broker.errors import BrokerError
from shoal_broker.routing.jms_subscriptions import SubscriptionKey
from shoal_broker.routing.policies import NO_POLICY, EntityPolicy


class ProvisionConflict(BrokerError):
    """Redis holds something the declaration may not replace (the detail says what)."""

    condition = 'amqp:resource-locked'


class Provisioned(enum.StrEnum):
    CREATED = 'created'
    ADOPTED = 'adopted'
    """It existed (created by an app, or left behind by a retained resource) and is now declared."""
    UPDATED = 'updated'
    UNCHANGED = 'unchanged'
    RECREATED = 'recreated'
    """The topic or selector changed: the old backlog was dropped."""


class Removal(enum.StrEnum):
    DELETED = 'deleted'
    RELEASED = 'released'
    """Left in Redis, no longer declared."""
    MISSING = 'missing'
    FOREIGN = 'foreign'
    """Declared by another resource: left alone."""
    IN_USE = 'in-use'
    """Consumers are attached (or, when asked to delete only if empty, messages are waiting)."""


class OnDeletion(enum.StrEnum):
    """What the declaring resource's ``deletionPolicy`` asks for when it is deleted."""

    RETAIN = 'Retain'
    DELETE = 'Delete'
    DELETE_IF_EMPTY = 'DeleteIfEmpty'


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionDeclaration:
    """A SharedSubscription as the broker keeps it."""

    key: SubscriptionKey
    topic: str
    selector: str | None
    max_consumers: int | None
    owner: str
    """``<namespace>/<name>`` of the declaring resource."""
    generation: int
    policy: EntityPolicy = NO_POLICY
    """Its ``delivery{}`` and ``retention{}``; the broker-wide settings where unset."""
    on_deletion: OnDeletion = OnDeletion.RETAIN


@dataclasses.dataclass(frozen=True, slots=True)
class EntityState:
    """What Redis holds for a declared queue or subscription right now."""

    exists: bool
    owner: str = ''
    definition: dict[str, str] = dataclasses.field(default_factory=dict)
    consumers: int = 0
    consumer_replicas: int = 0
    """Broker replicas serving at least one of the consumers."""
    consumers_per_replica: dict[str, int] = dataclasses.field(default_factory=dict)
    delivered: dict[str, int] = dataclasses.field(default_factory=dict)
    """Messages each replica delivered (``AddressKeys.delivered``)."""
    backlog: int = 0
    ready: int = 0
    in_flight: int = 0
    oldest_age_seconds: float | None = None
    """Age of the oldest message not yet consumed; None when there is none."""
    policy: EntityPolicy = NO_POLICY
    """The delivery and retention policy Redis holds for it (empty: none)."""
    line: tuple[str, ...] = ()
    """An exclusive entity's consumers in line, the active one first (``Inspector.lines``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RedisInfo:
    latency_ms: float
    server_version: str
