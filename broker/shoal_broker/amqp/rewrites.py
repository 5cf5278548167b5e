"""
The producing side of the hold (``holding.py``): a message held through a store outage is
written again as it was first written, a publish as a publish and a send ahead as a claim, and
answered through ``Producing`` once the store answers for good.

A message sent ahead to a local consumer (``Producing._send_ahead``) whose claim failed is
claimed again, never published anew: its consumer has it already, and a second entry would
deliver it twice.

A held message given up while its write is unanswered (``HeldSend.given_up``) has had its
answer: what the store says of that write later answers no producer. A claim made after all
still gives its entry to its consumer, or releases it (``Producing._late_claims``).
"""

import time
from collections.abc import Callable
from typing import Any

from shoal_broker.amqp.holding import HeldSend, HoldExpired, Holding
from shoal_broker.amqp.links import Ahead, ConsumerLink, PendingMessage, ProducerLink
from shoal_broker.amqp.subscriptions import LocalSubscription
from shoal_broker.errors import BrokerError, StoreUnavailable, StoreUnconfirmed
from shoal_broker.routing.storage import QUEUE_GROUP, Entry, MessageStore

Stored = tuple[ProducerLink, PendingMessage, str]
Claim = tuple[ProducerLink, PendingMessage, str, LocalSubscription, ConsumerLink, Ahead]


class Rewrites:
    def __init__(
        self,
        store: MessageStore,
        holding: Holding,
        by_address: dict[str, list[LocalSubscription]],
        answer_stored: Callable[[list[Stored], bool | None, BrokerError | None], None],
        answer_claimed: Callable[
            [list[Claim], tuple[list[str], list[Entry]] | None, BrokerError | None], None
        ],
        late_claims: Callable[[list[Claim], tuple[list[str], list[Entry]]], None],
    ) -> None:
        self.store = store
        self.holding = holding
        self.by_address = by_address
        self._answer_stored = answer_stored
        self._answer_claimed = answer_claimed
        self._late_claims = late_claims
        self._on_rewritten = self._rewritten  # one bound method: publish_then batches by it
        self._on_reclaimed = self._reclaimed

    def _give_up(self, send: HeldSend, expired: HoldExpired) -> None:
        self._answer_stored([send.token], None, expired)

    def _claim_given_up(self, send: HeldSend, expired: HoldExpired) -> None:
        self._answer_claimed([send.token], None, expired)

    def hold_new(
        self, producer: ProducerLink, message: PendingMessage, address: str, due: object
    ) -> None:
        """A message that arrives while sends are held joins the hold, never sent yet."""
        if isinstance(due, int) and due > time.time() * 1000:
            message.due = due
        producer.in_store += 1
        self.holding.hold(self._held(producer, message, address, sent=False))

    def _held(
        self, producer: ProducerLink, message: PendingMessage, address: str, *, sent: bool
    ) -> HeldSend:
        stored = message.stored
        size = len(stored.header) + len(stored.rest) if stored is not None else 0
        token = (producer, message, address)
        return HeldSend(producer, size, self._rewrite, self._give_up, token, sent, address=address)

    def hold_failed(self, stored: list[Stored], unconfirmed: bool) -> list[Stored]:
        """Hold the messages of a failed write that a producer still waits for (those answered
        later); return the others (pre-settled, or their producer gone), answered as before."""
        others = []
        for producer, message, address in stored:
            if message.settled or not producer.alive or message.stored is None:
                others.append((producer, message, address))
            else:
                send = self._held(producer, message, address, sent=True)
                self.holding.hold(send, unconfirmed=unconfirmed)
        return others

    def _rewrite(self, send: HeldSend) -> None:
        producer, message, address = send.token
        if not producer.alive:  # nobody waits for it: it was never accepted
            producer.in_store -= 1
            self.holding.drop(send)
            return
        stored, kind = message.stored, message.kind
        assert stored is not None
        assert kind is not None
        if message.due is not None:
            future = self.store.messages.schedule(address, stored, message.due)
            future.add_done_callback(  # type: ignore[attr-defined]
                lambda f: self._rewritten([send], *_outcome_of(f))
            )
        else:
            self.store.messages.publish_then(address, kind, stored, self._on_rewritten, send)
        for sub in self.by_address.get(address, ()):
            sub.kick()

    def _rewritten(self, sends: list[HeldSend], kept: bool | None, error: BrokerError | None
                   ) -> None:  # fmt: skip
        """The store's answer for held messages written again: held once more while it fails
        for a transient reason, otherwise answered as any write."""
        if any(send.given_up for send in sends):  # answered already: stored or not, no one waits
            sends = [send for send in sends if not send.given_up]
            if not sends:
                return
        if isinstance(error, StoreUnavailable):
            for send in sends:
                self.holding.hold(send, unconfirmed=isinstance(error, StoreUnconfirmed))
            return
        for send in sends:
            self.holding.written(send)
        self._answer_stored([send.token for send in sends], kept, error)

    def hold_claims(
        self,
        claims: list[Claim],
        unconfirmed: bool,
    ) -> None:
        """Messages sent ahead whose claim failed are claimed again once the store answers:
        their consumers have them already, so writing them as new messages would deliver them
        twice. Held even when their producer is gone."""
        for claim in claims:
            ahead = claim[5]
            size = len(ahead.message.header) + len(ahead.message.rest)
            give_up = self._claim_given_up
            send = HeldSend(claim[0], size, self._reclaim, give_up, claim, True, address=claim[2])
            self.holding.hold(send, unconfirmed=unconfirmed)

    def _reclaim(self, send: HeldSend) -> None:
        address, ahead = send.token[2], send.token[5]
        self.store.messages.claim_then(
            address, QUEUE_GROUP, ahead.message, self._on_reclaimed, send
        )

    def _split_late(
        self, sends: list[HeldSend], result: tuple[list[str], list[Entry]] | None
    ) -> tuple[list[HeldSend], tuple[list[str], list[Entry]] | None]:
        """Hand the claims given up on to ``late_claims`` when Redis made them after all;
        return the others and their part of ``result`` (with what it read ahead)."""
        late, late_ids, live, live_ids = _split(sends, result)
        if result is None:
            return live, None
        read_ahead = result[1]
        self._late_claims([s.token for s in late], (late_ids, [] if live else read_ahead))
        return live, (live_ids, read_ahead)

    def _reclaimed(
        self,
        sends: list[HeldSend],
        result: tuple[list[str], list[Entry]] | None,
        error: BrokerError | None,
    ) -> None:
        if any(send.given_up for send in sends):
            sends, result = self._split_late(sends, result)
            if not sends:
                return
        if isinstance(error, StoreUnavailable):
            for send in sends:
                self.holding.hold(send, unconfirmed=isinstance(error, StoreUnconfirmed))
            return
        for send in sends:
            self.holding.written(send)
        self._answer_claimed([send.token for send in sends], result, error)


def _split(
    sends: list[HeldSend], result: tuple[list[str], list[Entry]] | None
) -> tuple[list[HeldSend], list[str], list[HeldSend], list[str]]:
    """The sends given up and the others, each with its entry ids (in ``result``'s order)."""
    ids = result[0] if result is not None else [''] * len(sends)
    late = [(send, i) for send, i in zip(sends, ids, strict=True) if send.given_up]
    live = [(send, i) for send, i in zip(sends, ids, strict=True) if not send.given_up]
    return [s for s, _ in late], [i for _, i in late], [s for s, _ in live], [i for _, i in live]


def _outcome_of(future: Any) -> tuple[bool | None, BrokerError | None]:
    try:
        return future.result(), None
    except BrokerError as exc:
        return None, exc
