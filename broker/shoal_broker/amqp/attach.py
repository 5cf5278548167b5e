"""
Answering attaches: what a peer's source or target asks for, and the attach we send back.

The reply mirrors the peer's termini (clients read a null terminus as a refusal), edits only what
the broker decides (a dynamic node's address, the settle modes), and is sent only once the store
has the node ready. A refusal is an attach with a null terminus on the broker's side followed by
a detach carrying the error, as Artemis does and Qpid JMS expects (jms-amqp-facts §2.1).
"""

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from shoal_broker.amqp import engine
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.guard import Guard, user_name
from shoal_broker.amqp.links import (
    BrowserLink,
    ConsumerLink,
    LinkState,
    LookupLink,
    ProducerLink,
    close_link,
)
from shoal_broker.amqp.selector_offload import compile_off_loop
from shoal_broker.amqp.subscriptions import LocalSubscription
from shoal_broker.amqp.transactions import COORDINATOR_CAPABILITIES, CoordinatorLink
from shoal_broker.errors import (
    AddressNotFound,
    BrokerError,
    FrameSizeTooSmall,
    InvalidField,
    NotImplementedByBroker,
    PreconditionFailed,
)
from shoal_broker.metrics import registry as metrics
from shoal_broker.routing import addresses, exclusive, jms_subscriptions
from shoal_broker.routing.storage import QUEUE_GROUP, MessageStore
from shoal_broker.security.permissions import Operation
from shoal_broker.settings import AddressKind, BrokerSettings


class Attaching(Protocol):
    """What answering an attach uses of the broker's parts (``linking.Linking``)."""

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def store(self) -> MessageStore: ...

    @property
    def guard(self) -> Guard: ...

    @property
    def kinds(self) -> dict[str, AddressKind]: ...

    async def resolve(
        self, address: str, requested: AddressKind | None, creator: str | None = None
    ) -> AddressKind: ...

    def top_up(self, producer: ProducerLink) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> 'asyncio.Future[None]': ...

    def add_browser(self, browser: BrowserLink) -> None: ...

    def subscription(self, address: str, group: str) -> LocalSubscription: ...

    def exclusive(self, address: str, group: str) -> bool: ...

    def next_serial(self) -> int: ...

    async def delete_temporary(self, address: str) -> None: ...


SELECTOR_DESCRIPTORS = {0x0000468C00000004, 'apache.org:selector-filter:string'}
NO_LOCAL_DESCRIPTORS = {0x0000468C00000003, 'apache.org:no-local-filter:list'}


REPLY_OVERHEAD = 512
"""Bytes of an attach reply besides the termini's addresses and data fields (frame header,
link name, handle, role, settle modes, delivery count, maximum message size), rounded up."""


def reply_refusal(conn: AmqpConnection, link: Ptr) -> FrameSizeTooSmall | None:
    """The error for an attach whose reply would not fit in the peer's maximum frame size.

    The reply mirrors the peer's termini (a 40 KB selector comes back in the source's filter),
    an attach cannot span frames, and the spec lets the sending end report only the filter
    actually in place, never a cut one: so such an attach is refused, and the refusal (a null
    terminus on our side) is small."""
    limit = lib.pn_transport_get_remote_max_frame(conn.transport)
    if not limit:
        return None
    size = REPLY_OVERHEAD + len(engine.link_name(link).encode())
    for terminus in (lib.pn_link_remote_source(link), lib.pn_link_remote_target(link)):
        size += len((engine.terminus_address(terminus) or '').encode())
        for data in (
            lib.pn_terminus_properties(terminus), lib.pn_terminus_capabilities(terminus),
            lib.pn_terminus_outcomes(terminus), lib.pn_terminus_filter(terminus),
        ):  # fmt: skip
            size += max(0, lib.pn_data_encoded_size(data))
    if size <= limit:
        return None
    return FrameSizeTooSmall(
        f'the attach reply echoes the source and target (about {size} bytes), more than the '
        f"connection's maximum frame size of {limit} bytes: shorten the selector or raise it"
    )


def mirror_termini(link: Ptr) -> None:
    lib.pn_terminus_copy(lib.pn_link_source(link), lib.pn_link_remote_source(link))
    lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))


def refuse(link: Ptr, error: BrokerError) -> None:
    """Answer an attach with a null terminus on our side, then detach with the error."""
    metrics.link_refused(lib.pn_link_is_sender(link), error.condition)
    mirror_termini(link)
    ours = lib.pn_link_source(link) if lib.pn_link_is_sender(link) else lib.pn_link_target(link)
    lib.pn_terminus_set_type(ours, lib.PN_UNSPECIFIED)
    close_link(link, error.condition, str(error))


def _open(link: Ptr, *, address: str | None = None) -> None:
    mirror_termini(link)
    if address is not None:
        ours = lib.pn_link_source(link) if lib.pn_link_is_sender(link) else lib.pn_link_target(link)
        engine.set_terminus_address(ours, address)
    lib.pn_link_set_snd_settle_mode(link, lib.pn_link_remote_snd_settle_mode(link))
    lib.pn_link_set_rcv_settle_mode(link, lib.PN_RCV_FIRST)
    lib.pn_link_open(link)


async def _temporary(
    parts: Attaching, owner: LinkState, requested: AddressKind | None
) -> tuple[str, AddressKind]:
    """Create a dynamic node (JMS temporary queue or topic) owned by ``owner``'s link."""
    kind = requested or AddressKind.QUEUE
    address = addresses.temporary_address(kind)
    await parts.store.registry.create_address(address, kind)
    parts.kinds[address] = kind
    metrics.address_seen(address, topic=kind is AddressKind.TOPIC)
    owner.owned_temporary = address
    return address, kind


def _still_wanted(state: LinkState) -> bool:
    return state.alive and state.conn.alive


async def producer(parts: Attaching, state: ProducerLink) -> LinkState | None:
    """A peer's sender: resolve (or create) the target node, then grant credit."""
    link = state.ptr
    target = lib.pn_link_remote_target(link)
    if lib.pn_terminus_get_type(target) == lib.PN_COORDINATOR:
        return _coordinator(parts, state)
    capabilities = engine.symbols(lib.pn_terminus_capabilities(target))
    requested = addresses.kind_from_capabilities(capabilities)
    address = engine.terminus_address(target)
    dynamic = bool(lib.pn_terminus_is_dynamic(target))
    if dynamic:
        address, kind = await _temporary(parts, state, requested)
    elif address is not None:
        parts.guard.authorize(state.conn, Operation.SEND, address)
        kind = await parts.resolve(address, requested, user_name(state.conn))
    else:
        kind = None  # anonymous relay: checked per message
    if not _still_wanted(state):
        return None
    state.address, state.kind = address, kind
    _open(link, address=address if dynamic else None)
    lib.pn_link_set_max_message_size(link, parts.settings.amqp.max_message_size)
    state.opened = True
    parts.top_up(state)  # the first credit (none while over the memory ceiling)
    return state


def _coordinator(parts: Attaching, state: ProducerLink) -> LinkState | None:
    """A transaction controller's link: answered with a coordinator target, and credit."""
    if not _still_wanted(state):
        return None
    link = state.ptr
    coordinator = CoordinatorLink(state.conn, link, state.name)
    mirror_termini(link)
    engine.put_symbols(
        lib.pn_terminus_capabilities(lib.pn_link_target(link)), COORDINATOR_CAPABILITIES
    )
    lib.pn_link_set_rcv_settle_mode(link, lib.PN_RCV_FIRST)
    lib.pn_link_open(link)
    coordinator.opened = True
    lib.pn_link_flow(link, CONTROL_CREDIT)
    return coordinator


CONTROL_CREDIT = 100
"""Declares and discharges a controller may have in flight (credit is topped up per request)."""


async def consumer(
    parts: Attaching, conn: AmqpConnection, link: Ptr, name: str
) -> LinkState | None:
    """A peer's receiver: a queue consumer, a queue browser or a topic subscriber."""
    placeholder = conn.links.get(link)
    assert placeholder is not None
    source = lib.pn_link_remote_source(link)
    if lib.pn_terminus_get_type(source) == lib.PN_UNSPECIFIED:
        return await lookup(parts, conn, link, name)
    capabilities = set(engine.symbols(lib.pn_terminus_capabilities(source)))
    selector_text, no_local = source_filters(source)
    requested = addresses.kind_from_capabilities(capabilities)
    dynamic = bool(lib.pn_terminus_is_dynamic(source))
    copy = lib.pn_terminus_get_distribution_mode(source) == lib.PN_DIST_MODE_COPY
    address = None if dynamic else addresses.check_name(engine.terminus_address(source))
    if address is not None:  # permission first: a refused peer costs no selector compilation
        parts.guard.authorize(conn, Operation.BROWSE if copy else Operation.CONSUME, address)
    selector = await compile_off_loop(selector_text) if selector_text else None
    if address is None:
        address, kind = await _temporary(parts, placeholder, requested)
    else:
        kind = await _resolve_to_receive(parts, conn, copy, address, requested)
    presettled = lib.pn_link_remote_snd_settle_mode(link) == lib.PN_SND_SETTLED
    state: LinkState
    if kind is AddressKind.QUEUE and copy:
        state = BrowserLink(conn, link, name, address=address, selector=selector)
    else:
        consumer = ConsumerLink(
            conn, link, name, address=address, group=QUEUE_GROUP, presettled=presettled,
            selector=selector, no_local=no_local,
        )  # fmt: skip
        consumer.arrived = placeholder.arrived  # its rank is its attach's, not its answer's
        if kind is AddressKind.TOPIC:
            await _subscribe(parts, consumer, source, capabilities, selector_text)
        if exclusive.CAPABILITY in capabilities and not parts.exclusive(address, consumer.group):
            parts.spawn(_undo(parts, consumer))
            raise PreconditionFailed(f'{address} has no single active consumer (not exclusive)')
        state = consumer
    state.owned_temporary = placeholder.owned_temporary
    if not _still_wanted(placeholder):
        state.alive = False
        parts.spawn(_undo(parts, state))
        return None
    _open(link, address=address if dynamic else None)
    state.opened = True
    conn.links[link] = state
    if isinstance(state, BrowserLink):
        parts.add_browser(state)
    elif isinstance(state, ConsumerLink):
        state.deliveries = metrics.link_attached(state.address, state.group, state.name)
        parts.subscription(state.address, state.group).add(state)
    return state


async def _resolve_to_receive(
    parts: Attaching,
    conn: AmqpConnection,
    copy: bool,
    address: str,
    requested: AddressKind | None,
) -> AddressKind:
    """Resolve a consumer's address, its permission checked before the address may be created
    (browsing a queue needs browse or consume; anything else consume)."""
    parts.guard.authorize(conn, Operation.BROWSE if copy else Operation.CONSUME, address)
    kind = await parts.resolve(address, requested, user_name(conn))
    if kind is AddressKind.TOPIC or not copy:
        parts.guard.authorize(conn, Operation.CONSUME, address)
    return kind


async def _subscribe(
    parts: Attaching,
    consumer: ConsumerLink,
    source: Ptr,
    capabilities: set[str],
    selector_text: str | None,
) -> None:
    """Give a topic consumer its subscription: a named (durable or shared) one, or its own."""
    expiry = _EXPIRY_NAMES.get(lib.pn_terminus_get_expiry_policy(source), 'session-end')
    spec = jms_subscriptions.spec_for_attach(
        link_name=consumer.name,
        container_id=consumer.conn.container_id,
        capabilities=capabilities,
        durability=lib.pn_terminus_get_durability(source),
        expiry_policy=expiry,
        topic=consumer.address,
        selector=selector_text,
        no_local=consumer.no_local,
    )
    if spec is None:
        consumer.group = f'nd:{parts.settings.replica_id}:{consumer.conn.id}:{parts.next_serial()}'
        await parts.guard.check_subscription_room(
            parts.store.registry, consumer.address, consumer.group
        )
        consumer.owned_group = True
        await parts.store.registry.create_subscription(
            consumer.address, consumer.group, from_start=False
        )
        return
    if spec.shared and parts.settings.routing.declared_subscriptions_only:
        definition = await parts.store.registry.subscription_definition(spec.key)
        jms_subscriptions.check_declared(spec, definition)
    if (
        spec.key.durable
        and (denied := parts.guard.refusal(consumer.conn, Operation.MANAGE, consumer.address))
        and await parts.store.registry.subscription_definition(spec.key) is None
    ):
        metrics.AUTHORIZATION_FAILURES.labels(Operation.MANAGE).inc()
        raise denied  # creating a durable subscription needs manage; joining one, consume
    await parts.guard.check_subscription_room(parts.store.registry, consumer.address, spec.key.id)
    consumer.named = spec.key
    consumer.group = spec.key.id
    consumer.consumer_key = (
        f'{parts.settings.replica_id}|{consumer.conn.id}|{consumer.name}|{parts.next_serial()}'
    )
    await parts.store.registry.join_subscription(
        spec, consumer.consumer_key, parts.settings.routing.max_consumers_per_subscription
    )


async def lookup(parts: Attaching, conn: AmqpConnection, link: Ptr, name: str) -> LinkState | None:
    """A null-source attach: Qpid JMS looking up a durable subscription to unsubscribe it.

    proton-c does not expose a link's desired capabilities, so the global namespace is
    recognised by the ``|global`` link name Qpid JMS uses exactly when it desires [shared, global].
    """
    placeholder = conn.links[link]
    shared_global = {'shared', 'global'} if name.endswith('|global') else set()
    key = jms_subscriptions.lookup_key(name, conn.container_id, shared_global)
    definition = await parts.store.registry.subscription_definition(key)
    if definition is None:
        raise AddressNotFound(f'no durable subscription named {key.name!r}')
    parts.guard.authorize(conn, Operation.MANAGE, definition.get('topic', ''))
    if not _still_wanted(placeholder):
        return None
    lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))
    ours = lib.pn_link_source(link)
    lib.pn_terminus_set_type(ours, lib.PN_SOURCE)
    engine.set_terminus_address(ours, definition.get('topic', ''))
    lib.pn_terminus_set_durability(ours, lib.PN_DELIVERIES)
    lib.pn_terminus_set_expiry_policy(ours, lib.PN_EXPIRE_NEVER)
    lib.pn_terminus_set_distribution_mode(ours, lib.PN_DIST_MODE_COPY)
    caps = ['topic'] + (['shared'] if definition.get('shared') == '1' else [])
    engine.put_symbols(
        lib.pn_terminus_capabilities(ours), caps + sorted(shared_global - {'shared'})
    )
    if definition.get('selector'):
        engine.put_filter(lib.pn_terminus_filter(ours), definition['selector'])
    lib.pn_link_set_snd_settle_mode(link, lib.pn_link_remote_snd_settle_mode(link))
    lib.pn_link_set_rcv_settle_mode(link, lib.PN_RCV_FIRST)
    lib.pn_link_open(link)
    state = LookupLink(conn, link, name, key=key, opened=True)
    conn.links[link] = state
    return state


async def _undo(parts: Attaching, state: LinkState) -> None:
    """The peer left while we were preparing its link: remove what was made for it."""
    if isinstance(state, ConsumerLink) and state.owned_group:
        await parts.store.registry.delete_subscription(state.address, state.group)
    if isinstance(state, ConsumerLink) and state.named is not None:
        await parts.store.registry.leave_subscription(state.named, state.consumer_key)
    if state.owned_temporary:
        await parts.delete_temporary(state.owned_temporary)


def source_filters(source: Ptr) -> tuple[str | None, bool]:
    """The JMS selector and no-local flag of a source's filter set, matched by descriptor."""
    filters = engine.data_object(lib.pn_terminus_filter(source))
    if filters is None:
        return None, False
    if not isinstance(filters, dict):
        raise InvalidField('the source filter must be a map')
    selector: str | None = None
    no_local = False
    for value in filters.values():
        descriptor = getattr(value, 'descriptor', None)
        if descriptor in SELECTOR_DESCRIPTORS:
            text = getattr(value, 'value', None)
            if not isinstance(text, str):
                raise InvalidField('a selector filter must hold a string')
            selector = text.strip() or None
        elif descriptor in NO_LOCAL_DESCRIPTORS:
            no_local = True
        else:
            raise NotImplementedByBroker(f'unsupported filter type {descriptor!r}')
    return selector, no_local


_EXPIRY_NAMES = {
    lib.PN_EXPIRE_WITH_LINK: 'link-detach',
    lib.PN_EXPIRE_WITH_SESSION: 'session-end',
    lib.PN_EXPIRE_WITH_CONNECTION: 'connection-close',
    lib.PN_EXPIRE_NEVER: 'never',
}
