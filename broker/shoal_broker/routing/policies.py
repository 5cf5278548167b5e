"""
Delivery and retention policy of one declared queue or subscription (Queue/SharedSubscription
``delivery{}`` and ``retention{}``).

The operator writes a policy next to the provisioned definition; every replica reads all of them
periodically and hands each ``LocalSubscription`` its own, so the per-message path reads plain
attributes and never looks a policy up. Unset fields fall back to the broker-wide settings
(SHOAL_MAX_DELIVERY_ATTEMPTS, SHOAL_DEAD_LETTER_ADDRESS, SHOAL_MAX_BACKLOG_PER_ADDRESS).
"""

import dataclasses
import json

from shoal_broker.routing.storage import DuplicateWindow
from shoal_broker.settings import DuplicateSettings, Overflow

QUEUE_GROUP = 'queue'
"""The group of a queue (the same constant as ``storage.QUEUE_GROUP``, kept here so this leaf
module depends on nothing but settings)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EntityPolicy:
    max_delivery_attempts: int | None = None
    dead_letter_address: str | None = None
    max_age_seconds: int | None = None
    """Entries older than this (by their stream id's enqueue time) expire at dispatch."""
    max_messages: int | None = None
    """Queues only: the address's backlog limit, overriding SHOAL_MAX_BACKLOG_PER_ADDRESS."""
    overflow: Overflow = Overflow.REJECT_PUBLISH
    # duplicate detection (``duplicateDetection{}``): of the queue, or of a subscription's topic
    duplicate_detection: bool | None = None
    """On or off for the address; None: the broker-wide SHOAL_DUPLICATE_DETECTION."""
    duplicate_window: int | None = None
    duplicate_window_seconds: int | None = None
    duplicate_id_property: str | None = None
    topic: str | None = None
    """A subscription's topic, filed with its duplicate detection (whose address it is)."""
    # redelivery delay with backoff (``routing/redelivery.py``); None: the broker-wide setting
    redelivery_delay_ms: int | None = None
    redelivery_multiplier: float | None = None
    max_redelivery_delay_ms: int | None = None
    # last-value queue (``lastValue{}``): queues only
    last_value: bool | None = None
    """On or off for the queue; None: the broker-wide SHOAL_LAST_VALUE_ADDRESSES."""
    last_value_property: str | None = None
    """Application property holding the key; None: SHOAL_LAST_VALUE_PROPERTY."""
    exclusive: bool | None = None
    """A single active consumer (``routing/exclusive.py``); None: SHOAL_EXCLUSIVE_ADDRESSES."""
    group_rebalance: bool | None = None
    """Message groups (``amqp/groups.py``): a consumer joining takes its share of the groups not
    in flight; None or False: a new consumer takes new groups only."""

    def duplicates(self, defaults: DuplicateSettings) -> DuplicateWindow | None:
        """The window this policy sets (unset fields from ``defaults``); None when off."""
        if not self.duplicate_detection:
            return None
        return DuplicateWindow(
            self.duplicate_window or defaults.window,
            self.duplicate_window_seconds or defaults.window_seconds,
            defaults.id_property
            if self.duplicate_id_property is None
            else self.duplicate_id_property,
        )

    @property
    def empty(self) -> bool:
        return self == EntityPolicy()

    def to_json(self) -> str:
        fields = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> 'EntityPolicy':
        """ValueError when the text is not a policy."""
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise TypeError(type(fields).__name__)
            policy = cls(**fields)
            return dataclasses.replace(policy, overflow=Overflow(policy.overflow))
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f'not a policy: {text!r} ({exc})') from exc


def declared_duplicates(
    policies: dict[str, EntityPolicy], defaults: DuplicateSettings
) -> dict[str, DuplicateWindow | None]:
    """Address -> the duplicate detection its declarations set (None: off), for the addresses
    whose queue or subscriptions set one. A topic whose subscriptions disagree has it on if any
    of them does, with the largest window and the first id property."""
    found: dict[str, DuplicateWindow | None] = {}
    for entity, policy in sorted(policies.items()):
        if policy.duplicate_detection is None:
            continue
        address = entity.removeprefix('queue:') if entity.startswith('queue:') else policy.topic
        if address is None:
            continue
        window, known = policy.duplicates(defaults), found.get(address)
        if known is not None and window is not None:
            window = DuplicateWindow(
                max(known.count, window.count), max(known.seconds, window.seconds),
                known.id_property,
            )  # fmt: skip
        found[address] = window or known
    return found


def declared_last_values(
    policies: dict[str, EntityPolicy], default_property: str
) -> dict[str, str | None]:
    """Queue address -> the key property its declaration sets for a last-value queue (None:
    off), for the queues whose declaration says either."""
    return {
        entity.removeprefix('queue:'): (policy.last_value_property or default_property)
        if policy.last_value
        else None
        for entity, policy in policies.items()
        if entity.startswith('queue:') and policy.last_value is not None
    }


def entity_field(address: str, group: str) -> str:
    """The entity a queue's or subscription's policy is filed under: ``queue:<address>`` or
    ``subscription:<id>`` (the same names as the provisioned-definition index)."""
    return f'queue:{address}' if group == QUEUE_GROUP else f'subscription:{group}'


NO_POLICY = EntityPolicy()
"""Nothing declared: the broker-wide settings apply."""
