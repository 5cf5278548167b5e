"""
Links come and go: an attach answered once the store has its node ready, a detach answered once
what the link held is given back, and everything a link leaves behind when it goes.

An attach that needs the store (does the address exist? create it? a subscription?) is answered
asynchronously by ``attach.py``: the link stays un-attached on our side until the store replies,
and a link the peer gave up on meanwhile is noticed through ``LinkState.alive``. A consumer that
goes returns its unsettled entries (modified, delivery-failed: ``links.UNSETTLED_ON_DETACH``) and
leaves its subscription; a detach with closed=true on a durable subscription is JMS unsubscribe.
``attach.py`` reaches the broker's parts through this class (``attach.Attaching``).
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

from shoal_broker.amqp import attach, engine, transactions
from shoal_broker.amqp.browsing import Browsing
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.consuming import Consuming
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.guard import Guard
from shoal_broker.amqp.links import (
    UNSETTLED_ON_DETACH,
    BrowserLink,
    ConsumerLink,
    LinkState,
    LookupLink,
    ProducerLink,
    close_link,
)
from shoal_broker.amqp.nodes import Nodes
from shoal_broker.amqp.subscriptions import LocalSubscription
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError, StoreUnavailable
from shoal_broker.metrics import registry as metrics
from shoal_broker.routing.exclusive import is_exclusive
from shoal_broker.routing.jms_subscriptions import SubscriptionKey
from shoal_broker.routing.storage import MessageStore
from shoal_broker.settings import AddressKind, BrokerSettings

logger = logging.getLogger(__name__)


class Linking:
    def __init__(
        self,
        settings: BrokerSettings,
        store: MessageStore,
        guard: Guard,
        turns: Turns,
        nodes: Nodes,
        browsing: Browsing,
        consuming: Consuming,
        coordinator: transactions.Coordinator,
        connections: set[AmqpConnection],
    ) -> None:
        self.settings = settings
        self.store = store
        self.guard = guard
        self.turns = turns
        self.nodes = nodes
        self.browsing = browsing
        self.consuming = consuming
        self.coordinator = coordinator
        self.connections = connections
        self.kinds = nodes.kinds
        self.mark_dirty = turns.mark_dirty
        self.spawn = turns.spawn

    # -- what attach.py asks of the parts (attach.Attaching) -------------------------------------

    async def resolve(
        self, address: str, requested: AddressKind | None, creator: str | None = None
    ) -> AddressKind:
        return await self.nodes.resolve(address, requested, creator)

    def top_up(self, producer: ProducerLink) -> None:
        self.turns.top_up(producer)

    def add_browser(self, browser: BrowserLink) -> None:
        self.browsing.add_browser(browser)

    def subscription(self, address: str, group: str) -> LocalSubscription:
        return self.nodes.subscription(address, group)

    def exclusive(self, address: str, group: str) -> bool:
        """Whether the queue or subscription has a single active consumer (its policy, else
        SHOAL_EXCLUSIVE_ADDRESSES)."""
        patterns = self.nodes.settings.routing.exclusive_addresses
        return is_exclusive(self.nodes.policy(address, group).exclusive, address, patterns)

    def next_serial(self) -> int:
        return self.nodes.next_serial()

    # -- attach and detach -----------------------------------------------------------------------

    def on_link_remote_open(self, conn: AmqpConnection, event: Ptr) -> None:
        link = lib.pn_event_link(event)
        if not lib.pn_link_state(link) & lib.PN_LOCAL_UNINIT:
            return
        name = engine.link_name(link)
        if not self.turns.accepting:
            attach.refuse(link, BrokerError('broker is shutting down'))
            return
        if (limited := self.guard.link_refusal(conn, link)) is not None:
            attach.refuse(link, limited)
            return
        if (too_big := attach.reply_refusal(conn, link)) is not None:
            logger.info('attach %r refused: %s', name, too_big)
            attach.refuse(link, too_big)
            return
        if lib.pn_link_is_sender(link):
            placeholder = LinkState(conn, link, name)
            conn.links[link] = placeholder
            self._answer_attach(conn, placeholder, attach.consumer(self, conn, link, name))
        else:
            state = ProducerLink(conn, link, name)
            conn.links[link] = state
            self._answer_attach(conn, state, attach.producer(self, state))

    def _answer_attach(
        self, conn: AmqpConnection, state: LinkState, work: Coroutine[Any, Any, LinkState | None]
    ) -> None:
        async def answer() -> None:
            try:
                await conn.opened.wait()  # a pipelined attach waits for our Open
                if not (state.alive and conn.alive):
                    work.close()  # the link went while we waited: its pointer may be freed
                    return
                result = await work
            except BrokerError as exc:
                logger.info('attach %r refused: %s', state.name, exc)
                self._refuse(conn, state, exc)
            except Exception:
                logger.exception('attach %r failed', state.name)
                self._refuse(conn, state, BrokerError('internal error'))
            else:
                if result is not None and result is not state:
                    conn.links[state.ptr] = result
            if conn.alive:
                self.mark_dirty(conn)

        self.spawn(answer())

    def _refuse(self, conn: AmqpConnection, state: LinkState, error: BrokerError) -> None:
        # The link is freed when the peer's detach arrives (on_link_remote_detach), not here:
        # freeing it now would free it twice.
        if state.alive and conn.alive:
            attach.refuse(state.ptr, error)
            conn.links.pop(state.ptr, None)
            self.link_gone(state)

    def on_link_remote_detach(self, conn: AmqpConnection, event: Ptr) -> None:
        link = lib.pn_event_link(event)
        closed = lib.pn_event_type(event) == lib.PN_LINK_REMOTE_CLOSE
        state = conn.links.pop(link, None)
        key = _durable_key(state) if closed else None
        left = self.link_gone(state, unsubscribing=key is not None) if state is not None else None
        if key is not None and state is not None:
            # detach(closed=true) on a durable subscription is JMS unsubscribe: the answering
            # detach waits for the store, and carries resource-locked while consumers remain
            consumer = state.consumer_key if isinstance(state, ConsumerLink) else ''
            self.spawn(self._unsubscribe_then_close(conn, link, key, consumer))
            return
        if left is not None:
            # JMS consumer.close() waits for this answer and may unsubscribe right after, from
            # any replica: answer once the consumer is unregistered cluster-wide, or that
            # unsubscribe would still find it and be refused with resource-locked. A plain
            # topic subscriber's answer waits for its subscription to go, so nothing published
            # after close() returns is stored for it.
            self.spawn(self._answer_detach_after(conn, link, closed, left))
            return
        self._answer_detach(link, closed)

    async def _answer_detach_after(
        self, conn: AmqpConnection, link: Ptr, closed: bool, left: 'asyncio.Future[None]'
    ) -> None:
        await asyncio.wait([left])
        if conn.alive:
            self._answer_detach(link, closed)
            self.mark_dirty(conn)

    def _answer_detach(self, link: Ptr, closed: bool, error: BrokerError | None = None) -> None:
        if lib.pn_link_state(link) & lib.PN_LOCAL_UNINIT:
            attach.mirror_termini(link)
        if not lib.pn_link_state(link) & lib.PN_LOCAL_CLOSED:
            if error is not None:
                engine.set_condition(lib.pn_link_condition(link), error.condition, str(error))
            if closed:
                lib.pn_link_close(link)
            else:
                lib.pn_link_detach(link)
        lib.pn_link_free(link)

    async def _unsubscribe_then_close(
        self, conn: AmqpConnection, link: Ptr, key: SubscriptionKey, consumer: str
    ) -> None:
        error: BrokerError | None = None
        try:
            await self.store.registry.unsubscribe(key, consumer)
        except BrokerError as exc:
            error = exc
        if conn.alive:
            self._answer_detach(link, True, error)
            self.mark_dirty(conn)

    def link_gone(
        self, state: LinkState, *, unsubscribing: bool = False
    ) -> 'asyncio.Future[None] | None':
        """Forget a link; for a subscription's consumer, the unregistering under way."""
        state.alive = False
        left = None
        if isinstance(state, ConsumerLink):
            left = self._consumer_gone(state, unsubscribing=unsubscribing)
        elif isinstance(state, BrowserLink):
            self.browsing.browser_gone(state)
        elif isinstance(state, transactions.CoordinatorLink):
            self.coordinator.coordinator_gone(state)
        if state.owned_temporary:
            self.spawn(self.delete_temporary(state.owned_temporary))
        return left

    def _consumer_gone(
        self, consumer: ConsumerLink, *, unsubscribing: bool = False
    ) -> 'asyncio.Future[None] | None':
        metrics.link_detached(consumer.deliveries)
        sub = consumer.subscription
        if sub is not None:
            sub.remove(consumer)
        unacked, consumer.unacked = consumer.unacked, {}
        for ahead in consumer.ahead.values():  # returned once the store names their entries
            ahead.settle = lambda entry: self.consuming.apply(consumer, entry, UNSETTLED_ON_DETACH)
        consumer.ahead.clear()
        returned = [] if consumer.owned_group else [
            self.consuming.apply(consumer, entry, UNSETTLED_ON_DETACH) for entry in unacked.values()
        ]  # fmt: skip
        if sub is not None and not sub.consumers:
            # the message groups it owns here go once the returns are done (amqp/groups.py)
            self.spawn(self.consuming.drop_groups(sub.address, sub.group, returned))
        if sub is not None and sub.exclusive:  # its place goes once they are back
            self.spawn(self.consuming.leave_line(sub.address, sub.group, consumer.line, returned))
        left = None
        if consumer.owned_group:
            left = self.spawn(self._drop_subscription(consumer.address, consumer.group))
        elif consumer.named is not None and not unsubscribing:
            left = self.spawn(self._leave(consumer.named, consumer.consumer_key, returned))
        if sub is not None and not sub.consumers:
            self.nodes.forget(sub.address, sub.group)
        return left

    async def _leave(
        self, key: SubscriptionKey, consumer: str, returned: list[Awaitable[None] | None]
    ) -> None:
        """Unregister a consumer once its unsettled entries are back (a volatile subscription
        may be deleted with its last consumer, and must not get entries returned afterwards)."""
        await asyncio.gather(*(r for r in returned if r is not None), return_exceptions=True)
        with contextlib.suppress(BrokerError):
            await self.store.registry.leave_subscription(key, consumer)

    async def _drop_subscription(self, address: str, group: str) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.registry.delete_subscription(address, group)

    async def delete_temporary(self, address: str) -> None:
        """Delete a dynamic node; its consumers on this replica are detached."""
        for conn in list(self.connections):
            for state in list(conn.links.values()):
                if isinstance(state, ConsumerLink | BrowserLink) and state.address == address:
                    close_link(state.ptr, 'amqp:resource-deleted', 'temporary node deleted')
                    self.mark_dirty(conn)
        self.kinds.pop(address, None)
        with contextlib.suppress(StoreUnavailable):
            await self.store.registry.delete_address(address)


def _durable_key(state: LinkState | None) -> SubscriptionKey | None:
    """The durable subscription a closing link deletes (JMS unsubscribe), if any."""
    if isinstance(state, LookupLink):
        return state.key
    if isinstance(state, ConsumerLink) and state.named is not None and state.named.durable:
        return state.named
    return None
