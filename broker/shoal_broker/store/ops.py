"""
An op: commands queued for the next pipeline (``cycles.py``) and what settles it from their
replies. The message operations (``messages.py``) make ops; the cycles send and settle them.

Ops with the same ``batch`` key are merged into one command per cycle (a publish script for all
messages to one address and band, one XACK for all acks of one group), and one callback answers
them all (``Tokens``), so the cost per message stays a few list appends.
"""

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis.exceptions

from shoal_broker.errors import BrokerError, StoreFull, StoreUnavailable, StoreUnconfirmed
from shoal_broker.routing.storage import ClaimCallback, PublishCallback
from shoal_broker.store.calls import reason
from shoal_broker.store.lane import Encoded

logger = logging.getLogger(__name__)

PARTS_PER_MESSAGE = 7
"""A published message's script arguments as encoded parts: the header's bulk-string head,
the header, CRLF, the same three for the rest, and the expiry and origin, encoded together."""

WRITES = ('publish', 'claim', 'unique', 'last')
"""Batched ops that append messages: a replicated durability waits for them, and fails them
unconfirmed."""


@dataclasses.dataclass(slots=True, eq=False)
class Op:
    """Commands queued for the next pipeline and what to do with their replies. Equal only to
    itself: ops are found in the queue by identity (``Releasing._ahead_of_fetch``)."""

    commands: list[tuple[Any, ...]]
    finish: Callable[[list[Any]], Any]
    future: asyncio.Future[Any] | None
    """Resolved with the outcome; None when ``callback`` gets it instead."""
    notify: str | None = None
    """Address to announce to other replicas once the commands succeeded."""
    notify_local: bool = False
    """Also wake this replica's own consumers of ``notify`` (returned entries)."""
    batch: tuple[Any, ...] | None = None
    """Ops with the same key are merged into one command per cycle (publish, ack)."""
    batch_args: Sequence[Any] = ()
    callback: Callable[[Any, BrokerError | None], None] | None = None
    """Called with (result, None) or (None, error) as the replies are read: a future and its
    scheduled callback cost ~4 µs per message (``publish_then``)."""
    answered: bool = False
    confirmed: bool = False
    """A fetch: in ``replicated`` durability its pipeline waits for a replica, so that what it
    claims is on the replica before a consumer gets it (docs/performance.md#durable-fetches).
    Not confirmed in time, the entries are delivered all the same: consumers do not stall while
    the primary has no replica."""
    unconfirmed: bool = False
    """A ``confirmed`` op whose pipeline's WAIT timed out (``confirming.py``)."""
    durable: bool = False
    """An ack in ``replicated`` durability (``acks.py``): its pipeline waits for a replica, and
    one not confirmed in time is answered ``StoreUnconfirmed`` (then sent again)."""
    carrier: int = 0
    """The socket (``Lane.serial``) whose pipeline answered the op, in ``replicated``
    durability: a fetch's or a write's confirmation counts on that socket only."""
    fetches: tuple[str, str] | None = None
    """A fetch's (address, group): a consumer's give-back of that subscription queued while the
    fetch waits for its cycle goes ahead of it (``releasing.py``)."""

    def done(self) -> bool:
        return self.answered or (self.future is not None and self.future.done())

    def resolve(self, value: Any) -> None:
        self.answered = True
        if self.callback is not None:
            try:  # call_back written out: this runs once per message
                self.callback(value, None)
            except Exception:
                logger.exception('store callback failed')
        elif self.future is not None:
            self.future.set_result(value)

    def reject(self, error: BrokerError) -> None:
        self.answered = True
        if self.callback is not None:
            call_back(self.callback, None, error)
        elif self.future is not None:
            self.future.set_exception(error)


Unit = tuple[list[tuple[Any, ...]], list[Op]]
"""Commands sent together and the ops their replies belong to."""


class Tokens:
    """The tokens of the messages batched into one publish op, in their order, and the one
    callback that answers them all: one op per address and band per cycle, not one per message
    (an op, its finisher and its settling were ~2 µs per message; a callback per message ~1 µs)."""

    __slots__ = ('args', 'callback', 'commands', 'tokens')

    def __init__(
        self, callback: PublishCallback[Any] | ClaimCallback[Any], token: Any, args: list[Any]
    ) -> None:
        self.callback = callback
        self.tokens = [token]
        self.args = args
        """The op's ``batch_args``: each message's four script arguments (header, rest, expiry
        and origin), encoded as PARTS_PER_MESSAGE parts (``Messages._encoded``)."""
        self.commands: list[tuple[Any, ...]] = []
        """The op's ``commands``: the bodies of its big messages (``store/bodies.py``)."""

    def __call__(self, value: Any, error: BrokerError | None) -> None:
        self.callback(self.tokens, value, error)


def call_back(callback: Callable[[Any, BrokerError | None], None], value: Any,
              error: BrokerError | None) -> None:  # fmt: skip
    try:
        callback(value, error)
    except Exception:  # like an asyncio callback: logged, and the other ops still settle
        logger.exception('store callback failed')


def no_result(replies: list[Any]) -> None:
    return None


def settle(op: Op, replies: list[Any]) -> None:
    """Settle an op whose commands all succeeded: with its result, or its finisher's error."""
    if op.done():
        return
    try:
        result = op.finish(replies)
    except BrokerError as exc:
        fail(op, exc)
    except Exception as exc:  # a reply of an unexpected shape: fail this op, not the cycle
        logger.exception('unexpected Redis reply')
        fail(op, StoreUnavailable(f'unexpected Redis reply: {exc}'))
    else:
        op.resolve(result)


def fail(op: Op, error: BrokerError) -> None:
    """Fail an op. Acks and releases are fire-and-forget for the broker: mark the exception
    seen (the entry stays pending and is redelivered; the failure is logged) so asyncio does not
    complain about an exception nobody retrieved; an awaiting caller still gets it."""
    op.reject(error)
    if (op.batch is not None and op.batch[0] == 'ack') or op.notify_local:
        logger.debug('store operation failed: %s', error)
        if op.future is not None:
            op.future.exception()


def refusal(error: Exception) -> BrokerError:
    """What an error reply means to the op whose command got it (a new one per op: one exception
    raised in several awaiting tasks would collect all their tracebacks)."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return StoreFull('the message store is full (Redis maxmemory reached)')
    return StoreUnavailable(f'Redis refused: {error}')


def unreachable(ops: list[Op], exc: BaseException) -> None:
    text = reason(exc)
    logger.warning('Redis unreachable: %s', text)
    for op in ops:
        if not op.done():
            fail(op, StoreUnavailable(f'Redis unreachable: {text}'))


def carried(ops: Iterable[Op], serial: int) -> None:
    """Note the socket that answered the ops a replica is to confirm (``Op.carrier``)."""
    for op in ops:
        op.carrier = serial


def unconfirmed(ops: list[Op], defer: Callable[[list[Op]], None] | None = None) -> None:
    """Ops of a pipeline whose ``WAIT`` timed out, before their replies settle them: a fetch's
    entries wait for a replica (``confirming.py``); messages written are never accepted
    unconfirmed, but wait for a replica in ``defer`` (``Confirming.defer_writes``), or fail
    without it; durable acks fail, to be sent again."""
    writes: list[Op] = []
    for op in ops:
        op.unconfirmed = op.confirmed
        if op.done():
            continue
        if op.batch is not None and op.batch[0] in WRITES and defer is not None:
            writes.append(op)
        elif (op.batch is not None and op.batch[0] in WRITES) or op.durable:
            fail(op, StoreUnconfirmed('no Redis replica confirmed the write in time'))
    if writes and defer is not None:
        defer(writes)


UNIQUE_PARTS_PER_MESSAGE = PARTS_PER_MESSAGE + 1
"""A message checked for duplicates: its ``PARTS_PER_MESSAGE``, then its id encoded."""


def quintuples(members: list[Op]) -> Encoded:
    """The merged publish ops of an address with duplicate detection as publish_unique.lua's
    quintuples (the four of publish.lua, then the id), in order."""
    parts = [part for op in members for part in op.batch_args]
    return Encoded(parts, len(parts) // UNIQUE_PARTS_PER_MESSAGE * 5)


def quadruples(members: list[Op]) -> Encoded:
    """The merged publish (or claim) ops' messages as the script's quadruples, in order."""
    parts = [part for op in members for part in op.batch_args]
    return Encoded(parts, len(parts) // PARTS_PER_MESSAGE * 4)


def is_noscript(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.NoScriptError) or (
        isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith('NOSCRIPT')
    )
