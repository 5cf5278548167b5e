"""
A transaction's sends and acks, applied all or nothing (``Messages.commit``).

On one slot (standalone and Sentinel: always) the commit is one ``MULTI``/``EXEC``; in
``replicated`` durability a ``WAIT`` that no replica confirms leaves it applied on the primary
but not known to survive a failover: in doubt (``CommitInDoubt``), not rolled back. On Redis
Cluster, addresses on several slots go through the commit record of ``commits.py``
(``CommitLog``), which any live replica completes if the committer dies after deciding
(docs/redis-modes.md, "Transactions across shards").
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio

from shoal_broker.errors import CommitInDoubt, StoreUnavailable
from shoal_broker.routing.storage import Entry, OutgoingMessage
from shoal_broker.settings import AddressKind, Durability
from shoal_broker.store import keys
from shoal_broker.store.calls import Scripts, call
from shoal_broker.store.commits import CommitLog, plan, spans_slots

Sends = Sequence[tuple[str, AddressKind, OutgoingMessage]]
Acks = Sequence[tuple[str, str, Entry]]


class Transactions:
    def __init__(
        self,
        client: 'redis.asyncio.Redis',
        scripts: Scripts,
        replica_id: str,
        announce: Callable[[str], Awaitable[None]],
        durability: Durability,
        replication_timeout_ms: int,
        commits: CommitLog | None = None,
    ) -> None:
        """``commits``: on Redis Cluster, the replica's commit records."""
        self._client = client
        self._scripts = scripts
        self.replica_id = replica_id
        self._announce = announce
        self._durability = durability
        self._replication_timeout_ms = replication_timeout_ms
        self.commits = commits

    async def commit(self, sends: Sends, acks: Acks) -> None:
        if not sends and not acks:
            return
        client = self._client
        if self.commits is not None:
            parts = plan(sends, acks)
            if spans_slots(parts):
                await self.commits.commit(sends, acks)  # wakes the addresses' watchers itself
                for address in {address for address, _, _ in sends}:
                    await self._announce(address)
                return
            client = self.commits.node_for(keys.AddressKeys.of(parts[0].address).tag)
        await self._multi(client, sends, acks)

    async def _multi(self, client: 'redis.asyncio.Redis', sends: Sends, acks: Acks) -> None:
        """The publish script is sent as text (EVAL), not by hash: inside MULTI a NOSCRIPT error
        would fail that one command while the others apply, half-applying the commit."""
        pipe = client.pipeline(transaction=True)
        for address, kind, message in sends:
            k = keys.AddressKeys.of(address)
            pipe.eval(
                self._scripts.source['publish'], 3, k.streams[message.band], k.groups, k.watchers,
                kind.value, '', self.replica_id,  # announced below, once committed (and WAITed)
                message.header, message.rest, str(message.expiry_ms), message.origin,
            )  # fmt: skip
        for address, group, entry in acks:
            k = keys.AddressKeys.of(address)
            pipe.xack(k.streams[entry.band], group, entry.id)
            if entry.delivery_count:
                pipe.hdel(k.delivery_counts(group), keys.entry_field(entry.band, entry.id))
        replies = await call(pipe.execute(raise_on_error=False))
        errors = [r for r in replies if isinstance(r, Exception)]
        if errors:
            raise StoreUnavailable(f'Redis refused part of a commit: {errors[0]}')
        if self._durability is Durability.REPLICATED:
            unconfirmed: StoreUnavailable | None = None
            try:
                confirmed = await call(client.wait(1, self._replication_timeout_ms))
            except StoreUnavailable as exc:
                confirmed, unconfirmed = 0, exc
            if confirmed < 1:
                # applied on the primary, and lost only if a failover comes first: "rolled
                # back" would be false (the client would do again what its sends already did)
                await self._announce_all(sends)
                applied = asyncio.get_running_loop().create_future()
                applied.set_result(True)
                raise CommitInDoubt(
                    f'no Redis replica confirmed the commit in time: {unconfirmed or "WAIT"}',
                    outcome=applied,
                )
        await self._announce_all(sends)

    async def _announce_all(self, sends: Sends) -> None:
        for address in {address for address, _, _ in sends}:
            await self._announce(address)
