"""
Where an entry goes when no consumer keeps it: back to its subscription, consumed unseen, or moved.

An entry is released (available again to any replica), filtered (a topic subscription's filters
refuse it: acknowledged without delivery), expired or dead-lettered (copied to the expiry or
dead-letter queue, annotated with why, then acknowledged; acknowledged at once when there is no
such queue). A release Redis refuses is tried again: nothing else would return the entry while
this replica lives. A consumer's give-back (``redeliver``) waits out the entity's redelivery
delay (``routing/redelivery.py``); the broker's own returns (parked, spilled, an operator's
close) never wait. Called by the consumers' outcomes (``consuming.py``), by local
subscriptions as they deal, and by transactions rolling back.
"""

import asyncio
import logging
from collections.abc import Awaitable

from shoal_broker.amqp import codec, recode
from shoal_broker.amqp.nodes import Nodes
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError, next_retry_pause
from shoal_broker.metrics.registry import Counters
from shoal_broker.routing.redelivery import backoff_of
from shoal_broker.routing.storage import Entry, MessageStore, OutgoingMessage
from shoal_broker.settings import AddressKind, RoutingSettings

logger = logging.getLogger(__name__)


class Returns:
    def __init__(
        self,
        routing: RoutingSettings,
        store: MessageStore,
        counters: Counters,
        turns: Turns,
        nodes: Nodes,
    ) -> None:
        self.routing = routing
        self.store = store
        self.counters = counters
        self.turns = turns
        self.nodes = nodes

    def redeliver(
        self, address: str, group: str, entry: Entry, *, delivery_failed: bool
    ) -> Awaitable[None]:
        """Give back an entry a consumer had (released, failed, rolled back, or its consumer
        gone): deliverable again after the entity's redelivery delay, if it has one."""
        policy = self.nodes.policy(address, group)
        wait = 0
        if policy.redelivery_delay_ms is not None or self.routing.redelivery_delay_ms:
            wait = backoff_of(policy, self.routing).wait_ms(entry.delivery_count + delivery_failed)
        if wait:
            self.counters.redelivery_delayed(address, group)
        # ahead of a fetch this replica has not sent yet: nothing newer overtakes the entry
        return self.release(address, group, entry, delivery_failed=delivery_failed,
                            delay_ms=wait, ahead_of_fetch=True)  # fmt: skip

    def release(
        self,
        address: str,
        group: str,
        entry: Entry,
        *,
        delivery_failed: bool,
        retry: float = 0.0,
        delay_ms: int = 0,
        ahead_of_fetch: bool = False,
    ) -> Awaitable[None]:
        """Give an entry back to its subscription. A release Redis refuses (full, or out of
        reach) is tried again with a growing pause: the entry is pending on this replica and
        nothing else would ever return it while the replica lives."""
        released = asyncio.ensure_future(
            self.store.messages.release(address, group, entry, delivery_failed=delivery_failed,
                                        delay_ms=delay_ms, ahead_of_fetch=ahead_of_fetch)
        )  # fmt: skip

        def check(done: 'asyncio.Future[None]') -> None:
            if done.cancelled() or done.exception() is None:
                return
            if not self.turns.accepting:  # shutting down: leaving returns what this replica holds
                return
            pause = next_retry_pause(retry)
            logger.warning('release of %s to %s/%s failed (%s); again in %.2f s',
                           entry.id, address, group, done.exception(), pause)  # fmt: skip
            self.turns.call_later(
                pause,
                lambda: self.release(
                    address,
                    group,
                    entry,
                    delivery_failed=delivery_failed,
                    retry=pause,
                    delay_ms=delay_ms,
                ),
            )

        released.add_done_callback(check)
        return released

    def filtered(self, address: str, group: str, entry: Entry) -> None:
        """An entry a subscription's selector or no-local filter excludes: consumed unseen."""
        self.counters.filtered(address, group)
        self.store.messages.ack_nowait(address, group, (entry,))

    def expire(self, address: str, group: str, entry: Entry) -> None:
        self.counters.expired(address, group)
        target = self.routing.expiry_address
        if target and target != address:
            self.turns.spawn(self._move(address, group, entry, target, 'expired'))
        else:
            self.store.messages.ack_nowait(address, group, (entry,))

    def dead_letter(self, address: str, group: str, entry: Entry, reason: str) -> None:
        self.counters.dead_lettered(address, group)
        sub = self.nodes.subscriptions.get((address, group))
        target = sub.dead_letter_address if sub else self.routing.dead_letter_address
        if target and target != address:
            self.turns.spawn(self._move(address, group, entry, target, reason))
        else:
            self.store.messages.ack_nowait(address, group, (entry,))

    async def _move(self, address: str, group: str, entry: Entry, target: str, why: str) -> None:
        """Copy an entry to another queue (dead letters, expiries), then consume the original."""
        try:
            await self.nodes.resolve(target, AddressKind.QUEUE)
            rest = recode.with_annotations(
                entry.rest,
                {'x-opt-shoal-original-address': address, 'x-opt-shoal-reason': why},
            )
            header = recode.delivery_header(entry.header, entry.delivery_count)
            moved = OutgoingMessage(entry.band, header, rest, 0)
            await self.store.messages.publish(target, AddressKind.QUEUE, moved)
            # an arrival like any other on the dead-letter (or expiry) queue: counted as enqueued
            # there, so the queue's records and the replica's load show it
            self.counters.enqueued(target)
            # the publish notifies other replicas only (as in producing.py): wake ours, or a
            # consumer already attached here to the dead-letter or expiry queue would wait for
            # the next one
            self.nodes.kick(target)
            await self.store.messages.ack(address, group, entry)
        except (BrokerError, codec.DecodeError) as exc:
            logger.warning('could not move %s from %s to %s: %s', entry.id, address, target, exc)
            if isinstance(exc, codec.DecodeError):  # cannot be annotated: drop, counted
                await self.store.messages.ack(address, group, entry)
            else:
                self.release(address, group, entry, delivery_failed=False)
