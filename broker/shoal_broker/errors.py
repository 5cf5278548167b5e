"""
Failures the broker reports to its peers.

Each class names the AMQP 1.0 error condition a peer receives, so the protocol edge never
guesses. Library errors (redis, socket) are wrapped by the edge that sees them and chained as
``__cause__``; nothing above the store knows that Redis exists.
"""

from collections.abc import Awaitable
from typing import ClassVar


class BrokerError(Exception):
    """A failure a peer should hear about. ``condition`` is its AMQP error symbol."""

    condition: ClassVar[str] = 'amqp:internal-error'


class AddressNotFound(BrokerError):
    """The address does not exist and may not be created implicitly."""

    condition = 'amqp:not-found'


class InvalidField(BrokerError):
    """A frame or message field has a value the broker cannot accept."""

    condition = 'amqp:invalid-field'


class PreconditionFailed(BrokerError):
    """The peer asked for something the node does not offer (an exclusive entity that is not)."""

    condition = 'amqp:precondition-failed'


class NotAllowed(BrokerError):
    """The request is well formed but contradicts the state of the node it names."""

    condition = 'amqp:not-allowed'


class NotImplementedByBroker(BrokerError):
    """A legal AMQP feature this broker does not offer."""

    condition = 'amqp:not-implemented'


class ResourceLocked(BrokerError):
    """The node is in use in a way that excludes the request (an active subscription)."""

    condition = 'amqp:resource-locked'


class Unauthorized(BrokerError):
    """The authenticated user lacks the permission the request needs."""

    condition = 'amqp:unauthorized-access'


class ResourceLimitExceeded(BrokerError):
    """A configured limit was reached."""

    condition = 'amqp:resource-limit-exceeded'


class FrameSizeTooSmall(BrokerError):
    """An answer would not fit in the peer's maximum frame size (and may not be cut short)."""

    condition = 'amqp:frame-size-too-small'


class MessageSizeExceeded(BrokerError):
    """A message is larger than the broker's maximum message size."""

    condition = 'amqp:link:message-size-exceeded'


class StoreFull(BrokerError):
    """Redis is at its ``maxmemory`` (or an address at its backlog limit): the message was not
    stored and is refused, not released, so the producer sees why."""

    condition = 'amqp:resource-limit-exceeded'

    def __init__(self, message: str, reason: str = 'redis_full') -> None:
        super().__init__(message)
        self.reason = reason
        """For the metrics: ``redis_full`` (Redis at maxmemory), ``redis_watermark`` (over the
        broker's high watermark) or ``address_limit`` (an address at its backlog limit)."""


class StoreCommandDenied(BrokerError):
    """The broker's Redis account may not run a command the broker needs (an ACL); ``command``
    names it."""

    def __init__(self, command: str, detail: str) -> None:
        super().__init__(f'the Redis account may not run {command}: {detail}')
        self.command = command


class StoreUnavailable(BrokerError):
    """Redis did not answer or refused the operation; nothing was acknowledged to anyone."""

    condition = 'amqp:resource-limit-exceeded'


# -- sends held through a store outage (amqp/holding.py) --


class StoreUnconfirmed(StoreUnavailable):
    """Written, but no Redis replica confirmed it in time (``replicated``): the write is on the
    primary, so writing it again before a replica is back would only add copies."""


class SendGivenUp(ResourceLimitExceeded):
    """A send the broker stopped waiting for at the store's hold bound
    (``SHOAL_STORE_HOLD_SECONDS``): rejected with the reason, not released, so that Qpid JMS
    throws a ``ResourceAllocationException`` that says why (``amqp/holding.py``)."""


class UnconfirmedPastHold(SendGivenUp):
    """Written, and no Redis replica confirmed it within the store's hold bound (``replicated``):
    not accepted, and not held any longer, so that a producer waits no longer than the bound. It
    may be stored: sent again, it is a second copy unless duplicate detection drops it."""


class CommitInDoubt(StoreUnavailable):
    """Whether a transaction was committed could not be learnt in time: Redis holds either all
    of it or none of it (a commit record that a live replica completes), so the client must be
    told neither accepted nor rolled back.

    ``outcome``, when given, resolves once the store has learnt it: True when the transaction
    is applied, False when none of it ever will be (its acknowledged entries may then be
    returned, and only then)."""

    def __init__(self, message: str, outcome: 'Awaitable[bool] | None' = None) -> None:
        super().__init__(message)
        self.outcome = outcome


FIRST_RETRY_SECONDS = 0.25
LONGEST_RETRY_SECONDS = 2.0


def next_retry_pause(previous: float, longest: float = LONGEST_RETRY_SECONDS) -> float:
    """The pause before trying a failed store call again (a fetch, a recovery, a release, leaving
    an exclusive line): a quarter second, doubled at each failure up to ``longest``, so that a
    store outage is neither hammered nor waited out for long once it ends."""
    return min(longest, max(FIRST_RETRY_SECONDS, previous * 2))
