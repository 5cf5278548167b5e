"""
Replica liveness: leases, and cleaning up after a replica that died without saying goodbye.

Each replica holds a lease key with a TTL and renews it well before it expires, from a thread of
its own (``LeaseKeeper``), so a busy event loop cannot let it lapse. Every replica
watches the others: when a lease has expired, one live replica (whichever takes the reaping lock)
returns the dead replica's in-flight entries to their subscriptions (delivery-count + 1), removes
its consumer registrations (deleting volatile subscriptions left without consumers), destroys its
private topic subscriptions and releases its ClientIDs. A replica whose lease exists is never
touched, so live replicas are never robbed. Each step is idempotent, so a reaper that dies midway
leaves work the next one finishes.
"""

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from shoal_broker.metrics.registry import EXCLUSIVE_HANDOVERS
from shoal_broker.routing.policies import entity_field
from shoal_broker.routing.storage import NORMAL_BAND
from shoal_broker.store import connect, keys, layout, scripts
from shoal_broker.store.calls import as_text
from shoal_broker.store.groups import drop_keys
from shoal_broker.store.redisstore import RedisStore

logger = logging.getLogger(__name__)

RECLAIM_BATCH = 500
ADDRESS_BATCH = 500
"""Addresses visited per pipeline when a replica leaves or is reaped."""
REAPING_LOCK_MS = 60_000


async def registered_leases(client: Any) -> dict[str, bool]:
    """Registered replica -> whether its lease exists (either key: an older replica of a rolling
    upgrade holds only ``keys.lease``). Redis's own errors pass through: callers wrap them."""
    members = sorted(as_text(m) for m in await client.smembers(keys.REPLICAS))
    if not members:
        return {}
    pipe = client.pipeline(transaction=False)
    for replica in members:
        pipe.exists(keys.ReplicaKeys.of(replica).lease)
        pipe.exists(keys.lease(replica))
    alive = await pipe.execute()
    return {r: bool(alive[2 * i] or alive[2 * i + 1]) for i, r in enumerate(members)}


@dataclasses.dataclass
class ReapReport:
    replica: str
    entries_returned: int = 0
    consumers_removed: int = 0
    subscriptions_deleted: int = 0
    clients_released: int = 0


def renewal_keys(replica_id: str) -> tuple[str, str, str]:
    """KEYS of renew_lease.lua: all on the replica's own slot (``keys.ReplicaKeys``)."""
    k = keys.ReplicaKeys.of(replica_id)
    return k.lease, k.reaping, k.joined


RETRY_SECONDS = 0.25
"""Pause before renewing the lease again after a renewal failed."""


class LeaseKeeper:
    """Renews the lease from a thread of its own, over a synchronous Redis connection of its
    own, so that the lease never depends on the event loop being free: a loop busy for longer
    than the lease still holds it while the process lives. Each outcome of renew_lease.lua (or
    the Redis error) is handed to ``report`` on the loop."""

    def __init__(
        self,
        url: str,
        replica_id: str,
        token: str,
        lease_seconds: float,
        report: Callable[[str, Exception | None], None],
    ) -> None:
        self.replica_id = replica_id
        self.token = token
        self.lease_ms = int(lease_seconds * 1000)
        self.interval = lease_seconds / 3
        self._report = report
        self._loop = asyncio.get_running_loop()
        self._client = connect.sync_client_of_any_mode(
            url, socket_timeout=self.interval, socket_connect_timeout=self.interval
        )
        self._renew = self._client.register_script(scripts.source('renew_lease'))
        self._older_lease = not connect.is_cluster_url(url)
        """Also renew the lease key of the older layout (``keys.lease``), which an older
        replica's reaper looks at during a rolling upgrade; a cluster has no older replicas."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='lease', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _run(self) -> None:
        args = (self.token, self.lease_ms, self.replica_id)
        delay = self.interval
        while not self._stop.wait(delay):
            error: Exception | None = None
            try:
                connect.follow_primary(self._client)
                state = as_text(self._renew(keys=renewal_keys(self.replica_id), args=args))
                if self._older_lease and state in ('renewed', 'late'):
                    self._client.set(keys.lease(self.replica_id), self.token, px=self.lease_ms)
            except Exception as exc:  # the thread must outlive any failure: it is the lease
                state, error = 'error', exc
            # Redis may be back well within the lease (a Sentinel failover takes seconds):
            # after a failure, try again soon rather than a third of the lease later
            delay = self.interval if error is None else min(self.interval, RETRY_SECONDS)
            if self._stop.is_set():
                return
            try:
                self._loop.call_soon_threadsafe(self._report, state, error)
            except RuntimeError:  # the loop closed under us: the process is ending
                return


class Liveness:
    def __init__(
        self, store: RedisStore, replica_id: str, token: str, lease_seconds: float
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.token = token
        self.lease_ms = int(lease_seconds * 1000)

    async def join(self) -> None:
        """Take this replica's lease; clean up an earlier process that had the same id."""
        client = self.store.client
        own = keys.ReplicaKeys.of(self.replica_id)
        taken = await self.store.call(client.set(own.lease, self.token, nx=True, px=self.lease_ms))
        if not taken:
            raise RuntimeError(f'replica id {self.replica_id!r} is held by a live process')
        # an older replica's reaper (rolling upgrade) sees only the older lease key
        await self.store.call(client.set(keys.lease(self.replica_id), self.token, px=self.lease_ms))
        if await self.store.call(client.sismember(keys.REPLICAS, self.replica_id)):
            await self.reap(self.replica_id, locked=False)  # our own earlier incarnation
        elif self.store.commits is not None:  # one restarted within its lease left them
            await self.store.commits.complete(self.replica_id)
        # listed in the index first, then joined on its own slot (renew_lease.lua reads it)
        await self.store.call(client.sadd(keys.REPLICAS, self.replica_id))
        await self.store.call(client.set(own.joined, 1))

    async def leave(self) -> None:
        """Graceful exit: return whatever this replica still holds, so nothing is left to reap."""
        touched = await self._return_entries(
            self.replica_id, ReapReport(self.replica_id), failed=False
        )
        for address in touched:
            await self.store.watching.announce(address)
        client = self.store.client
        own = keys.ReplicaKeys.of(self.replica_id)
        await self.store.call(client.delete(own.joined))
        await self.store.call(client.srem(keys.REPLICAS, self.replica_id))
        await self.store.evalsha('release_clients', (keys.CLIENTS,), (self.replica_id,))
        for lease in (own.lease, keys.lease(self.replica_id)):
            if await self.store.call(client.get(lease)) == self.token.encode():
                await self.store.call(client.delete(lease))

    async def dead_replicas(self) -> list[str]:
        # an older replica of a rolling upgrade still lists subscriptions in the older SET
        if await self.store.call(self.store.client.exists(keys.SUBSCRIPTIONS)):
            await self.store.lay_out()
        leases = await self._leases()
        return [r for r, live in leases.items() if r != self.replica_id and not live]

    async def is_first_live(self) -> bool:
        """Whether this replica has the smallest id of the replicas holding a lease: the one
        that does cluster-wide chores nobody must do twice (records of idle entities)."""
        live = [r for r, held in (await self._leases()).items() if held and r != self.replica_id]
        return not live or self.replica_id < min(live)

    async def _leases(self) -> dict[str, bool]:
        leases: dict[str, bool] = await self.store.call(registered_leases(self.store.client))
        return leases

    async def reap(self, dead: str, *, locked: bool = True) -> ReapReport | None:
        """Clean up after ``dead``; None when another replica is already doing it."""
        client = self.store.client
        if locked:
            lock = keys.ReplicaKeys.of(dead).reaping
            if not await self.store.call(client.set(lock, self.token, nx=True, px=REAPING_LOCK_MS)):
                return None
            leases = (keys.ReplicaKeys.of(dead).lease, keys.lease(dead))
            if any([await self.store.call(client.exists(lease)) for lease in leases]):
                # renewed late between our look and our lock: alive, and now it sees the lock
                # (renew_lease.lua) only if it lapses again
                await self.store.call(client.delete(lock))
                return None
        report = ReapReport(dead)
        completed: set[str] = set()
        if self.store.commits is not None:  # its decided commits land before its entries return
            await self.store.commits.complete(dead, completed)
        touched = await self._return_entries(dead, report) | completed
        await self._remove_consumers(dead, report)
        report.clients_released = int(
            await self.store.evalsha('release_clients', (keys.CLIENTS,), (dead,))
        )
        await self.store.call(client.delete(keys.ReplicaKeys.of(dead).joined))
        await self.store.call(client.srem(keys.REPLICAS, dead))  # the index forgets it last
        for address in touched:
            await self.store.watching.announce(address)
        logger.warning(
            'replica %s is gone: %d in-flight entries returned, %d consumers removed, '
            '%d subscriptions deleted, %d ClientIDs released', dead, report.entries_returned,
            report.consumers_removed, report.subscriptions_deleted, report.clients_released,
        )  # fmt: skip
        return report

    async def _return_entries(
        self, dead: str, report: ReapReport, *, failed: bool = True
    ) -> set[str]:
        touched: set[str] = set()
        client = self.store.client
        cursor = 0
        while True:
            cursor, batch = await self.store.call(
                client.hscan(keys.ADDRESSES, cursor, count=ADDRESS_BATCH)
            )
            addresses = [as_text(raw) for raw in batch]
            found = await self._leave_addresses(addresses, dead)
            dropped = await self._drop_idle_groups(addresses, found, dead)
            for address, groups, done in zip(addresses, found, dropped, strict=True):
                if await self._return_address_entries(address, groups, dead, report, failed, done):
                    touched.add(address)
            if not cursor:
                return touched

    async def _leave_addresses(
        self, addresses: list[str], dead: str
    ) -> list[list[tuple[int, dict[str, Any]]]]:
        """Take ``dead`` out of the watchers of ``addresses`` and out of the sharing of their
        subscriptions other than its own private ones; return each address's groups (band, XINFO
        GROUPS row). Three pipelines for the lot, since every address is visited when a replica
        leaves or is reaped: a few round trips per address made ten thousand idle addresses
        take about 10 s, and so did reading all ten bands of each."""
        client = self.store.client
        bands = await self._unwatch_and_list_bands(addresses, dead)
        pipe = client.pipeline(transaction=False)
        for address, used in zip(addresses, bands, strict=True):
            k = keys.AddressKeys.of(address)
            for band in used:
                pipe.xinfo_groups(k.streams[band])
        replies = iter(await self.store.call(pipe.execute(raise_on_error=False)))
        found: list[list[tuple[int, dict[str, Any]]]] = []
        shares = client.pipeline(transaction=False)
        private_prefix = f'nd:{dead}:'
        shared: list[dict[str, Any]] = []
        for address, used in zip(addresses, bands, strict=True):
            k = keys.AddressKeys.of(address)
            groups = []
            named: set[str] = set()
            for band in used:
                for group in _groups_or_none(next(replies)):
                    groups.append((band, group))
                    name = as_text(group['name'])
                    if not name.startswith(private_prefix) and name not in named:
                        named.add(name)  # once per group, whichever bands it is read on
                        shares.hdel(k.shares(name), dead)  # out of the sharing
                        shares.exists(k.line(name))  # exclusive: has a line
                        shared.append(group)
            found.append(groups)
        if len(shares):
            answers = await self.store.call(shares.execute())
            for group, lined in zip(shared, answers[1::2], strict=True):
                group['lined'] = bool(lined)
        return found

    async def _drop_idle_groups(
        self, addresses: list[str], found: list[list[tuple[int, dict[str, Any]]]], dead: str
    ) -> list[dict[str, int]]:
        """``groups_drop.lua`` for each subscription of ``addresses`` with nothing pending on
        any band (no entry of ``dead``'s to return first), all in slices per primary, since
        every address is visited: one call at a time cost ten thousand idle addresses a round
        trip each. Each address's replies by subscription; a call that failed is left out, for
        ``_return_address_entries`` to make alone."""
        private_prefix = f'nd:{dead}:'
        wanted: list[tuple[int, str]] = []
        for i, groups in enumerate(found):
            busy = {as_text(g['name']) for _, g in groups if int(g['pending'])}
            names = {as_text(g['name']) for _, g in groups} - busy
            wanted += [(i, n) for n in sorted(names) if not n.startswith(private_prefix)]
        calls = [
            (drop_keys(addresses[i], name), (dead, keys.AddressKeys.of(addresses[i]).notify))
            for i, name in wanted
        ]
        replies = await self.store.upkeep.scripts_in_slices('groups_drop', calls)
        done: list[dict[str, int]] = [{} for _ in addresses]
        for (i, name), reply in zip(wanted, replies, strict=True):
            if not isinstance(reply, Exception):
                done[i][name] = int(reply)
        return done

    async def _unwatch_and_list_bands(self, addresses: list[str], dead: str) -> list[list[int]]:
        """Take ``dead`` out of the watchers of ``addresses``; return each one's bands that may
        hold entries: the default one and those in its levels SET (a band leaves it only once
        empty, trim.lua), so an address used at one priority costs one XINFO, not ten."""
        pipe = self.store.client.pipeline(transaction=False)
        for address in addresses:
            k = keys.AddressKeys.of(address)
            pipe.hdel(k.watchers, dead)  # nobody there to wake any more
            pipe.smembers(k.levels)
        replies = await self.store.call(pipe.execute(raise_on_error=False))
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply
        return [
            sorted({NORMAL_BAND, *(int(as_text(band)) for band in listed)})
            for listed in replies[1::2]
        ]

    async def _return_address_entries(
        self,
        address: str,
        groups: list[tuple[int, dict[str, Any]]],
        dead: str,
        report: ReapReport,
        failed: bool,
        dropped: dict[str, int],
    ) -> bool:
        """Delete the private subscriptions of ``dead`` on ``address`` and return its pending
        entries of the others (``_leave_addresses`` did the rest; ``dropped``: the subscriptions
        whose message groups ``_drop_idle_groups`` gave up already, with its replies)."""
        client = self.store.client
        k = keys.AddressKeys.of(address)
        moved_any = False
        private_prefix = f'nd:{dead}:'
        deleted: set[str] = set()
        emptied: list[tuple[int, str]] = []
        for band, group in groups:
            name = as_text(group['name'])
            if name.startswith(private_prefix):
                if name not in deleted:  # from every band at once
                    deleted.add(name)
                    await self.store.registry.delete_subscription(address, name)
                    report.subscriptions_deleted += 1
                continue
            if not int(group['pending']):
                continue
            moved = await self._reclaim(address, band, name, dead, failed)
            report.entries_returned += moved
            moved_any = moved_any or moved > 0
            emptied.append((band, name))
        for name in sorted({as_text(g['name']) for _, g in groups} - deleted):
            # after its entries are back: their groups' next owner starts with them
            given_up = dropped.get(name)
            if given_up is None:
                given_up = int(await self.store.evalsha(
                    'groups_drop', drop_keys(address, name), (dead, k.notify)
                ))  # fmt: skip
            if given_up >= 0:  # what other replicas parked for it meanwhile, claimed for it
                for band in {b for b, g in groups if as_text(g['name']) == name}:
                    moved = await self._reclaim(address, band, name, dead, failed)
                    report.entries_returned += moved
        for band, name in emptied:  # nothing is parked for it any more
            await self.store.call(client.xgroup_delconsumer(k.streams[band], name, dead))
        for name in sorted({as_text(g['name']) for _, g in groups if g.get('lined')}):
            # after its entries are back: the next in line starts with them
            if await self.store.evalsha('exclusive_reap', (k.line(name),), (dead, k.notify)):
                EXCLUSIVE_HANDOVERS.inc()
        return moved_any

    async def _reclaim(self, address: str, band: int, name: str, dead: str, failed: bool) -> int:
        """Return what ``dead`` holds of the subscription ``name`` on one band (``reclaim.lua``);
        an entry parked for its message groups counts no attempt: it never went out."""
        k = keys.AddressKeys.of(address)
        script_keys = (k.streams[band], k.returned(name), k.delivery_counts(name),
                       k.group_parked(name))  # fmt: skip
        backoff = self.store.redelivery.get(entity_field(address, name)).script_args
        total = 0
        while True:
            moved = int(await self.store.evalsha(
                'reclaim', script_keys, (name, dead, band, RECLAIM_BATCH, int(failed), *backoff)
            ))  # fmt: skip
            total += moved
            if moved < RECLAIM_BATCH:
                return total

    async def _remove_consumers(self, dead: str, report: ReapReport) -> None:
        client = self.store.client
        for subscription_id in await self.store.call(layout.subscription_ids(client)):
            k = keys.SubscriptionKeys.of(subscription_id)
            before = await self.store.call(client.hlen(k.consumers))
            reply: Any = await self.store.evalsha(
                'reap_consumers', (k.definition, k.consumers), (dead, subscription_id)
            )
            left, topic = int(reply[0]), as_text(reply[1])
            report.consumers_removed += max(0, int(before) - left)
            if topic:
                await layout.subscription_deleted(self.store.evalsha, subscription_id, reply[2])
                await self.store.registry.delete_subscription(topic, subscription_id)
                report.subscriptions_deleted += 1


def _groups_or_none(reply: Any) -> list[dict[str, Any]]:
    """XINFO GROUPS rows from a pipeline reply; none for a stream that does not exist."""
    if isinstance(reply, redis.ResponseError):
        if 'no such key' in str(reply).lower():
            return []
        raise reply
    return list(reply)
