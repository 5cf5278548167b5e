"""
The management API's reads and writes of Redis: pages of stored messages, their copy and
removal (the two steps of a move), purges, pause flags, and each replica's published
connections and command list.

Lives in ``store/`` because only this package knows Redis and the key layout; what the steps
mean (which messages a selector picks, where a retry goes) is ``management/``'s. Each script
touches one address's slot, so a move between addresses on different Redis Cluster slots is two
scripts: ``manage_copy.lua`` on the target writes the copies with a marker per source entry,
then ``manage_remove.lua`` on the source removes the originals, then the markers are forgotten.
A move interrupted anywhere (the replica killed) leaves every message at its source, its target,
or both, never neither; running it again copies nothing twice (the markers) and finishes the
removal.
"""

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.errors import StoreUnavailable
from shoal_broker.store import bodies, calls, connect, keys, scripts
from shoal_broker.store.registry import Registry
from shoal_broker.store.replicas import registered_leases

PAGE_SCAN_BOUND = 10_000
"""Entries one ``manage_page.lua`` call looks at, at most: bounds how long it holds Redis."""

CONTROL_TTL_SECONDS = 60
"""A command for a replica that never pops it (it died) expires with its list."""

_SCRIPTS = ('manage_page', 'manage_remove', 'manage_copy', 'manage_purge')


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as stored: where it is and its encoded sections."""

    band: int
    entry_id: str
    state: str
    """``ready`` (never delivered), ``returned`` (ready again) or ``in-flight`` (at a consumer)."""
    header: bytes
    rest: bytes
    expiry_ms: int
    origin: str
    """As the appending scripts take it: with the message group, if any, after a unit
    separator (``routing.storage.stored_origin``), so a copy keeps its group."""

    @property
    def id(self) -> str:
        """The management API's message id: ``<band>-<entry id>``."""
        return f'{self.band}-{self.entry_id}'


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    messages: list[StoredMessage]
    cursor: str | None
    """Where the next page starts (``<band>:<entry id>``); None after the last one."""


_BAND_NAMES = frozenset(str(band) for band in range(keys.BANDS))


def parse_message_id(message_id: str) -> tuple[int, str]:
    """(band, entry id) of a ``<band>-<ms>-<seq>`` message id; ValueError when it is not one."""
    band, _, entry = message_id.partition('-')
    ms, _, seq = entry.partition('-')
    if band not in _BAND_NAMES or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f'not a message id: {message_id!r} (expected <band>-<ms>-<seq>)')
    return int(band), f'{int(ms)}-{int(seq)}'


def parse_cursor(cursor: str | None) -> tuple[int, str]:
    """(band, last entry id read) of a page cursor; band 0 (priority 9) is read first, as
    consumers are served. ValueError when it is not a cursor."""
    if not cursor:
        return 0, '0-0'
    band, _, entry = cursor.partition(':')
    ms, _, seq = entry.partition('-')
    if band not in _BAND_NAMES or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f'not a page cursor: {cursor!r}')
    return int(band), f'{int(ms)}-{int(seq)}'


class StoreAdmin:
    """The management API's handle on the cluster's Redis (any mode). Redis failures become
    ``StoreUnavailable``."""

    def __init__(self, raw: 'redis.asyncio.Redis', registry: Registry) -> None:
        self._raw = raw
        self.registry = registry
        """Listings (``Inspector``) and subscription removal, on a client decoding text."""
        self._scripts = {name: raw.register_script(scripts.source(name)) for name in _SCRIPTS}

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 10.0) -> 'StoreAdmin':
        kwargs = {'socket_connect_timeout': timeout, 'socket_timeout': timeout}
        raw = connect.client_of_any_mode(url, decode_responses=False, **kwargs)
        text = connect.client_of_any_mode(url, decode_responses=True, **kwargs)
        return cls(raw, Registry(text))

    async def close(self) -> None:
        await self.registry.close()
        try:
            await connect.close(self._raw)
        except calls.REDIS_DOWN:
            pass

    # -- messages ---------------------------------------------------------------------------------

    async def page(self, address: str, group: str, cursor: str | None, count: int) -> Page:
        """Up to ``count`` messages of the group not consumed yet, after ``cursor``: band by
        band, priority 9 first, each oldest first; big ones with their bodies
        (``store/bodies.py``), so a move or a retry copies the whole message."""
        page = await self._page(address, group, cursor, count)
        ids = bodies.stubbed(page.messages)
        if not ids:
            return page
        k = keys.AddressKeys.of(address)
        found = await _call(self._raw.mget([k.body(stub_id) for stub_id in ids]))
        shown: list[StoredMessage] = []
        for message in page.messages:
            if bodies.is_stub(message.rest):
                body = found.pop(0)
                if body is None:  # its entry was deleted meanwhile
                    continue
                message = dataclasses.replace(message, rest=bytes(body))
            shown.append(message)
        return Page(shown, page.cursor)

    async def _page(self, address: str, group: str, cursor: str | None, count: int) -> Page:
        band, after = parse_cursor(cursor)
        k = keys.AddressKeys.of(address)
        found: list[StoredMessage] = []
        while True:
            reply = await self._run(
                'manage_page',
                (k.streams[band], k.returned(group)),
                (group, band, after, count - len(found), PAGE_SCAN_BOUND),
            )
            after, done = _text(reply[0]), _text(reply[1]) == '1'
            for i in range(2, len(reply), 6):
                id_, state, header, rest, expiry, origin = reply[i : i + 6]
                found.append(StoredMessage(
                    band, _text(id_), _text(state), bytes(header), bytes(rest),
                    int(expiry or 0), _text(origin),
                ))  # fmt: skip
            if not done and len(found) >= count:
                return Page(found, f'{band}:{after}')
            if not done:
                continue
            if band == keys.BANDS - 1:
                return Page(found, None)
            band, after = band + 1, '0-0'
            if len(found) >= count:
                return Page(found, f'{band}:0-0')

    async def remove(self, address: str, group: str, band: int, entry_ids: Sequence[str]) -> Any:
        """Remove entries no consumer holds: [removed, left in flight, missing]."""
        k = keys.AddressKeys.of(address)
        script_keys = (k.streams[band], k.returned(group), k.delivery_counts(group))
        reply = await self._run('manage_remove', script_keys, (group, band, *entry_ids))
        return [int(n) for n in reply]

    async def copy(
        self, target: str, kind: str, band: int, limit: int, marked: Sequence[tuple[str, Any]]
    ) -> list[int]:
        """Copy (marker, message) pairs onto ``target``; see ``lua/manage_copy.lua`` for the
        reply."""
        k = keys.AddressKeys.of(target)
        script_keys = (k.streams[band], k.groups, *k.streams, k.watchers, k.imports, k.levels)
        args: list[Any] = [kind, limit, k.notify]
        for marker, m in marked:
            args += [marker, m.header, m.rest, m.expiry_ms, m.origin]
        return [int(n) for n in await self._run('manage_copy', script_keys, args)]

    async def forget_markers(self, target: str, markers: Sequence[str]) -> None:
        if markers:
            await _call(self._raw.hdel(keys.AddressKeys.of(target).imports, *markers))

    async def purge(self, address: str, group: str) -> list[int]:
        """Consume every message of the group no consumer holds: [purged, left in flight]."""
        k = keys.AddressKeys.of(address)
        script_keys = (*k.streams, k.returned(group), k.delivery_counts(group))
        return [int(n) for n in await self._run('manage_purge', script_keys, (group,))]

    async def address_kind(self, address: str) -> str | None:
        """``queue`` or ``topic``; None when the address does not exist."""
        found = await _call(self._raw.hget(keys.ADDRESSES, address))
        return None if found is None else _text(found).partition(':')[0]

    async def subscription(self, subscription_id: str) -> dict[str, str]:
        """A named subscription's definition; empty when there is none."""
        found = await _call(self._raw.hgetall(keys.SubscriptionKeys.of(subscription_id).definition))
        return {_text(f): _text(v) for f, v in found.items()}

    async def recent_records(self, most: int) -> list[dict[str, str]]:
        """The newest ``most`` metric records of every replica (``keys.METRICS``), newest first."""
        found = await _call(self._raw.xrevrange(keys.METRICS, '+', '-', count=most))
        return [{_text(k): _text(v) for k, v in fields.items()} for _, fields in found]

    # -- pause flags ------------------------------------------------------------------------------

    async def paused(self) -> dict[str, dict[str, Any]]:
        """Paused entity (``queue:<address>``, ``subscription:<id>``) -> who paused it, when."""
        found = await _call(self._raw.hgetall(keys.PAUSED))
        return {_text(f): json.loads(v) for f, v in found.items()}

    async def pause(self, entity: str, user: str) -> None:
        record = json.dumps({'by': user, 'at': int(time.time() * 1000)})
        await _call(self._raw.hset(keys.PAUSED, entity, record))

    async def resume(self, entity: str) -> bool:
        return bool(await _call(self._raw.hdel(keys.PAUSED, entity)))

    # -- replicas ---------------------------------------------------------------------------------

    async def replicas(self) -> list[str]:
        return sorted(_text(r) for r in await _call(self._raw.smembers(keys.REPLICAS)))

    async def live_replicas(self) -> list[str]:
        """The registered replicas whose lease holds: one killed stays registered until a live
        replica reaps it, a few seconds after its lease lapsed."""
        leases = await _call(registered_leases(self._raw))
        return [replica for replica, held in leases.items() if held]

    async def publish_connections(self, replica_id: str, listed: str, ttl_seconds: int) -> None:
        key = keys.replica_connections(replica_id)
        await _call(self._raw.set(key, listed, ex=ttl_seconds))

    async def connections(self, replica_id: str) -> list[dict[str, Any]]:
        found = await _call(self._raw.get(keys.replica_connections(replica_id)))
        listed = json.loads(found) if found else []
        return listed if isinstance(listed, list) else []

    async def send_command(self, replica_id: str, command: str) -> None:
        key = keys.replica_control(replica_id)
        pipe = self._raw.pipeline(transaction=False)
        pipe.rpush(key, command)
        pipe.expire(key, CONTROL_TTL_SECONDS)
        await _call(pipe.execute())

    async def waiting_commands(self, replica_id: str, most: int = 100) -> list[str]:
        """The oldest commands left for a replica, left in place until ``commands_done``: an
        empty list then tells the sender they were carried out, not only read."""
        found = await _call(self._raw.lrange(keys.replica_control(replica_id), 0, most - 1))
        return [_text(c) for c in found]

    async def commands_done(self, replica_id: str, count: int) -> None:
        """Forget the ``count`` oldest commands (those pushed meanwhile stay, at the tail)."""
        await _call(self._raw.ltrim(keys.replica_control(replica_id), count, -1))

    async def unapplied(self, replicas: Sequence[str]) -> list[str]:
        """The replicas with commands still waiting."""
        return [r for r in replicas if await _call(self._raw.llen(keys.replica_control(r)))]

    async def _run(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        return await _call(self._scripts[name](keys=list(keys_), args=list(args)))


async def _call(awaitable: Any) -> Any:
    try:
        return await awaitable
    except calls.REDIS_DOWN as exc:
        raise StoreUnavailable(f'Redis unreachable: {calls.reason(exc)}') from exc
    except redis.exceptions.RedisError as exc:
        raise StoreUnavailable(f'Redis refused: {exc}') from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
