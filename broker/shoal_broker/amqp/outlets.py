"""
What a local subscription (``subscriptions.py``) needs of the parts above it, as protocols.

A subscription deals entries to its consumers and reports what went out; entries no consumer
keeps go back, expire or are consumed unseen; messages it held for hand-over go to the store
after all. Those parts (``consuming.py``, ``returns.py``, ``producing.py``) sit above it in
amqp/'s layers, so it knows them only as these protocols, and they know a subscription only as
``Fed``.
"""

from collections.abc import Awaitable, Callable
from typing import Protocol

from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.links import ConsumerLink, PendingMessage, ProducerLink
from shoal_broker.routing.storage import Entry, MessageStore, OutgoingMessage

Held = tuple[ProducerLink, PendingMessage, OutgoingMessage]
"""A message a subscription holds for hand-over: its producer and delivery (for the store,
should it go there) and what would be stored."""


class Fed(Protocol):
    """What the parts know of a local subscription (``subscriptions.LocalSubscription``)."""

    address: str
    group: str
    recovering: bool
    retry_delay: float

    @property
    def fetching(self) -> bool: ...

    def held(self) -> set[tuple[int, str]]: ...

    def kick(self) -> None: ...


class Outlet(Protocol):
    """Where a subscription's entries go, and what it schedules (``consuming.Consuming``)."""

    @property
    def store(self) -> MessageStore: ...

    def sent(self, consumer: ConsumerLink, entries: list[Entry]) -> None: ...

    def handed(self, consumer: ConsumerLink, count: int) -> None: ...

    def release(
        self, address: str, group: str, entry: Entry, *, delivery_failed: bool, retry: float = 0.0
    ) -> Awaitable[None]: ...

    def expire(self, address: str, group: str, entry: Entry) -> None: ...

    def filtered(self, address: str, group: str, entry: Entry) -> None: ...

    def mark_dirty(self, conn: AmqpConnection) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> None: ...

    def schedule_recovery(self, sub: Fed, delay: float) -> None: ...

    def leave_sharing(self, address: str, group: str) -> None: ...

    def line(
        self, address: str, group: str, line: str, *, join: bool, hand_over: bool = True
    ) -> None: ...


class Intake(Protocol):
    """Where messages held for hand-over go when they must be stored after all
    (``producing.Producing``)."""

    def store_held(self, sub: Fed, held: list[Held]) -> None: ...
