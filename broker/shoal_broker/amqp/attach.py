"""
Answering attaches: what a peer's source or target asks for, and the attach we send back.

The reply mirrors the peer's termini (clients read a null terminus as a refusal), edits only what
the broker decides (a dynamic node's address, the settle modes), and is sent only once the store
has the node ready. A refusal is an attach with a null terminus on the broker's side followed by
a detach carrying the error, as Artemis does and Qpid JMS expects (jms-amqp-facts §2.1).
"""

from typing import TYPE_CHECKING

from shoal_broker.amqp import engine
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.links import BrowserLink, ConsumerLink, LinkState, ProducerLink
from shoal_broker.errors import AddressNotFound, BrokerError, InvalidField, NotImplementedByBroker
from shoal_broker.routing import addresses
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.settings import AddressKind

if TYPE_CHECKING:
    from shoal_broker.amqp.broker import Broker
    from shoal_broker.amqp.connection import AmqpConnection

SELECTOR_DESCRIPTORS = {0x0000468C00000004, 'apache.org:selector-filter:string'}
NO_LOCAL_DESCRIPTORS = {0x0000468C00000003, 'apache.org:no-local-filter:list'}


def mirror_termini(link: Ptr) -> None:
    lib.pn_terminus_copy(lib.pn_link_source(link), lib.pn_link_remote_source(link))
    lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))


def refuse(link: Ptr, error: BrokerError) -> None:
    """Answer an attach with a null terminus on our side, then detach with the error."""
    mirror_termini(link)
    ours = lib.pn_link_source(link) if lib.pn_link_is_sender(link) else lib.pn_link_target(link)
    lib.pn_terminus_set_type(ours, lib.PN_UNSPECIFIED)
    close_link(link, error.condition, str(error))


def close_link(link: Ptr, condition: str, description: str) -> None:
    if lib.pn_link_state(link) & lib.PN_LOCAL_CLOSED:
        return
    engine.set_condition(lib.pn_link_condition(link), condition, description)
    if lib.pn_link_state(link) & lib.PN_LOCAL_UNINIT:
        lib.pn_link_open(link)
    lib.pn_link_close(link)


def _open(link: Ptr, *, address: str | None = None) -> None:
    mirror_termini(link)
    if address is not None:
        ours = lib.pn_link_source(link) if lib.pn_link_is_sender(link) else lib.pn_link_target(link)
        engine.set_terminus_address(ours, address)
    lib.pn_link_set_snd_settle_mode(link, lib.pn_link_remote_snd_settle_mode(link))
    lib.pn_link_set_rcv_settle_mode(link, lib.PN_RCV_FIRST)
    lib.pn_link_open(link)


def _still_wanted(state: LinkState) -> bool:
    return state.alive and state.conn.alive


async def producer(broker: 'Broker', state: ProducerLink) -> LinkState | None:
    """A peer's sender: resolve (or create) the target node, then grant credit."""
    link = state.ptr
    target = lib.pn_link_remote_target(link)
    kind_of_target = lib.pn_terminus_get_type(target)
    if kind_of_target == lib.PN_COORDINATOR:
        raise NotImplementedByBroker('transactions are not supported yet')
    capabilities = engine.symbols(lib.pn_terminus_capabilities(target))
    requested = addresses.kind_from_capabilities(capabilities)
    address = engine.terminus_address(target)
    dynamic = bool(lib.pn_terminus_is_dynamic(target))
    if dynamic:
        kind = requested or AddressKind.QUEUE
        address = addresses.temporary_address(kind)
        await broker.store.create_address(address, kind)
        broker.kinds[address] = kind
        state.owned_temporary = address
    elif address is not None:
        kind = await broker.resolve(address, requested)
    else:
        kind = None  # anonymous relay
    if not _still_wanted(state):
        return None
    state.address, state.kind = address, kind
    _open(link, address=address if dynamic else None)
    lib.pn_link_set_max_message_size(link, broker.settings.amqp.max_message_size)
    state.opened = True
    lib.pn_link_flow(link, broker.settings.amqp.producer_credit)
    return state


async def consumer(
    broker: 'Broker', conn: 'AmqpConnection', link: Ptr, name: str
) -> LinkState | None:
    """A peer's receiver: a queue consumer, a queue browser or a topic subscriber."""
    placeholder = conn.links.get(link)
    assert placeholder is not None
    source = lib.pn_link_remote_source(link)
    if lib.pn_terminus_get_type(source) == lib.PN_UNSPECIFIED:
        raise AddressNotFound('no subscription is named by this link')  # null source: lookup
    capabilities = engine.symbols(lib.pn_terminus_capabilities(source))
    _reject_unsupported(source, capabilities)
    requested = addresses.kind_from_capabilities(capabilities)
    if lib.pn_terminus_is_dynamic(source):
        kind = requested or AddressKind.QUEUE
        address = addresses.temporary_address(kind)
        await broker.store.create_address(address, kind)
        broker.kinds[address] = kind
        placeholder.owned_temporary = address
    else:
        address = addresses.check_name(engine.terminus_address(source))
        kind = await broker.resolve(address, requested)
    copy = lib.pn_terminus_get_distribution_mode(source) == lib.PN_DIST_MODE_COPY
    presettled = lib.pn_link_remote_snd_settle_mode(link) == lib.PN_SND_SETTLED
    state: LinkState
    group = QUEUE_GROUP
    if kind is AddressKind.QUEUE and copy:
        state = BrowserLink(conn, link, name, address=address)
    elif kind is AddressKind.QUEUE:
        state = ConsumerLink(conn, link, name, address=address, group=group, presettled=presettled)
    else:
        group = f'nd:{broker.settings.replica_id}:{conn.id}:{broker.next_serial()}'
        await broker.store.create_subscription(address, group, from_start=False)
        state = ConsumerLink(
            conn, link, name, address=address, group=group, presettled=presettled, owned_group=True
        )
    state.owned_temporary = placeholder.owned_temporary
    if not _still_wanted(placeholder):
        state.alive = False
        broker.spawn(_undo(broker, state))
        return None
    _open(link, address=address if lib.pn_terminus_is_dynamic(source) else None)
    state.opened = True
    conn.links[link] = state
    if isinstance(state, BrowserLink):
        broker.add_browser(state)
    elif isinstance(state, ConsumerLink):
        broker.subscription(address, group).add(state)
    return state


async def _undo(broker: 'Broker', state: LinkState) -> None:
    """The peer left while we were preparing its link: remove what was made for it."""
    if isinstance(state, ConsumerLink) and state.owned_group:
        await broker.store.delete_subscription(state.address, state.group)
    if state.owned_temporary:
        await broker.delete_temporary(state.owned_temporary)


def _reject_unsupported(source: Ptr, capabilities: list[str]) -> None:
    if 'shared' in capabilities or 'global' in capabilities:
        raise NotImplementedByBroker('shared subscriptions are not supported yet')
    durable = lib.pn_terminus_get_durability(source) != lib.PN_NONDURABLE
    never = lib.pn_terminus_get_expiry_policy(source) == lib.PN_EXPIRE_NEVER
    topic = addresses.kind_from_capabilities(capabilities) is AddressKind.TOPIC
    if topic and (durable or never):
        raise NotImplementedByBroker('durable subscriptions are not supported yet')
    filters = engine.data_object(lib.pn_terminus_filter(source))
    if isinstance(filters, dict):
        for value in filters.values():
            descriptor = getattr(value, 'descriptor', None)
            if descriptor in SELECTOR_DESCRIPTORS or descriptor in NO_LOCAL_DESCRIPTORS:
                raise NotImplementedByBroker('message selectors are not supported yet')
    elif filters is not None:
        raise InvalidField('the source filter must be a map')
