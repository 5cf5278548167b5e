"""
Big message bodies kept out of Redis's Lua (docs/performance.md#big-bodies).

A Lua script that takes a 1 MiB argument cost Redis 5.9 ms against 2.3 ms for the same ``XADD``
sent plainly: the argument is copied into a Lua string, then into the stream, and a fetch copies
each entry it reads into Lua and out again. So a message whose bytes after the header reach
``SHOAL_BIG_MESSAGE_BYTES`` is stored in two parts: its bytes under a key of their own
(``keys.AddressKeys.body``, the address's slot), written by a plain ``SET`` in one ``MULTI`` with
the publish script; and a stream entry like any other whose rest is the stub: byte 254, then the
stub id. A stored rest otherwise always starts with a described section (byte 0) or is empty
(``amqp/codec.parse``), so a stub is never mistaken for a message. A STRING, not a field of one
HASH per address: Redis keeps a big ``SET``'s argument as it read it, where ``HSET`` copies it
(1 MiB: 4 µs against 646 µs). The publish script indexes the entry (``lua/append_entries.lua``)
and deletes the bodies of messages it refuses; a trim returns the index members of the entries
it removed (``lua/bodies_due.lua``), whose bodies the upkeep deletes. Whoever reads entries (a
fetch, a claim's read ahead, a browse, the management API) puts the bodies back with one ``MGET``
more, only when a stub is among them. A body this replica wrote or read lately is kept in memory
(``RecentBodies``), and reading it back asks Redis only whether it is still there.
"""

import collections
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from shoal_broker.errors import BrokerError
from shoal_broker.routing.storage import Entry, Fetched
from shoal_broker.store import keys
from shoal_broker.store.lane import BULK_HEADS, CRLF, Encoded
from shoal_broker.store.ops import Op, refusal

STUB = b'\xfe'
"""The first byte of a stub (254): never the first byte of a stored rest."""


class HasRest(Protocol):
    @property
    def rest(self) -> bytes: ...


def is_stub(rest: bytes) -> bool:
    return rest[:1] == STUB


def new_stub() -> tuple[bytes, str]:
    """A stub and its id."""
    stub_id = uuid.uuid4().hex
    return STUB + stub_id.encode(), stub_id


def body_command(address: str, stub_id: str, rest: bytes) -> tuple[Any, ...]:
    """The ``SET`` of a body, the body encoded as it goes (``lane.Encoded``): packed by hiredis,
    a 1 MiB argument was copied three times, 8 % of the broker's CPU at 1 MiB a message. Its
    pipeline goes to the socket in pieces (``apart``), the body as it is."""
    body = Encoded([BULK_HEADS[len(rest)], rest, CRLF], 1, apart=True)
    return ('SET', keys.AddressKeys.of(address).body(stub_id), body)


def body_keys(commands: list[tuple[Any, ...]]) -> list[str]:
    """The keys ``body_command``s write: the publish script's last KEYS."""
    return [command[1] for command in commands]


RECENT_BODY_BYTES = 32 * 1024 * 1024
"""Bytes of big bodies a replica keeps after writing or reading them (``RecentBodies``)."""


class RecentBodies:
    """The big bodies this replica wrote (its publishes) or read (another subscription's fetch)
    lately, by stub id, oldest dropped first past ``limit`` bytes. A body is never changed once
    written, so one kept here is the one Redis holds while Redis still holds it: a fetch of it
    then asks only that (``EXISTS``), and the body does not cross from Redis and through the
    reply parser again (docs/performance.md#recent-bodies)."""

    def __init__(self, limit: int = RECENT_BODY_BYTES) -> None:
        self.limit = limit
        self._bodies: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._bytes = 0
        self.addresses: set[str] = set()
        """The addresses whose big bodies this replica wrote or read (``body_trims.py``)."""

    def keep(self, stub_id: str, body: bytes, address: str) -> None:
        self.addresses.add(address)
        if len(body) > self.limit or stub_id in self._bodies:
            return
        self._bodies[stub_id] = body
        self._bytes += len(body)
        while self._bytes > self.limit:
            self._bytes -= len(self._bodies.popitem(last=False)[1])

    def get(self, stub_id: str) -> bytes | None:
        return self._bodies.get(stub_id)

    def __len__(self) -> int:
        return len(self._bodies)


def reading(
    address: str, ids: list[str], recent: RecentBodies | None = None
) -> tuple[list[tuple[Any, ...]], Callable[[list[Any]], list[Any]]]:
    """The commands that put back the bodies of stub ids ``ids`` (one slot: the address's), and
    what makes their replies the bodies in ``ids`` order (None: gone). A body ``recent`` holds
    costs an ``EXISTS``; the others one ``MGET``, and are kept in ``recent`` as they come."""
    k = keys.AddressKeys.of(address)
    known = [recent.get(stub_id) for stub_id in ids] if recent is not None else [None] * len(ids)
    missing = [stub_id for stub_id, body in zip(ids, known, strict=True) if body is None]
    commands: list[tuple[Any, ...]] = [
        ('EXISTS', k.body(stub_id))
        for stub_id, body in zip(ids, known, strict=True)
        if body is not None
    ]
    if missing:
        commands.append(('MGET', *(k.body(stub_id) for stub_id in missing)))

    def bodies(replies: list[Any]) -> list[Any]:
        checked, read = iter(replies), iter(replies[-1] if missing else ())
        found: list[Any] = []
        for stub_id, body in zip(ids, known, strict=True):
            if body is None:
                body = next(read)
                if body is not None and recent is not None:
                    recent.keep(stub_id, body, address)
            elif not next(checked):  # deleted with its entry meanwhile
                body = None
            found.append(body)
        return found

    return commands, bodies


def due_keys(index: str, members: list[Any]) -> list[str]:
    """The body keys of index members (``lua/bodies_due.lua``), from the index's key."""
    tag = index[: -len(':bodies')]
    return [f'{tag}:body:{_text(member)[MEMBER_ID_AT:]}' for member in members]


MEMBER_ID_AT = len('5|000000000000000-0000000000|')
"""Where the stub id starts in an index member."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def in_multi(commands: list[tuple[Any, ...]], bodies: list[tuple[Any, ...]]) -> list[Any]:
    """A publish unit's commands with its bodies' ``SET``s, in one ``MULTI``: a stub is never
    stored without its body, nor a body left by a script that failed to run."""
    if not bodies:
        return commands
    return [('MULTI',), *bodies, *commands, ('EXEC',)]


def with_bodies(
    members: Sequence[Op], script: str, script_keys: tuple[str, ...], args: tuple[Any, ...]
) -> list[Any]:
    """A publishing script's command (``EVAL``, by source) for merged ops ``members``, with the
    bodies of their big messages: the bodies' keys last among its KEYS (the script deletes them
    if it refuses the messages), their ``SET``s ahead of it in one ``MULTI``."""
    bodies = [body for op in members for body in op.commands]
    every_key = (*script_keys, *body_keys(bodies))
    return in_multi([('EVAL', script, len(every_key), *every_key, *args)], bodies)


def script_replies(replies: list[Any]) -> list[Any]:
    """The replies of a publish unit's commands as ``in_multi`` left them: the script's last,
    out of the ``EXEC`` when there was a ``MULTI`` (a unit without one has one reply)."""
    if len(replies) == 1:
        return replies
    executed = replies[-1]
    if isinstance(executed, Exception):  # EXECABORT: a command was refused as it was queued
        raise refusal(next((r for r in replies if isinstance(r, Exception)), executed))
    for reply in executed:
        if isinstance(reply, Exception):
            raise refusal(reply)
    return [executed[-1]]


def stubbed(entries: Sequence[HasRest]) -> list[str]:
    """The stub ids among ``entries``' rests."""
    return [e.rest[1:].decode() for e in entries if e.rest[:1] == STUB]


def fill(entries: Sequence[Entry], bodies: Sequence[Any]) -> list[int]:
    """Put ``bodies`` (an ``MGET``'s reply, in ``stubbed`` order) in place of the stubs;
    returns the positions of the entries whose body was gone (deleted with their entry)."""
    gone: list[int] = []
    found = iter(bodies)
    for i, entry in enumerate(entries):
        if entry.rest[:1] == STUB:
            body = next(found)
            if body is None:
                gone.append(i)
            else:
                entry.rest = bytes(body)
    return gone


Queue = Callable[..., Any]


def resolving(
    address: str,
    queue: Queue,
    callback: Callable[[Any, BrokerError | None], None],
    entries_of: Callable[[Any], list[Entry]] = lambda result: list(result or ()),
    recent: RecentBodies | None = None,
) -> Callable[[Any, BrokerError | None], None]:
    """``callback`` of a store op whose result holds entries (``entries_of``): called at once
    when none is a stub, else once the reads ``reading`` makes, queued with ``queue``
    (``Cycles.queue``), put their bodies back. An entry whose body is gone was deleted meanwhile
    (a move, a trim after a purge) and is left out."""

    def answered(result: Any, error: BrokerError | None) -> None:
        entries = entries_of(result) if error is None else []
        ids = stubbed(entries)
        if not ids:
            callback(result, error)
            return
        commands, bodies = reading(address, ids, recent)

        def finish(replies: list[Any]) -> Any:
            gone = {id(entries[i]) for i in fill(entries, bodies(replies))}
            for held in (result, entries):
                if gone and isinstance(held, list):
                    held[:] = [entry for entry in held if id(entry) not in gone]
            return result

        future = queue(commands, finish)
        future.add_done_callback(lambda f: _answer(f, callback))

    return answered


def _answer(future: Any, callback: Callable[[Any, BrokerError | None], None]) -> None:
    if future.cancelled():
        return
    error = future.exception()
    if error is not None:
        callback(None, error)
    else:
        callback(future.result(), None)


async def put_back(
    address: str, queue: Queue, entries: list[Any], recent: RecentBodies | None = None
) -> list[Any]:
    """``entries`` with their bodies back (``resolving``, awaited): those whose body is gone
    are left out."""
    ids = stubbed(entries)
    if not ids:
        return entries
    commands, bodies = reading(address, ids, recent)
    gone = set(fill(entries, await queue(commands, bodies)))
    return [entry for i, entry in enumerate(entries) if i not in gone]


async def fetched_with_bodies(
    address: str, queue: Queue, fetched: Awaitable[Fetched], recent: RecentBodies | None = None
) -> Fetched:
    """A fetch's entries (``Messages.fetch``), with their bodies back."""
    found = await fetched
    found[:] = await put_back(address, queue, found, recent)
    return found


async def page_with_bodies(
    address: str, queue: Queue, page: Awaitable[tuple[list[Entry], Any]]
) -> tuple[list[Entry], Any]:
    """A browse's page (``Messages.browse``), with its entries' bodies back."""
    entries, cursor = await page
    return await put_back(address, queue, entries), cursor
