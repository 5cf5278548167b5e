"""
What a consumer's disposition does to a message: the delivery-count rules of AMQP and JMS.

Pure. ``released`` leaves the count alone; ``modified(delivery-failed)`` adds one (Qpid JMS reads
delivery-count > 0 as JMSRedelivered); ``rejected`` and too many failed attempts dead-letter.
See jms-amqp-facts §5.6 and §6.1.
"""

import dataclasses
import enum


class Outcome(enum.StrEnum):  # a str: its metric label without Enum.value (~0.15 µs a message)
    ACCEPTED = 'accepted'
    REJECTED = 'rejected'
    RELEASED = 'released'
    MODIFIED = 'modified'


class Action(enum.Enum):
    ACK = 'ack'
    """Consumed: forget it for this subscription."""
    RETURN = 'return'
    """Available again to any consumer."""
    DEAD_LETTER = 'dead-letter'
    """Move to the dead-letter address (or drop when there is none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Disposition:
    outcome: Outcome
    delivery_failed: bool = False
    undeliverable_here: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    delivery_failed: bool = False
    """Count this attempt as failed (delivery-count + 1) when returning."""
    exclude_consumer: bool = False
    """Never offer the message to the same consumer again (undeliverable-here)."""
    reason: str = ''


def decide(disposition: Disposition, delivery_count: int, max_attempts: int) -> Decision:
    """Turn a consumer's outcome into a store action; ``delivery_count`` is before this one."""
    if disposition.outcome is Outcome.ACCEPTED:
        return _ACK  # frozen, so shared: one per acknowledgement cost ~2.5 µs
    if disposition.outcome is Outcome.REJECTED:
        return Decision(Action.DEAD_LETTER, reason='rejected')
    failed = disposition.outcome is Outcome.MODIFIED and disposition.delivery_failed
    if failed and max_attempts and delivery_count + 1 >= max_attempts:
        return Decision(Action.DEAD_LETTER, reason=f'max delivery attempts ({max_attempts})')
    return Decision(
        Action.RETURN,
        delivery_failed=failed,
        exclude_consumer=disposition.outcome is Outcome.MODIFIED and disposition.undeliverable_here,
    )


_ACK = Decision(Action.ACK)


def priority_band(priority: int) -> int:
    """Each JMS priority has its own band, ``9 - priority`` (band 0 served first); a priority
    above 9 (AMQP allows up to 255) counts as 9."""
    return 9 - priority if priority < 9 else 0


def expiry_ms(arrival_ms: int, ttl: int | None, absolute_expiry_time: int | None) -> int:
    """When a message expires (ms since the epoch), from header ttl and properties; 0 = never."""
    candidates = []
    if ttl:
        candidates.append(arrival_ms + ttl)
    if absolute_expiry_time:
        candidates.append(absolute_expiry_time)
    return min(candidates) if candidates else 0
