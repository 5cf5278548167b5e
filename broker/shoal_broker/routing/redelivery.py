"""
Redelivery delay with backoff: how long a message a consumer gave back waits before any consumer
may have it again (Queue/SharedSubscription ``delivery.redeliveryDelay``,
``redeliveryMultiplier``, ``maxRedeliveryDelay``; broker-wide SHOAL_REDELIVERY_DELAY_MS,
SHOAL_REDELIVERY_MULTIPLIER, SHOAL_MAX_REDELIVERY_DELAY_MS).

Pure. The wait is ``delay * multiplier ** (n - 1)``, capped at the maximum, where ``n`` is the
delivery-count the message carries at its next delivery (at least 1: a plain ``released`` keeps
its count). reclaim.lua applies the same rule in Redis to a dead replica's in-flight messages.
"""

import dataclasses

from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.settings import RoutingSettings

CEILING_MS = 86_400_000
"""No wait exceeds a day, whatever the multiplier and the count (the CRD's bound too)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    delay_ms: int = 0
    """The first wait; 0: no delay (a returned message is deliverable at once)."""
    multiplier: float = 1.0
    max_delay_ms: int = 0
    """Cap on the wait; 0: only the ceiling of a day."""

    def wait_ms(self, delivery_count: int) -> int:
        """The wait of a message whose next delivery carries ``delivery_count``."""
        if self.delay_ms <= 0:
            return 0
        cap = min(self.max_delay_ms or CEILING_MS, CEILING_MS)
        wait = float(self.delay_ms)
        for _ in range(max(delivery_count, 1) - 1):  # bounded: stops at the cap
            if wait >= cap:
                break
            wait *= self.multiplier
        return int(min(wait, cap))

    @property
    def script_args(self) -> tuple[int, float, int]:
        """The rule's numbers as reclaim.lua takes them."""
        return self.delay_ms, self.multiplier, min(self.max_delay_ms or CEILING_MS, CEILING_MS)


OFF = Backoff()


def backoff_of(policy: EntityPolicy, defaults: RoutingSettings) -> Backoff:
    """The entity's rule: what its policy declares, the broker-wide settings for the rest."""
    delay = policy.redelivery_delay_ms
    if delay is None:
        delay = defaults.redelivery_delay_ms
    if not delay:
        return OFF
    multiplier = policy.redelivery_multiplier
    max_delay = policy.max_redelivery_delay_ms
    return Backoff(
        delay,
        defaults.redelivery_multiplier if multiplier is None else multiplier,
        defaults.max_redelivery_delay_ms if max_delay is None else max_delay,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Backoffs:
    """Every declared entity's rule and the broker-wide one, for whoever returns messages
    without a local subscription at hand (the reaper of a dead replica)."""

    default: Backoff = OFF
    declared: dict[str, Backoff] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, policies: dict[str, EntityPolicy], defaults: RoutingSettings) -> 'Backoffs':
        default = backoff_of(EntityPolicy(), defaults)
        declared = {entity: backoff_of(p, defaults) for entity, p in policies.items()}
        return cls(default, {e: b for e, b in declared.items() if b != default})

    def get(self, entity: str) -> Backoff:
        """The rule of ``entity`` (``policies.entity_field``)."""
        return self.declared.get(entity, self.default)
