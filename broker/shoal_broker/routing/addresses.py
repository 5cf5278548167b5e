"""
Which node an attach or a message names, and whether it may be created on first use.

Pure: the protocol edge passes what the peer said (capabilities, annotations) and what the store
knows; these functions decide. Mirrors Artemis: auto-creation is on by default for queues and
topics, and a peer asking for a kind other than the address has is refused, not silently served
another distribution.
"""

import dataclasses
import uuid
from collections.abc import Iterable

from shoal_broker.errors import AddressNotFound, InvalidField, NotAllowed
from shoal_broker.settings import AddressKind, RoutingSettings

QUEUE_CAPABILITIES = frozenset({'queue', 'temporary-queue'})
TOPIC_CAPABILITIES = frozenset({'topic', 'temporary-topic'})
TEMPORARY_CAPABILITIES = frozenset({'temporary-queue', 'temporary-topic'})

# x-opt-jms-dest / x-opt-jms-reply-to codes (Qpid JMS AmqpDestinationHelper).
_JMS_DEST_KINDS = {0: AddressKind.QUEUE, 1: AddressKind.TOPIC, 2: AddressKind.QUEUE,
                   3: AddressKind.TOPIC}  # fmt: skip

MAX_ADDRESS_LENGTH = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Resolution:
    kind: AddressKind
    create: bool


def kind_from_capabilities(capabilities: Iterable[str]) -> AddressKind | None:
    """The kind a terminus asks for through its capabilities, if any."""
    caps = set(capabilities)
    if caps & QUEUE_CAPABILITIES:
        return AddressKind.QUEUE
    if caps & TOPIC_CAPABILITIES:
        return AddressKind.TOPIC
    return None


def kind_from_jms_dest(code: object) -> AddressKind | None:
    """The kind an ``x-opt-jms-dest`` annotation states, if it is one Qpid JMS writes."""
    return _JMS_DEST_KINDS.get(code) if isinstance(code, int) else None


def check_name(address: str | None) -> str:
    """An address usable as a node name, or InvalidField."""
    if not address:
        raise InvalidField('an address is required')
    if len(address) > MAX_ADDRESS_LENGTH:
        raise InvalidField(f'address longer than {MAX_ADDRESS_LENGTH} characters')
    if any(ord(ch) < 0x20 for ch in address):
        raise InvalidField('address contains control characters')
    return address


def resolve(
    address: str,
    requested: AddressKind | None,
    existing: AddressKind | None,
    settings: RoutingSettings,
) -> Resolution:
    """Decide the kind of ``address`` and whether to create it, or refuse."""
    if existing is not None:
        if requested is not None and requested != existing:
            raise NotAllowed(f'address {address!r} is a {existing}, not a {requested}')
        return Resolution(existing, create=False)
    kind = requested or settings.default_address_kind
    allowed = (
        settings.auto_create_queues if kind is AddressKind.QUEUE else settings.auto_create_topics
    )
    if not allowed:
        raise AddressNotFound(f'no {kind} named {address!r}')
    return Resolution(kind, create=True)


def temporary_address(kind: AddressKind) -> str:
    """A fresh name for a dynamic node (JMS temporary queue or topic)."""
    return f'temp-{kind}://{uuid.uuid4()}'
