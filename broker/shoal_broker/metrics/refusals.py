"""
The door, limits and storage: refusals and failures a user expects to count. Not per message,
so plain prometheus_client counters. Every label takes its value from a closed set: a peer's
input (a mechanism name it made up, a user name) never becomes a label value. So every series
can exist from the start at 0 (``refusals_at_zero``), and ``rate()`` sees the first refusal.
"""

from prometheus_client import Counter

from shoal_broker.errors import BrokerError, StoreFull, UnconfirmedPastHold
from shoal_broker.security.permissions import Operation

SASL_MECHANISMS = ('ANONYMOUS', 'PLAIN', 'EXTERNAL', 'SCRAM-SHA-256', 'SCRAM-SHA-512')
"""The mechanisms the broker can offer; any other name a peer asks for is counted as ``other``."""

AUTHENTICATION_FAILURES = Counter(
    'shoal_authentication_failures',
    'Connections refused before they were authenticated, by mechanism (none: it never chose '
    'one) and reason (credentials, mechanism, malformed, protocol_header, timeout; throttled: '
    'closed unread because its source address failed too often within a minute).',
    ['mechanism', 'reason'],
)
AUTHORIZATION_FAILURES = Counter(
    'shoal_authorization_failures',
    'Operations an authenticated user was refused for lack of permission, by operation.',
    ['operation'],
)
CONNECTIONS_REFUSED = Counter(
    'shoal_connections_refused',
    'Authenticated connections the broker refused at Open, by AMQP error condition.',
    ['condition'],
)
LINKS_REFUSED = Counter(
    'shoal_links_refused',
    'Attaches the broker refused, by role (consumer, producer) and AMQP error condition.',
    ['role', 'condition'],
)
PUBLISHES_REFUSED = Counter(
    'shoal_publishes_refused',
    'Messages refused to producers because storage is limited, by reason (redis_watermark, '
    'redis_full, address_limit).',
    ['reason'],
)

HELD_SENDS_GIVEN_UP = Counter(
    'shoal_held_sends_given_up',
    'Messages held through a store outage and rejected (amqp:resource-limit-exceeded), by '
    'reason (time: held SHOAL_STORE_HOLD_SECONDS; memory: the held bytes at '
    'SHOAL_STORE_HOLD_MAX_BYTES); never accepted, though one whose write was still unanswered '
    'may be stored after all.',
    ['reason'],
)
for _reason in ('time', 'memory'):  # both series exist from the start: alerts see increase()
    HELD_SENDS_GIVEN_UP.labels(_reason)


_AUTHENTICATION_CASES = {
    'none': ('protocol_header', 'malformed', 'mechanism', 'timeout', 'throttled'),
    'other': ('mechanism', 'malformed', 'timeout'),
    **dict.fromkeys(SASL_MECHANISMS, ('credentials', 'mechanism', 'malformed', 'timeout')),
}
"""(mechanism label, reasons) that can be counted: ``none`` never chose a mechanism, so it
cannot fail on credentials, and only a connection that never chose one is throttled."""
STORE_FULL_REASONS = ('redis_full', 'redis_watermark', 'address_limit')


def _conditions() -> set[str]:
    """The AMQP error condition of every BrokerError kind: all a refusal can carry."""
    found, kinds = set(), [BrokerError]
    while kinds:
        kind = kinds.pop()
        found.add(kind.condition)
        kinds.extend(kind.__subclasses__())
    return found


def refusals_at_zero() -> None:
    """Create every series of the refusal counters at 0 (once the modules defining error kinds
    are imported)."""
    for mechanism, reasons in _AUTHENTICATION_CASES.items():
        for reason in reasons:
            AUTHENTICATION_FAILURES.labels(mechanism, reason)
    for operation in Operation:
        AUTHORIZATION_FAILURES.labels(operation)
    for condition in sorted(_conditions()):
        CONNECTIONS_REFUSED.labels(condition)
        for role in ('consumer', 'producer'):
            LINKS_REFUSED.labels(role, condition)
    for reason in STORE_FULL_REASONS:
        PUBLISHES_REFUSED.labels(reason)


def authentication_failed(mechanism: str | None, reason: str) -> None:
    label = 'none' if mechanism is None else mechanism if mechanism in SASL_MECHANISMS else 'other'
    AUTHENTICATION_FAILURES.labels(label, reason).inc()


def link_refused(sender: bool, condition: str) -> None:
    LINKS_REFUSED.labels('consumer' if sender else 'producer', condition).inc()


def publish_refused(error: BrokerError) -> None:
    """Counts a message refused because storage is limited (other refusals are not blocks), and
    one no Redis replica confirmed within the hold's bound as a held send given up (the hold
    counts its own)."""
    if isinstance(error, StoreFull):
        PUBLISHES_REFUSED.labels(error.reason).inc()
    elif isinstance(error, UnconfirmedPastHold):
        HELD_SENDS_GIVEN_UP.labels('time').inc()
