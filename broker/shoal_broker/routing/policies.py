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

from shoal_broker.settings import Overflow

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


def entity_field(address: str, group: str) -> str:
    """The entity a queue's or subscription's policy is filed under: ``queue:<address>`` or
    ``subscription:<id>`` (the same names as the provisioned-definition index)."""
    return f'queue:{address}' if group == QUEUE_GROUP else f'subscription:{group}'


NO_POLICY = EntityPolicy()
"""Nothing declared: the broker-wide settings apply."""
