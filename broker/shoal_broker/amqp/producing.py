"""
The producers' side of a message's way: a transfer in, its store write, and the answer.

A message arrives as a delivery on a producer's link (``incoming``; its sections walked by
amqp/_wire.c), is checked (size, decode, the transaction it names, the address of an anonymous
relay) and goes one of four ways (``_publish``): held by its transaction until discharge; handed
to a local consumer without the store (an at-most-once message, ``LocalSubscription.take``); sent
ahead to a local consumer while the store appends and claims it (``_send_ahead``); or appended
(``store.messages.publish_then``, batched per loop turn and address). The producer is answered
when the store is (``_stored``): accepted, or rejected when it would be refused again; never an
accept that is then lost. A write the store could not confirm for a transient reason is held
and written again once the store answers (``holding.py``); with the hold off it is released (the
peer may send it again). Credit comes back as messages are answered (``Turns.top_up``).
"""

import asyncio
import collections
import logging
import time

from shoal_broker.amqp import codec, engine, transactions
from shoal_broker.amqp import outcome_codes as codes
from shoal_broker.amqp.consuming import Consuming
from shoal_broker.amqp.duplicate_ids import duplicate_id
from shoal_broker.amqp.engine import Ptr, lib, wire
from shoal_broker.amqp.guard import Guard, user_name
from shoal_broker.amqp.holding import Holding
from shoal_broker.amqp.linking import Linking
from shoal_broker.amqp.links import ConsumerLink, PendingMessage, ProducerLink, close_link
from shoal_broker.amqp.nodes import Nodes
from shoal_broker.amqp.outlets import Fed, Held
from shoal_broker.amqp.rewrites import Claim, Rewrites
from shoal_broker.amqp.spans import Spans
from shoal_broker.amqp.subscriptions import LocalSubscription
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import (
    FIRST_RETRY_SECONDS,
    AddressNotFound,
    BrokerError,
    InvalidField,
    MessageSizeExceeded,
    SendGivenUp,
    StoreFull,
    StoreUnavailable,
    StoreUnconfirmed,
)
from shoal_broker.metrics import registry as metrics
from shoal_broker.metrics.registry import Counters
from shoal_broker.routing import addresses, outcomes
from shoal_broker.routing.storage import (
    NORMAL_BAND,
    QUEUE_GROUP,
    Entry,
    MessageStore,
    OutgoingMessage,
)
from shoal_broker.security.permissions import Operation
from shoal_broker.settings import AddressKind

logger = logging.getLogger(__name__)


class Producing:
    def __init__(
        self,
        max_message_size: int,
        store: MessageStore,
        guard: Guard,
        counters: Counters,
        turns: Turns,
        nodes: Nodes,
        coordinator: transactions.Coordinator,
        consuming: Consuming,
        linking: Linking,
        holding: Holding,
    ) -> None:
        self.max_message_size = max_message_size
        self.holding = holding
        self.store = store
        self.guard = guard
        self.counters = counters
        self.coordinator = coordinator
        # bound once: these run for every message
        self.kinds = nodes.kinds
        self.subscriptions = nodes.subscriptions
        self.by_address = nodes.by_address
        self.resolve = nodes.resolve
        self.mark_dirty = turns.mark_dirty
        self.deliver_now = turns.deliver_now
        self.top_up = turns.top_up
        self.top_up_later = turns.top_up_later
        self.duplicate_window = store.messages.duplicate_window
        self.last_value_key = store.messages.last_value_key
        self.spawn = turns.spawn
        self.release = consuming.release
        self.schedule_recovery = consuming.schedule_recovery
        self.forget = linking.link_gone
        self._on_stored = self._stored  # one bound method: publish_then batches by callback
        self._on_claimed = self._claimed  # and so does claim_then
        self.rewrites = Rewrites(
            store, holding, nodes.by_address, self._stored, self._claimed, self._late_claims
        )
        self.spans: Spans | None = None
        """Set by ``Broker`` when tracing is on."""

    def incoming(self, producer: ProducerLink, delivery: Ptr) -> None:
        size = wire.shoal_pending(delivery, self.max_message_size)
        if size < 0:
            if size == engine.IN_ABORTED:
                lib.pn_delivery_settle(delivery)
                self.top_up(producer)
            elif size == engine.IN_TOO_BIG:
                limit = self.max_message_size
                self._fail_link(producer, MessageSizeExceeded(
                    f'message exceeds the maximum size of {limit} bytes'))  # fmt: skip
            return  # IN_PARTIAL: the rest of it is still to come
        data, offsets, settled, transactional = engine.receive(producer.ptr, delivery, size)
        try:
            if data is None:
                raise codec.DecodeError('the transfer held fewer bytes than it announced')
            view = codec.parse(data[:]) if offsets is None else codec.view(data, offsets)
        except codec.DecodeError as exc:
            self.refuse(producer, delivery, settled, BrokerError(str(exc)), 'amqp:decode-error')
            return
        message = PendingMessage(delivery, view, settled)
        if transactional:
            txn_id, _ = transactions.transaction_of(lib.pn_delivery_remote(delivery))
            message.transaction = self.coordinator.find(txn_id)
            if message.transaction is None:
                self.refuse(producer, delivery, settled, transactions.UnknownTransaction(
                    'the send names no open transaction'))  # fmt: skip
                return
        if producer.address is not None and producer.kind is not None:
            self._publish(producer, message, producer.address, producer.kind)
        else:
            self._relay(producer, message)

    def _relay(self, producer: ProducerLink, message: PendingMessage) -> None:
        """Anonymous relay: the message names its address; order is kept per producer."""
        view = message.view
        if view.to and (denied := self.guard.refusal(producer.conn, Operation.SEND, view.to)):
            metrics.AUTHORIZATION_FAILURES.labels(Operation.SEND).inc()
            self.refuse(producer, message.delivery, message.settled, denied)
            return
        known = self.kinds.get(view.to or '')
        wanted = addresses.kind_from_jms_dest(view.annotations.get('x-opt-jms-dest'))
        if not producer.waiting and view.to and known and wanted in (None, known):
            self._publish(producer, message, view.to, known)
            return
        if producer.waiting is None:
            producer.waiting = collections.deque()
        producer.waiting.append(message)
        if not producer.resolving:
            producer.resolving = True
            self.spawn(self._resolve_waiting(producer))

    async def _resolve_waiting(self, producer: ProducerLink) -> None:
        waiting = producer.waiting
        try:
            while waiting and producer.alive:
                message = waiting[0]
                view = message.view
                try:
                    if not view.to:
                        raise InvalidField('a message on the anonymous relay needs a "to" address')
                    wanted = addresses.kind_from_jms_dest(view.annotations.get('x-opt-jms-dest'))
                    kind = await self.resolve(view.to, wanted, user_name(producer.conn))
                except BrokerError as exc:
                    waiting.popleft()
                    if producer.alive:
                        self.refuse(producer, message.delivery, message.settled, exc)
                    continue
                waiting.popleft()
                if producer.alive:
                    self._publish(producer, message, view.to, kind)
        finally:
            producer.resolving = False

    def _stamp_duplicate_id(
        self, producer: ProducerLink, message: PendingMessage, stored: OutgoingMessage,
        address: str, kind: AddressKind,
    ) -> bool:  # fmt: skip
        """Gives ``stored`` the id its address's window checks where it is stored (b'': it has
        none, stored unchecked; no window, no id), and its key at a last-value queue; False when
        either cannot be read, the send refused."""
        window = self.duplicate_window(address)
        if window is not None:
            try:
                stored.duplicate_id = duplicate_id(message.view.rest, window.id_property) or b''
            except codec.DecodeError as exc:
                self.refuse(producer, message.delivery, message.settled, BrokerError(str(exc)),
                            'amqp:decode-error')  # fmt: skip
                return False
        if (key_property := self.last_value_key(address)) is not None:
            return self._stamp_last_value(producer, message, stored, kind, key_property)
        return True

    def _stamp_last_value(
        self, producer: ProducerLink, message: PendingMessage, stored: OutgoingMessage,
        kind: AddressKind, key_property: str,
    ) -> bool:  # fmt: skip
        """Gives a message to a last-value queue its key (b'': none) and, at least, an empty
        duplicate id: it takes the checked publish path, never handed past the store to a local
        consumer (each would escape its replacement). False when the key cannot be read, the send
        refused. Not for a topic: its subscriptions read at their own pace."""
        if kind is not AddressKind.QUEUE:
            return True
        try:
            stored.last_value = duplicate_id(message.view.rest, key_property) or b''
        except codec.DecodeError as exc:
            self.refuse(producer, message.delivery, message.settled, BrokerError(str(exc)),
                        'amqp:decode-error')  # fmt: skip
            return False
        if stored.duplicate_id is None:
            stored.duplicate_id = b''
        return True

    def _send_in_transaction(
        self, producer: ProducerLink, message: PendingMessage, address: str, kind: AddressKind,
        stored: OutgoingMessage,
    ) -> None:  # fmt: skip
        """A transactional send: kept with its transaction until the discharge, answered with
        the transactional state now."""
        assert message.transaction is not None
        message.transaction.sends.append((address, kind, stored))
        if message.settled:
            lib.pn_delivery_settle(message.delivery)
        else:
            transactions.reply(
                message.delivery,
                codes.TRANSACTIONAL_STATE,
                transactions.accepted_in(message.transaction.id),
            )
        self.top_up(producer)
        self.mark_dirty(producer.conn)

    def _publish(
        self, producer: ProducerLink, message: PendingMessage, address: str, kind: AddressKind
    ) -> None:
        view = message.view
        if (full := self.guard.store_full) is not None and message.transaction is None:
            self.refuse(producer, message.delivery, message.settled, full)
            return
        header = view.header
        stored = OutgoingMessage(  # positional: keyword construction costs ~2 µs per message
            outcomes.priority_band(header.priority),  # band
            view.header_bytes,
            view.rest,
            (  # expiry_ms
                outcomes.expiry_ms(int(time.time() * 1000), header.ttl, view.absolute_expiry_time)
                if header.ttl or view.absolute_expiry_time
                else 0
            ),
            producer.conn.container_id or '',  # origin
        )
        stored.group = view.group or ''  # a message group: only fetch.lua may hand it out
        if self.spans is not None:
            stored = self.spans.published(producer, message, stored, address, kind)
        if not self._stamp_duplicate_id(producer, message, stored, address, kind):
            return
        if message.transaction is not None:  # held until the transaction is discharged
            self._send_in_transaction(producer, message, address, kind, stored)
            return
        due = view.annotations.get('x-opt-delivery-time')
        message.stored, message.kind = stored, kind  # kept for a write held through an outage
        if self.holding.active and not message.settled:  # behind what the hold already has
            self.rewrites.hold_new(producer, message, address, due)
            return
        sub = self.subscriptions.get((address, QUEUE_GROUP))
        if (
            kind is AddressKind.QUEUE
            and stored.duplicate_id is None  # no window: past a local consumer, a duplicate
            # would reach it unchecked
            and sub is not None
            and not sub.paused
            and not stored.group
        ):
            if (
                message.settled
                and due is None
                and not stored.expiry_ms
                and sub.take(producer, message, stored)
            ):  # handed to a consumer here, or held to be: never stored (subscriptions.py)
                lib.pn_delivery_settle(message.delivery)
                self.top_up_later(producer)
                return
            sub.spill()  # what it holds was published first
            if (
                not message.settled
                and due is None
                and not stored.expiry_ms
                and stored.band == NORMAL_BAND
                and (consumer := sub.ahead()) is not None
                and self.store.messages.can_claim(address)
            ):
                self._send_ahead(producer, message, address, sub, consumer, stored)
                return
        producer.in_store += 1
        if message.settled:  # pre-settled by the peer: nothing to answer, free it now
            lib.pn_delivery_settle(message.delivery)
        if isinstance(due, int) and due > time.time() * 1000:
            message.due = due
            future = self.store.messages.schedule(address, stored, due)  # JMS delivery delay
            future.add_done_callback(  # type: ignore[attr-defined]
                lambda f: self._stored([(producer, message, address)], *_outcome_of(f))
            )
        else:
            self.store.messages.publish_then(
                address, kind, stored, self._on_stored, (producer, message, address)
            )
        # Local consumers of this address fetch in the same pipeline, right after the publish:
        # one Redis round trip from producer to consumer instead of two (other replicas hear of
        # it through the notification the publish sends).
        for sub in self.by_address.get(address, ()):
            sub.kick()

    def _send_ahead(
        self,
        producer: ProducerLink,
        message: PendingMessage,
        address: str,
        sub: LocalSubscription,
        consumer: ConsumerLink,
        stored: OutgoingMessage,
    ) -> None:
        """An at-least-once message goes to a waiting local consumer while Redis stores and claims
        it for this replica (``LocalSubscription.ahead``); the producer is answered by the store,
        as ever."""
        producer.in_store += 1
        ahead = consumer.send_ahead(stored)
        sub.claims += 1
        self.counters.delivered(address, QUEUE_GROUP, 1)
        consumer.deliveries.count += 1
        self.deliver_now(consumer.conn)  # its transfer leaves before the store op is built
        token = (producer, message, address, sub, consumer, ahead)
        self.store.messages.claim_then(address, QUEUE_GROUP, stored, self._on_claimed, token)

    def _claimed(
        self,
        claims: list[Claim],
        result: tuple[list[str], list[Entry]] | None,
        error: BrokerError | None,
    ) -> None:
        """The store's answer for messages sent ahead: the producers are answered as for any
        publish; each delivery becomes an entry its consumer holds, and what its consumer decided
        meanwhile is applied. Refused, the messages were never stored: what the consumers do
        with them no longer matters to Redis, and each producer may send its message again. A
        transient failure holds them instead (``_hold_claims``): their consumers have them."""
        if isinstance(error, StoreUnavailable) and self.holding.enabled:
            self.rewrites.hold_claims(claims, isinstance(error, StoreUnconfirmed))
            return
        self._stored([claim[:3] for claim in claims], True if error is None else None, error)
        for claim in claims:
            claim[3].claims -= 1
        # the subscription now (its consumers may all have left and others come meanwhile)
        address, latest = claims[0][2], claims[-1][3]
        sub = self.subscriptions.get((address, QUEUE_GROUP), latest)
        for *_, ahead in claims:  # whatever happens below, a discharge waits no longer
            if ahead.answered is not None:
                _answer(ahead.answered)  # its waiter resumes after this call: after the settle
        if result is None:
            for _, _, _, _, consumer, ahead in claims:
                consumer.ahead.pop(ahead.delivery, None)
            if isinstance(error, StoreUnavailable):  # the reply, not the script, may be lost
                self.schedule_recovery(sub, max(FIRST_RETRY_SECONDS, sub.retry_delay))
            else:
                sub.kick()
            return
        self._entries_claimed(claims, sub, result)

    def _entries_claimed(
        self, claims: list[Claim], sub: LocalSubscription, result: tuple[list[str], list[Entry]]
    ) -> None:
        """Each delivery sent ahead becomes an entry its consumer holds (or what its consumer
        decided meanwhile is applied, or it is released: never an entry stranded here); what
        the claim read ahead goes to the subscription."""
        address = claims[0][2]
        ids, read_ahead = result
        for (_, _, _, _, consumer, ahead), entry_id in zip(claims, ids, strict=True):
            stored = ahead.message
            entry = Entry(entry_id, stored.band, stored.header, stored.rest, 0, 0, stored.origin)
            if self.spans is not None:  # its delivery span: sent a moment ago, the entry now known
                self.spans.sent(consumer, [entry])
            if ahead.settle is not None:  # settled meanwhile, or its link went
                ahead.settle(entry)
            elif consumer.ahead.pop(ahead.delivery, None) is not None:
                consumer.unacked[ahead.delivery] = entry
            else:  # nothing holds it any more: never leave an entry stranded here
                self.release(address, QUEUE_GROUP, entry, delivery_failed=True)
        sub.claimed(read_ahead)

    def _late_claims(self, claims: list[Claim], result: tuple[list[str], list[Entry]]) -> None:
        """Claims the hold gave up on (their producers answered) that Redis made after all."""
        address, latest = claims[0][2], claims[-1][3]
        sub = self.subscriptions.get((address, QUEUE_GROUP), latest)
        self._entries_claimed(claims, sub, result)

    def store_held(self, sub: Fed, held: list[Held]) -> None:
        """Messages a subscription held for hand-over go to the store after all, in order."""
        for producer, message, stored in held:
            producer.in_store += 1
            self.store.messages.publish_then(
                sub.address,
                AddressKind.QUEUE,
                stored,
                self._on_stored,
                (producer, message, sub.address),
            )
        sub.kick()

    def _stored(
        self,
        stored: list[tuple[ProducerLink, PendingMessage, str]],
        kept: bool | None,
        error: BrokerError | None,
    ) -> None:
        """The store's answer for messages to one address (``publish_then``: one call for a
        cycle's messages to an address and band)."""
        if error is not None and isinstance(error, StoreUnavailable) and self.holding.enabled:
            stored = self.rewrites.hold_failed(stored, isinstance(error, StoreUnconfirmed))
            if not stored:
                return
        address = stored[0][2]
        if self.spans is not None:
            self.spans.stored(stored, None if error is None else error.condition)
        state, refusal = self._answer_for(address, len(stored), kept, error)
        for producer, message, _ in stored:
            producer.in_store -= 1
            if not producer.alive:
                continue  # stored (or not) all the same; the peer will not hear of it
            try:  # as when each message had its own callback: a failure leaves the others be
                if not message.settled:
                    if refusal is not None:
                        self.refuse(producer, message.delivery, False, refusal)
                        continue
                    wire.shoal_settle_with(message.delivery, state)
                self.top_up_later(producer)
            except Exception:
                logger.exception('answering a stored message on connection %d failed',
                                 producer.conn.id)  # fmt: skip

    def _answer_for(
        self, address: str, count: int, kept: bool | None, error: BrokerError | None
    ) -> tuple[int, BrokerError | None]:
        """The disposition for ``count`` messages the store answered (counted when stored), and
        the error they are refused with instead (None: the disposition stands)."""
        if error is None:
            if kept:  # a queue's records pair enqueues with deliveries; a topic's stand alone
                queue = self.kinds.get(address) is AddressKind.QUEUE
                self.counters.enqueued(address, QUEUE_GROUP if queue else '', count)
            else:
                self.counters.dropped(address, count)
            return lib.PN_ACCEPTED, None
        if isinstance(error, AddressNotFound):
            self.kinds.pop(address, None)
        if isinstance(error, StoreFull | AddressNotFound | SendGivenUp):  # stays so if sent
            return lib.PN_RELEASED, error  # again (or waited its bound: holding.py): refused
        # never an accept that is then lost: on a store failure the peer may send it again
        return lib.PN_RELEASED, None

    def refuse(
        self,
        producer: ProducerLink,
        delivery: Ptr,
        settled: bool,
        error: BrokerError,
        condition: str | None = None,
    ) -> None:
        """Reject one message with the error's condition; the link stays open."""
        metrics.publish_refused(error)
        if not settled:
            local = lib.pn_delivery_local(delivery)
            engine.set_condition(
                lib.pn_disposition_condition(local), condition or error.condition, str(error)
            )
            lib.pn_delivery_update(delivery, lib.PN_REJECTED)
        lib.pn_delivery_settle(delivery)
        self.top_up(producer)
        self.mark_dirty(producer.conn)

    def _fail_link(self, state: ProducerLink, error: BrokerError) -> None:
        state.conn.links.pop(state.ptr, None)
        self.forget(state)
        close_link(state.ptr, error.condition, str(error))
        self.mark_dirty(state.conn)


def _answer(future: 'asyncio.Future[None]') -> None:
    if not future.done():
        future.set_result(None)


def _outcome_of(future: 'asyncio.Future[bool]') -> tuple[bool | None, BrokerError | None]:
    try:
        return future.result(), None
    except BrokerError as exc:
        return None, exc
