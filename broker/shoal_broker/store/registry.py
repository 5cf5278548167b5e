"""
Provisioned definitions: queues and shared subscriptions declared by Kubernetes resources.

The operator writes here and the broker reads the same keys, so there is one schema with one owner
(DESIGN.md §6): a declared subscription is the broker's own definition HASH (``keys.py``) plus an
``owner`` field naming the resource (``<namespace>/<name>``). The broker's scripts honour that
field: an attach contradicting the declaration is refused, unsubscribing it is refused with
``amqp:not-allowed``, and a declared non-durable subscription outlives its last consumer. Status
(consumers across replicas, backlog, oldest message age) is read back from the same keys. Each
declaration also files its resource's deletion policy (``OnDeletion``), so that what a resource
deleted while no operator ran leaves behind is deleted or kept as the resource asked.

Redis failures become ``StoreUnavailable``; a refused declaration becomes ``ProvisionConflict``.
"""

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.records import AnalyticsSummary, MetricRecord
from shoal_broker.routing.jms_subscriptions import SubscriptionKey
from shoal_broker.routing.policies import NO_POLICY, EntityPolicy, entity_field
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, layout, scripts
from shoal_broker.store.declarations import (
    EntityState,
    OnDeletion,
    ProvisionConflict,
    Provisioned,
    RedisInfo,
    Removal,
    SubscriptionDeclaration,
)
from shoal_broker.store.inspect import Inspector

_SCRIPTS = (
    'provision_subscription', 'deprovision_subscription', 'create_group', 'delete_group',
    'create_address', 'delete_address', 'index_forget',
)  # fmt: skip


class Registry(Inspector):
    """The operator's handle on one cluster's Redis: the inspector's read-only view plus the
    writes that declare and remove queues and subscriptions."""

    def __init__(self, client: 'redis.asyncio.Redis') -> None:
        super().__init__(client)
        self._scripts = {name: client.register_script(scripts.source(name)) for name in _SCRIPTS}

    async def info(self) -> RedisInfo:
        started = time.perf_counter()
        await self._call(self._client.ping())
        latency = (time.perf_counter() - started) * 1000
        server = await self._call(self._client.info('server'))
        return RedisInfo(round(latency, 3), str(server.get('redis_version', '')))

    # -- subscriptions ----------------------------------------------------------------------------

    async def declare_subscription(
        self, declaration: SubscriptionDeclaration, *, recreate: bool
    ) -> Provisioned:
        """Make Redis hold the declared subscription; its consumer group starts at new messages."""
        key, topic = declaration.key, declaration.topic
        await self._claim_address(topic, AddressKind.TOPIC)
        k = keys.SubscriptionKeys.of(key.id)
        args = (
            key.id, key.name, key.scope.value, key.client_id, '1' if key.durable else '0', topic,
            declaration.selector or '',
            '' if declaration.max_consumers is None else str(declaration.max_consumers),
            declaration.owner, str(declaration.generation), '1' if recreate else '0',
            await self._call(layout.subscription_created(self._client, key.id)),
        )  # fmt: skip
        # the indexes first (docs/redis-modes.md, "Indexes outside the scripts")
        field = keys.provisioned_subscription(key.id)
        previous = await self._call(self._client.hget(keys.PROVISIONED, field))
        await self._call(self._client.hset(keys.PROVISIONED, field, declaration.owner))
        reply = await self._run_raw('provision_subscription', (k.definition, k.consumers), args)
        outcome, detail = str(reply[0]), str(reply[1])
        await self._call(layout.subscription_settled(self._client, key.id, reply[2]))
        if outcome == 'conflict':
            if previous is None:
                await self._call(self._client.hdel(keys.PROVISIONED, field))
            else:
                await self._call(self._client.hset(keys.PROVISIONED, field, previous))
            raise ProvisionConflict(detail)
        if outcome == Provisioned.RECREATED:
            await self._delete_group(detail, key.id)
        await self._create_group(topic, key.id, from_start=False)
        policy = declaration.policy
        if policy.duplicate_detection is not None:  # the replicas check it where topic is stored
            policy = dataclasses.replace(policy, topic=topic)
        changed = await self._write_policy(entity_field(topic, key.id), policy)
        changed = await self._file_on_deletion(field, declaration.on_deletion) or changed
        if changed and outcome == Provisioned.UNCHANGED:
            return Provisioned.UPDATED
        return Provisioned(outcome)

    async def remove_subscription(
        self, key: SubscriptionKey, owner: str, *, delete: bool, only_if_empty: bool = False
    ) -> Removal:
        """Delete the subscription and its backlog, or (``delete=False``) release it."""
        if delete and only_if_empty:
            state = await self.subscription_state(key)
            if state.exists and state.owner in ('', owner) and state.backlog:
                return Removal.IN_USE
        k = keys.SubscriptionKeys.of(key.id)
        reply = await self._run_raw(
            'deprovision_subscription',
            (k.definition, k.consumers),
            (key.id, owner, 'delete' if delete else 'release'),
        )
        outcome = str(reply[0])
        if outcome == Removal.DELETED:
            run = self._run_raw
            await self._call(layout.subscription_deleted(run, key.id, reply[2]))
            await self._delete_group(str(reply[1]), key.id)
        if outcome in (Removal.DELETED, Removal.RELEASED, Removal.MISSING):
            field = keys.provisioned_subscription(key.id)
            await self._call(self._client.hdel(keys.PROVISIONED, field))
            await self._write_policy(entity_field('', key.id), NO_POLICY)
            await self._file_on_deletion(keys.provisioned_subscription(key.id), None)
        return Removal(outcome)

    async def subscription_state(self, key: SubscriptionKey) -> EntityState:
        k = keys.SubscriptionKeys.of(key.id)
        definition: dict[str, str] = await self._call(self._client.hgetall(k.definition))
        if not definition:
            return EntityState(exists=False)
        consumers: dict[str, str] = await self._call(self._client.hgetall(k.consumers))
        topic = definition.get('topic', '')
        backlog = await self.backlog(topic, key.id)
        per_replica: dict[str, int] = {}
        for replica in consumers.values():
            per_replica[replica] = per_replica.get(replica, 0) + 1
        return EntityState(
            exists=True,
            owner=definition.get('owner', ''),
            definition=definition,
            consumers=len(consumers),
            consumer_replicas=len(per_replica),
            consumers_per_replica=per_replica,
            delivered=await self.delivered(topic, key.id),
            line=tuple((await self.lines([(topic, key.id)]))[0]),
            backlog=backlog.backlog,
            ready=backlog.ready,
            in_flight=backlog.in_flight,
            oldest_age_seconds=await self._oldest_age(topic, key.id),
            policy=await self.policy(entity_field(topic, key.id)),
        )

    # -- queues -----------------------------------------------------------------------------------

    async def declare_queue(
        self,
        address: str,
        owner: str,
        policy: EntityPolicy = NO_POLICY,
        on_deletion: OnDeletion = OnDeletion.RETAIN,
    ) -> Provisioned:
        """Make Redis hold the queue (messages sent before any consumer attaches are kept)."""
        created = await self._claim_address(address, AddressKind.QUEUE)
        field = keys.provisioned_queue(address)
        previous = await self._call(self._client.hget(keys.PROVISIONED, field))
        if previous and previous != owner:
            raise ProvisionConflict(f'queue {address!r} is already declared by {previous}')
        await self._call(self._client.hset(keys.PROVISIONED, field, owner))
        await self._create_group(address, QUEUE_GROUP, from_start=True)
        changed = await self._write_policy(entity_field(address, QUEUE_GROUP), policy)
        changed = await self._file_on_deletion(field, on_deletion) or changed
        if created:
            return Provisioned.CREATED
        if previous != owner:
            return Provisioned.ADOPTED
        return Provisioned.UPDATED if changed else Provisioned.UNCHANGED

    async def remove_queue(
        self, address: str, owner: str, *, delete: bool, only_if_empty: bool = False
    ) -> Removal:
        """Delete the queue with its messages, or (``delete=False``) release it."""
        field = keys.provisioned_queue(address)
        previous = await self._call(self._client.hget(keys.PROVISIONED, field))
        if previous and previous != owner:
            return Removal.FOREIGN
        kind = await self._address_kind(address)
        if kind != AddressKind.QUEUE:
            await self._call(self._client.hdel(keys.PROVISIONED, field))
            await self._write_policy(entity_field(address, QUEUE_GROUP), NO_POLICY)
            await self._file_on_deletion(field, None)
            return Removal.MISSING
        waiting = delete and only_if_empty and await self.backlog(address, QUEUE_GROUP)
        if waiting and waiting.backlog:
            return Removal.IN_USE
        await self._call(self._client.hdel(keys.PROVISIONED, field))
        await self._write_policy(entity_field(address, QUEUE_GROUP), NO_POLICY)
        await self._file_on_deletion(field, None)
        if not delete:
            return Removal.RELEASED
        await self._call(layout.delete_address(self._client, self._run_raw, address))
        return Removal.DELETED

    async def queue_state(self, address: str) -> EntityState:
        if await self._address_kind(address) != AddressKind.QUEUE:
            return EntityState(exists=False)
        owner = await self._call(
            self._client.hget(keys.PROVISIONED, keys.provisioned_queue(address))
        )
        backlog = await self.backlog(address, QUEUE_GROUP)
        return EntityState(
            exists=True,
            owner=owner or '',
            backlog=backlog.backlog,
            ready=backlog.ready,
            in_flight=backlog.in_flight,
            oldest_age_seconds=await self._oldest_age(address, QUEUE_GROUP),
            policy=await self.policy(entity_field(address, QUEUE_GROUP)),
            line=tuple((await self.lines([(address, QUEUE_GROUP)]))[0]),
        )

    async def states(
        self, queues: Sequence[str], subscriptions: Sequence[SubscriptionKey]
    ) -> tuple[dict[str, EntityState], dict[str, EntityState]]:
        """``queue_state`` of each queue (by address) and ``subscription_state`` of each
        subscription (by id), read for all of them at once: three pipelined round trips plus
        one ``backlog.lua`` call per address (``_backlogs``), however many there are, so that the
        operator's pass over thousands of resources fits its interval."""
        pipe = self._client.pipeline(transaction=False)
        for address in queues:
            pipe.hget(keys.AddressKeys.of(address).meta, 'kind')
            pipe.hget(keys.PROVISIONED, keys.provisioned_queue(address))
            pipe.hget(keys.POLICIES, entity_field(address, QUEUE_GROUP))
        for key in subscriptions:
            k = keys.SubscriptionKeys.of(key.id)
            pipe.hgetall(k.definition)
            pipe.hgetall(k.consumers)
        replies = list(await self._call(pipe.execute())) if queues or subscriptions else []
        found_queues: dict[str, EntityState] = {}
        groups: list[tuple[str, str]] = []
        for i, address in enumerate(queues):
            kind, owner, policy = replies[3 * i : 3 * i + 3]
            # an address an older replica created has no record yet: laid out on first look
            kind = _text(kind) if kind is not None else await self._address_kind(address)
            if kind == AddressKind.QUEUE:
                found_queues[address] = EntityState(
                    exists=True, owner=_text(owner or ''), policy=_policy(policy)
                )
                groups.append((address, QUEUE_GROUP))
            else:
                found_queues[address] = EntityState(exists=False)
        subs = replies[3 * len(queues) :]
        defined = [(key, subs[2 * i], subs[2 * i + 1]) for i, key in enumerate(subscriptions)]
        defined = [(key, d, c) for key, d, c in defined if d]
        pipe = self._client.pipeline(transaction=False)
        for key, definition, _ in defined:
            pipe.hget(keys.POLICIES, entity_field(_text(definition.get('topic', '')), key.id))
        policies = list(await self._call(pipe.execute())) if defined else []
        sub_groups = [(_text(d.get('topic', '')), key.id) for key, d, _ in defined]
        backlogs = await self._backlogs(groups + sub_groups)
        per_replica = await self._per_replica(sub_groups) if sub_groups else []
        lines = [tuple(line) for line in await self.lines(groups + sub_groups)]
        clock = time.time()
        for (address, _), backlog, line in zip(groups, backlogs, lines, strict=False):
            found_queues[address] = dataclasses.replace(
                found_queues[address], **_numbers(backlog, clock), line=line
            )
        found_subs = {key.id: EntityState(exists=False) for key in subscriptions}
        sub_backlogs = backlogs[len(groups) :]
        for (key, definition, consumers), policy, backlog, (_, delivered), line in zip(
            defined, policies, sub_backlogs, per_replica, lines[len(groups) :], strict=True
        ):
            replicas: dict[str, int] = {}
            for replica in consumers.values():
                replicas[_text(replica)] = replicas.get(_text(replica), 0) + 1
            found_subs[key.id] = EntityState(
                exists=True, owner=_text(definition.get('owner', '')),
                definition={_text(k): _text(v) for k, v in definition.items()},
                consumers=len(consumers), consumer_replicas=len(replicas),
                consumers_per_replica=replicas, delivered=delivered, policy=_policy(policy),
                line=line, **_numbers(backlog, clock),
            )  # fmt: skip
        return found_queues, found_subs

    # -- policies ---------------------------------------------------------------------------------

    async def policy(self, entity: str) -> EntityPolicy:
        """The policy filed under ``entity`` (``routing.policies.entity_field``); empty if none
        or unreadable."""
        text = await self._call(self._client.hget(keys.POLICIES, entity))
        try:
            return EntityPolicy.from_json(text) if text else EntityPolicy()
        except ValueError:
            return EntityPolicy()

    async def _write_policy(self, entity: str, policy: EntityPolicy) -> bool:
        """File (or, when empty, remove) the policy; True if that changed what Redis held."""
        if await self.policy(entity) == policy:
            return False
        if policy.empty:
            await self._call(self._client.hdel(keys.POLICIES, entity))
        else:
            await self._call(self._client.hset(keys.POLICIES, entity, policy.to_json()))
        return True

    # -- deletion policies ------------------------------------------------------------------------

    async def on_deletion(self) -> dict[str, OnDeletion]:
        """The deletion policy filed with each declaration (the fields of ``declared``); one
        filed by no declaration, or not understood, is left out (``Retain``)."""
        filed: dict[str, str] = await self._call(self._client.hgetall(keys.DELETION_POLICIES))
        known = {policy.value for policy in OnDeletion}
        return {field: OnDeletion(value) for field, value in filed.items() if value in known}

    async def _file_on_deletion(self, field: str, policy: OnDeletion | None) -> bool:
        """File (None: remove) the declaration's deletion policy; True if that changed Redis.
        Filed after the declaration is made and removed after it is gone: a step cut short
        leaves a declaration that is retained until its next reconcile files the policy again,
        or a policy no declaration reads (the next declaration of that entity replaces it)."""
        filed = await self._call(self._client.hget(keys.DELETION_POLICIES, field))
        if filed == policy:
            return False
        if policy is None:
            await self._call(self._client.hdel(keys.DELETION_POLICIES, field))
        else:
            await self._call(self._client.hset(keys.DELETION_POLICIES, field, policy.value))
        return True

    # -- cluster-wide -----------------------------------------------------------------------------

    async def declared(self) -> dict[str, str]:
        """Every declared entity (``queue:<address>``, ``subscription:<id>``) -> its owner."""
        found: dict[str, str] = await self._call(self._client.hgetall(keys.PROVISIONED))
        return found

    async def subscription_count(self) -> int:
        """Named subscriptions the index lists (with any entry a crash left for nothing)."""
        count: int = await self._call(self._client.hlen(keys.SUBSCRIPTION_INDEX))
        return count

    async def analytics_summary(self) -> AnalyticsSummary | None:
        """The analytics job's latest summary; None when there is none. ValueError if malformed."""
        fields = await self._call(self._client.hgetall(keys.ANALYTICS_SUMMARY))
        return AnalyticsSummary.from_fields(fields) if fields else None

    # -- plumbing ---------------------------------------------------------------------------------

    async def _claim_address(self, address: str, kind: AddressKind) -> bool:
        """Register the address as ``kind``; True if it was new. Another kind is a conflict."""
        existed = await self._address_kind(address)
        actual = await self._call(
            layout.create_address(self._client, self._run_raw, address, kind.value, QUEUE_GROUP)
        )
        created = not existed
        if actual != kind.value:
            raise ProvisionConflict(f'address {address!r} exists as a {actual}, not a {kind}')
        return created

    async def _address_kind(self, address: str) -> str:
        """The address's kind, '' if it does not exist."""
        found: str = await self._call(
            layout.address_kind(self._client, self._run_raw, address, QUEUE_GROUP)
        )
        return found

    async def _create_group(self, address: str, group: str, *, from_start: bool) -> None:
        k = keys.AddressKeys.of(address)
        await self._run_raw(
            'create_group', (*k.streams, k.groups), (group, '0' if from_start else '$')
        )

    async def _delete_group(self, address: str, group: str) -> None:
        k = keys.AddressKeys.of(address)
        script_keys = (
            *k.streams, k.groups, k.returned(group), k.delivery_counts(group), k.shares(group),
            k.delivered(group), k.group_owners(group), k.group_parked(group), k.group_held(group),
        )  # fmt: skip
        await self._run_raw('delete_group', script_keys, (group,))

    async def _oldest_age(self, address: str, group: str) -> float | None:
        """Age of the group's oldest unconsumed entry: its oldest pending one, or the first one
        after its last-delivered id (stream ids start with their creation time in ms)."""
        oldest_ms: int | None = None
        for stream in keys.AddressKeys.of(address).streams:
            candidates = []
            try:
                summary = await self._call(self._client.xpending(stream, group))
                groups = await self._call(self._client.xinfo_groups(stream))
            except StoreUnavailable as exc:
                if isinstance(exc.__cause__, redis.exceptions.ResponseError):
                    continue  # no such stream or group yet
                raise
            if summary.get('min'):
                candidates.append(summary['min'])
            last = next((g['last-delivered-id'] for g in groups if g['name'] == group), None)
            if last is not None:
                # entries hold binary message data: read them undecoded, only the id is used
                after = await self._call(self._client.execute_command(  # type: ignore[no-untyped-call]
                    'XRANGE', stream, f'({last}', '+', 'COUNT', 1, NEVER_DECODE=True
                ))  # fmt: skip
                if after:
                    entry_id = after[0][0]
                    candidates.append(
                        entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    )
            for entry_id in candidates:
                ms = int(str(entry_id).partition('-')[0])
                oldest_ms = ms if oldest_ms is None else min(oldest_ms, ms)
        if oldest_ms is None:
            return None
        return round(max(0.0, time.time() - oldest_ms / 1000), 3)

    async def _run_raw(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._call(self._scripts[name](keys=list(keys_), args=list(args)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _policy(text: Any) -> EntityPolicy:
    """A filed policy; empty if none or unreadable (as ``Registry.policy``)."""
    try:
        return EntityPolicy.from_json(_text(text)) if text else EntityPolicy()
    except ValueError:
        return EntityPolicy()


def _numbers(backlog: Any, clock: float) -> dict[str, Any]:
    """An ``EntityState``'s backlog fields from a ``GroupBacklog`` read at ``clock``."""
    age = None
    if backlog.oldest_ms is not None:
        age = round(max(0.0, clock - backlog.oldest_ms / 1000), 3)
    return {'backlog': backlog.backlog, 'ready': backlog.ready, 'in_flight': backlog.in_flight,
            'oldest_age_seconds': age}  # fmt: skip


# -- metric records of declared entities ----------------------------------------------------------


async def declared_owners(client: 'redis.asyncio.Redis') -> dict[str, str]:
    """``PROVISIONED`` read with any client (the broker's store client returns bytes)."""
    return await Inspector(client).declared_owners()


def owner_of(address: str, subscription: str, owners: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, name) of the resource declaring a queue (``subscription`` = ``queue``) or a
    subscription (its id), from ``declared_owners``; None when no resource declares it."""
    if subscription == QUEUE_GROUP:
        owner = owners.get(keys.provisioned_queue(address))
    else:
        owner = owners.get(keys.provisioned_subscription(subscription))
    if not owner or '/' not in owner:
        return None
    namespace, _, name = owner.partition('/')
    return namespace, name


def labelled(record: MetricRecord, owners: Mapping[str, str]) -> MetricRecord:
    """The record with ``cr_namespace``/``cr_name`` of the resource declaring its queue or
    subscription (so the analytics job can join metrics to resources); unchanged otherwise."""
    owner = owner_of(record.address, record.subscription, owners)
    if owner is None:
        return record
    return dataclasses.replace(record, cr_namespace=owner[0], cr_name=owner[1])
