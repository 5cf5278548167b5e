"""
The registry every replica shares: addresses, subscriptions (consumer groups and named JMS
subscriptions with their consumers), ClientIDs and the declared policies.

Cold path: each call is a direct Redis call or one script (``join.lua``, ``leave.lua``, ...),
awaited by the attach or detach that needs it.
"""

import logging
from typing import Any

import redis.asyncio

from shoal_broker.errors import (
    AddressNotFound,
    NotAllowed,
    ResourceLimitExceeded,
    ResourceLocked,
    StoreUnavailable,
)
from shoal_broker.routing.jms_subscriptions import SubscriptionKey, SubscriptionSpec
from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.routing.storage import QUEUE_GROUP, JoinOutcome
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, layout
from shoal_broker.store.calls import Scripts, as_text, call
from shoal_broker.store.commit_nodes import NOTHING_RAN

logger = logging.getLogger(__name__)


class AddressRegistry:
    """Implements ``routing.storage.RegistryPort``."""

    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        scripts: Scripts,
        replica_id: str,
        kinds: dict[str, AddressKind],
    ) -> None:
        self._client = client
        self._scripts = scripts
        self._replica_id = replica_id
        self._kinds = kinds
        """Address kinds known (shared with the messages, which forget a deleted address)."""

    async def address_kind(self, address: str) -> AddressKind | None:
        if address in self._kinds:
            return self._kinds[address]
        raw = await call(
            layout.address_kind(self._client, self._scripts.evalsha, address, QUEUE_GROUP)
        )
        if not raw:
            return None
        kind = AddressKind(raw)
        self._kinds[address] = kind
        return kind

    async def create_address(self, address: str, kind: AddressKind) -> AddressKind:
        actual = AddressKind(
            await call(layout.create_address(
                self._client, self._scripts.evalsha, address, kind.value, QUEUE_GROUP
            ))
        )  # fmt: skip
        self._kinds[address] = actual
        return actual

    async def delete_address(self, address: str) -> None:
        await call(layout.delete_address(self._client, self._scripts.evalsha, address))
        self._kinds.pop(address, None)

    async def create_subscription(self, address: str, group: str, *, from_start: bool) -> None:
        k = keys.AddressKeys.of(address)
        args = (group, '0' if from_start else '$')
        await self._scripts.evalsha('create_group', (*k.streams, k.groups), args)

    async def delete_subscription(self, address: str, group: str) -> None:
        k = keys.AddressKeys.of(address)
        script_keys = (
            *k.streams, k.groups, k.returned(group), k.delivery_counts(group), k.shares(group),
            k.delivered(group), k.group_owners(group), k.group_parked(group), k.group_held(group),
        )  # fmt: skip
        await self._scripts.evalsha('delete_group', script_keys, (group,))

    async def subscription_room(self, address: str, group: str, limit: int) -> bool:
        """Whether ``group`` exists on the address or fewer than ``limit`` groups do."""
        k = keys.AddressKeys.of(address)
        pipe = self._client.pipeline(transaction=False)
        pipe.sismember(k.groups, group)
        pipe.scard(k.groups)
        exists, count = await call(pipe.execute())
        return bool(exists) or int(count) < limit

    async def join_subscription(
        self, spec: SubscriptionSpec, consumer: str, default_max_consumers: int
    ) -> JoinOutcome:
        key = spec.key
        k = keys.SubscriptionKeys.of(key.id)
        definition = spec.definition()
        args = (
            consumer, self._replica_id, key.id, '1' if spec.shared else '0',
            '1' if key.durable else '0', key.scope.value, key.client_id, key.name,
            definition['topic'], definition['selector'], definition['no_local'],
            default_max_consumers, await call(layout.subscription_created(self._client, key.id)),
        )  # fmt: skip
        reply = await self._scripts.evalsha('join', (k.definition, k.consumers), args)
        outcome, detail = as_text(reply[0]), as_text(reply[1])
        await call(layout.subscription_settled(self._client, key.id, reply[2]))
        if outcome == 'locked':
            raise ResourceLocked(detail)
        if outcome == 'limit':
            raise ResourceLimitExceeded(detail)
        if outcome == 'recreated':  # the old subscription's messages go with it
            await self.delete_subscription(detail or spec.topic, key.id)
        # idempotent: a replica joining an existing subscription makes sure its group exists
        await self.create_subscription(spec.topic, key.id, from_start=False)
        return JoinOutcome(outcome)

    async def leave_subscription(self, key: SubscriptionKey, consumer: str) -> int:
        k = keys.SubscriptionKeys.of(key.id)
        reply = await self._scripts.evalsha(
            'leave', (k.definition, k.consumers), (consumer, key.id)
        )
        left, topic = int(reply[0]), as_text(reply[1])
        if topic:
            await layout.subscription_deleted(self._scripts.evalsha, key.id, reply[2])
            await self.delete_subscription(topic, key.id)
        return left

    async def unsubscribe(self, key: SubscriptionKey, consumer: str) -> None:
        k = keys.SubscriptionKeys.of(key.id)
        script_keys = (k.definition, k.consumers)
        reply = await self._scripts.evalsha('unsubscribe', script_keys, (consumer, key.id))
        outcome = as_text(reply[0])
        if outcome == 'missing':
            raise AddressNotFound(f'no durable subscription named {key.name!r}')
        if outcome == 'owned':
            raise NotAllowed(f'subscription {key.name!r} is declared by {as_text(reply[1])}')
        if outcome == 'locked':
            raise ResourceLocked(f'there are active consumers on the subscription {key.name!r}')
        await layout.subscription_deleted(self._scripts.evalsha, key.id, reply[2])
        await self.delete_subscription(as_text(reply[1]), key.id)

    async def subscription_definition(self, key: SubscriptionKey) -> dict[str, str] | None:
        k = keys.SubscriptionKeys.of(key.id)
        raw = await call(self._client.hgetall(k.definition))
        return {as_text(f): as_text(v) for f, v in raw.items()} or None

    async def subscriptions(self) -> list[dict[str, Any]]:
        """Every named subscription with its consumers per replica (for introspection)."""
        found = []
        for subscription_id in await call(layout.subscription_ids(self._client)):
            k = keys.SubscriptionKeys.of(subscription_id)
            definition = await call(self._client.hgetall(k.definition))
            if not definition:
                continue  # an index entry for nothing (docs/redis-modes.md)
            consumers = await call(self._client.hgetall(k.consumers))
            per_replica: dict[str, int] = {}
            for replica in consumers.values():
                per_replica[as_text(replica)] = per_replica.get(as_text(replica), 0) + 1
            entry: dict[str, Any] = {as_text(f): as_text(v) for f, v in definition.items()}
            found.append({'id': subscription_id, **entry, 'consumers': per_replica})
        return found

    async def claim_client(self, client_id: str, holder: str) -> bool:
        """Claimed, or held by ``holder`` already: a claim tried again after its reply was lost
        (a store outage, a failover) finds its own first write, not another connection."""
        try:
            if await call(self._client.hsetnx(keys.CLIENTS, client_id, holder)):
                return True
            held = await call(self._client.hget(keys.CLIENTS, client_id))
        except NOTHING_RAN as exc:  # a failover under way: the caller may try again
            raise StoreUnavailable(f'Redis refused the ClientID check: {exc}') from exc
        return held is not None and as_text(held) == holder

    async def release_client(self, client_id: str, holder: str) -> None:
        await self._scripts.evalsha('release_client', (keys.CLIENTS,), (client_id, holder))

    async def policies(self) -> dict[str, EntityPolicy]:
        """Every declared queue's and subscription's policy by entity (``keys.POLICIES``); one
        that cannot be parsed is logged and left out (the broker-wide settings apply)."""
        raw = await call(self._client.hgetall(keys.POLICIES))
        found = {}
        for entity, text in raw.items():
            try:
                found[as_text(entity)] = EntityPolicy.from_json(text)
            except ValueError as exc:
                logger.warning('ignoring the policy of %s: %s', as_text(entity), exc)
        return found
