"""
What each management operation means, over the store's steps (``store/management.py``): which
messages a selector or id list picks, where a retry sends each one, and how a move reports what
it did.

A move or retry works page by page: the messages of a page that no consumer holds are copied to
their target with a marker each (one script on the target's slot), removed from the source (one
script on its slot), then the markers are forgotten. Killed between the steps, the replica leaves
each message at its source, at its target or at both (at-least-once, never lost); the same
request run again copies nothing twice and finishes the removal.
"""

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from shoal_broker import selector as selectors
from shoal_broker.errors import StoreUnavailable
from shoal_broker.management import views
from shoal_broker.metrics.records import MetricRecord
from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.routing.policies import entity_field
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.store.declarations import Removal
from shoal_broker.store.management import StoreAdmin, StoredMessage, parse_message_id

RATE_RECORDS = 5000
"""Newest metric records read for the rates (every replica's, all entities)."""

RATE_HORIZON_MS = 60_000
"""A replica's latest record older than this says nothing about the current rate."""

MAX_PAGE = 500
"""Messages one browse page returns at most: a larger ``limit`` is refused (400)."""

TRANSFER_PAGE = 200
"""Messages a move or retry copies per step."""

APPLY_WAIT_SECONDS = 3.0
"""How long a pause or resume waits for every replica to apply it (each looks for commands every
second, ``control.CONTROL_INTERVAL_SECONDS``)."""

APPLY_POLL_SECONDS = 0.05
"""How often the waiting pause looks whether the replicas have carried out its command."""

ORIGINAL_ADDRESS = 'x-opt-shoal-original-address'
"""The annotation a dead-lettered or expired message carries: where a retry sends it."""


class OperationError(Exception):
    """A refused operation: the HTTP status and why (nothing was changed, or ``done`` says
    what was)."""

    def __init__(self, status: int, message: str, done: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.done = done or {}


@dataclasses.dataclass(slots=True)
class Transfer:
    """What a move or retry did."""

    moved: int = 0
    """Removed from the source after their copy was written at the target."""
    in_flight: int = 0
    """Left at the source: out at a consumer, which settles them."""
    duplicated: int = 0
    """Copied, then found taken by a consumer before their removal: delivered from both."""
    skipped: int = 0
    """Not picked: no original address to retry to (or it no longer exists)."""
    denied: int = 0
    """Left: the caller may not ``manage`` the address they would go to."""
    targets: dict[str, int] = dataclasses.field(default_factory=dict)
    """Messages moved per target address."""


Pick = Callable[[StoredMessage], bool]
Route = Callable[[StoredMessage], str | None]


def picker(ids: list[str] | None, selector: str | None) -> Pick:
    """Which messages an operation takes: the listed ids, those the selector matches, or all;
    OperationError(400) for a malformed id or selector."""
    if ids is not None:
        try:
            wanted = {parse_message_id(i) for i in ids}
        except ValueError as exc:
            raise OperationError(400, str(exc)) from None
        return lambda m: (m.band, m.entry_id) in wanted
    if selector is not None:
        compiled = compile_selector(selector)
        return lambda m: compiled.matches(views.identifiers(m))
    return lambda m: True


def compile_selector(text: str) -> selectors.Selector:
    try:
        return selectors.compile(text)
    except selectors.SelectorError as exc:
        raise OperationError(400, f'bad selector: {exc}') from None


class Operations:
    """The management operations on one cluster's Redis. ``limit_of`` gives an address's
    backlog limit in entries (0: none), as the publish path applies it."""

    def __init__(self, admin: StoreAdmin, limit_of: Callable[[str], int]) -> None:
        self.admin = admin
        self._limit_of = limit_of

    async def kind(self, address: str) -> str:
        kind = await self.admin.address_kind(address)
        if kind is None:
            raise OperationError(404, f'no address {address!r}')
        return kind

    async def queue(self, address: str) -> None:
        """OperationError(404) unless ``address`` is a queue."""
        if await self.kind(address) != 'queue':
            raise OperationError(404, f'no queue {address!r} (it is a topic)')

    async def subscription(self, subscription_id: str) -> dict[str, str]:
        definition = await self.admin.subscription(subscription_id)
        if not definition:
            raise OperationError(404, f'no subscription {subscription_id!r}')
        return definition

    async def browse(
        self, address: str, group: str, cursor: str | None, limit: int, selector: str | None
    ) -> dict[str, Any]:
        """A page of messages not consumed yet, without consuming them; with a selector, the
        page holds only those it matches (each call scans a bounded number of messages, so a
        page may come back short with a cursor to go on)."""
        if not 1 <= limit <= MAX_PAGE:
            raise OperationError(400, f'limit must be between 1 and {MAX_PAGE}')
        pick = picker(None, selector)
        try:
            page = await self.admin.page(address, group, cursor, limit)
        except ValueError as exc:
            raise OperationError(400, str(exc)) from None
        shown = [views.view(m) for m in page.messages if pick(m)]
        return {'messages': shown, 'next': page.cursor}

    async def purge(self, address: str, group: str) -> dict[str, int]:
        purged, in_flight = await self.admin.purge(address, group)
        return {'purged': purged, 'in_flight': in_flight}

    async def delete_message(self, address: str, message_id: str) -> dict[str, int]:
        try:
            band, entry_id = parse_message_id(message_id)
        except ValueError as exc:
            raise OperationError(400, str(exc)) from None
        removed, in_flight, _ = await self.admin.remove(address, QUEUE_GROUP, band, [entry_id])
        if in_flight:
            raise OperationError(409, f'message {message_id} is out at a consumer')
        if not removed:
            raise OperationError(404, f'no message {message_id} in {address!r}')
        return {'deleted': removed}

    async def move(self, source: str, target: str, pick: Pick) -> Transfer:
        if target == source:
            raise OperationError(400, 'the target is the source')
        await self.kind(target)
        return await self._transfer(source, lambda m: target if pick(m) else None)

    async def retry(
        self, source: str, pick: Pick, allowed: Callable[[str], bool] = lambda _: True
    ) -> Transfer:
        """Each picked message back to the address it was dead-lettered or expired from, where
        the caller is ``allowed`` to send it (the others stay, counted ``denied``)."""
        return await self._transfer(
            source, lambda m: views.annotation(m, ORIGINAL_ADDRESS) if pick(m) else None, allowed
        )

    async def _transfer(
        self, source: str, route: Route, allowed: Callable[[str], bool] = lambda _: True
    ) -> Transfer:
        done = Transfer()
        kinds: dict[str, str | None] = {}
        cursor: str | None = None
        while True:
            page = await self.admin.page(source, QUEUE_GROUP, cursor, TRANSFER_PAGE)
            batches: dict[tuple[str, int], list[StoredMessage]] = {}
            for m in page.messages:
                target = route(m)
                if target is None or target == source:
                    done.skipped += target is not None
                    continue
                if not allowed(target):
                    done.denied += 1
                    continue
                if m.state == 'in-flight':
                    done.in_flight += 1
                    continue
                batches.setdefault((target, m.band), []).append(m)
            for (target, band), batch in batches.items():
                if target not in kinds:
                    kinds[target] = await self.admin.address_kind(target)
                kind = kinds[target]
                if kind is None:
                    done.skipped += len(batch)
                    continue
                await self._copy_then_remove(source, target, kind, band, batch, done)
            if page.cursor is None:
                return done
            cursor = page.cursor

    async def _copy_then_remove(
        self, source: str, target: str, kind: str, band: int, batch: list[StoredMessage],
        done: Transfer,
    ) -> None:  # fmt: skip
        markers = [f'{source}|{band}|{m.entry_id}' for m in batch]
        limit = self._limit_of(target)
        copied = await self.admin.copy(
            target, kind, band, limit, list(zip(markers, batch, strict=True))
        )
        if copied[0] < 0:
            why = {
                -1: (404, f'the queue {target!r} no longer exists'),
                -2: (409, f'{target!r} is at its backlog limit ({limit} messages)'),
                -3: (409, f'the topic {target!r} has no subscription: the messages would be lost'),
            }[copied[0]]
            counts = {
                'moved': done.moved,
                'in_flight': done.in_flight,
                'duplicated': done.duplicated,
            }
            raise OperationError(why[0], why[1], counts)
        removed, in_flight, missing = await self.admin.remove(
            source, QUEUE_GROUP, band, [m.entry_id for m in batch]
        )
        await self.admin.forget_markers(target, markers)
        done.moved += removed
        done.duplicated += in_flight + missing
        done.targets[target] = done.targets.get(target, 0) + removed

    async def delete_subscription(self, subscription_id: str) -> dict[str, str]:
        """Delete a subscription nobody is attached to, with its messages. A subscription a
        Kubernetes resource declares is refused: deleting the resource deletes it."""
        d = await self.subscription(subscription_id)
        if d.get('owner'):
            raise OperationError(409, f'declared by {d["owner"]}: delete that resource instead')
        key = SubscriptionKey(
            d.get('name', ''), Scope(d.get('scope') or Scope.GLOBAL), d.get('client', ''),
            d.get('durable') == '1',
        )  # fmt: skip
        removal = await self.admin.registry.remove_subscription(key, '', delete=True)
        if removal is Removal.IN_USE:
            raise OperationError(409, 'consumers are attached to it')
        if removal is not Removal.DELETED:
            raise OperationError(404, f'no subscription {subscription_id!r}')
        return {'deleted': subscription_id}

    async def rates(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Per (address, subscription label): messages per second enqueued, delivered and
        acknowledged over each replica's latest metric record (``SHOAL_METRICS_INTERVAL_SECONDS``;
        none when the records are off), with the delivered rate per replica."""
        latest: dict[tuple[str, str, str], MetricRecord] = {}
        now_ms = time.time() * 1000
        for fields in await self.admin.recent_records(RATE_RECORDS):
            try:
                record = MetricRecord.from_fields(fields)
            except (ValueError, TypeError):
                continue
            key = (record.address, record.subscription, record.replica)
            if key not in latest and now_ms - record.ts_ms <= RATE_HORIZON_MS:
                latest[key] = record
        rates: dict[tuple[str, str], dict[str, Any]] = {}
        for (address, label, replica), r in latest.items():
            seconds = max(r.interval_ms, 1) / 1000
            row = rates.setdefault((address, label), {
                'enqueued_per_second': 0.0, 'delivered_per_second': 0.0,
                'acknowledged_per_second': 0.0, 'delivered_per_second_per_replica': {},
            })  # fmt: skip
            row['enqueued_per_second'] += r.enqueued / seconds
            row['delivered_per_second'] += r.delivered / seconds
            row['acknowledged_per_second'] += r.accepted / seconds
            row['delivered_per_second_per_replica'][replica] = r.delivered / seconds
        return rates

    async def pause(self, entity: str, user: str, *, paused: bool) -> list[str]:
        """Set or clear the flag and have every replica apply it at once. Returns the live
        replicas that had not confirmed within ``APPLY_WAIT_SECONDS`` (they read the flags again
        within 5 s); with none, nothing is delivered from a paused entity once this returns. A
        replica whose lease has lapsed is not waited for: it is dead, and reaped soon."""
        if paused:
            await self.admin.pause(entity, user)
        else:
            await self.admin.resume(entity)
        for replica in await self.admin.replicas():
            await self.admin.send_command(replica, 'refresh')
        replicas = await self.admin.live_replicas()
        deadline = time.monotonic() + APPLY_WAIT_SECONDS
        while True:  # the replicas confirm through Redis: nothing here to wait on but a poll
            waiting = await self.admin.unapplied(replicas)
            if not waiting or time.monotonic() >= deadline:
                return waiting
            await asyncio.sleep(APPLY_POLL_SECONDS)

    async def connections(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = []
        for replica in await self.admin.replicas():
            for conn in await self.admin.connections(replica):
                listed.append({**conn, 'replica': replica})
        return listed

    async def close_connection(self, replica: str, connection: str) -> None:
        known = await self.admin.connections(replica)
        if not any(str(c.get('id')) == connection for c in known):
            raise OperationError(404, f'no connection {connection!r} on replica {replica!r}')
        await self.admin.send_command(replica, f'close {connection}')


def entity(address: str, group: str) -> str:
    """The field a queue's or subscription's pause flag is filed under."""
    return entity_field(address, group)


__all__ = ['OperationError', 'Operations', 'StoreUnavailable', 'Transfer', 'entity', 'picker']
