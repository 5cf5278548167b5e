"""
One TCP connection: bytes between an asyncio transport and a proton engine transport.

asyncio owns the socket; proton owns the AMQP state machine. A read goes straight into proton's
input buffer when it has room for a big frame, and otherwise into a buffer shared by every
connection, pushed into proton in slices (``pn_transport_push`` takes at most ``capacity()``;
amqp/_wire.c, amqp/engine.py's ``read_room``); ``process``
dispatches the engine's events to the node it serves (``Node``: the broker's switchboard), and
``flush`` ticks (heartbeats, idle timeout) and
then writes out everything proton has produced (all it has at once, until it has no more).
See reference/engine-spike.md §4 for the pitfalls this code is shaped by.

No exception escapes: a handler failure closes this connection with ``amqp:internal-error`` and
leaves every other connection alone.
"""

import asyncio
import dataclasses
import itertools
import logging
from typing import Any, Protocol, cast

from shoal_broker.amqp import engine
from shoal_broker.amqp.engine import Ptr, ffi, lib, wire
from shoal_broker.amqp.sasl import SaslHandshake
from shoal_broker.errors import BrokerError
from shoal_broker.security.authenticator import Identity

logger = logging.getLogger(__name__)

_ids = itertools.count(1)
_arrivals = itertools.count()

PN_DELIVERY = lib.PN_DELIVERY
_next_event = wire.shoal_next_event
ACCEPTS_CAP, ACCEPTS_FULL = engine.ACCEPTS_CAP, engine.ACCEPTS_FULL


@dataclasses.dataclass(eq=False, slots=True)
class LinkState:
    """What the broker remembers about one attached link (the kinds of link: ``links.py``)."""

    conn: 'AmqpConnection'
    ptr: Ptr
    name: str
    alive: bool = True
    opened: bool = False
    owned_temporary: str | None = None
    """A dynamic node created by this link, deleted when the link goes."""
    arrived: int = dataclasses.field(default_factory=_arrivals.__next__)
    """When the peer's attach came, as a rank among every link's: a subscription deals to its
    consumers in this order, oldest first (``LocalSubscription.add``), whichever attach the store
    answered first."""


class Gate:
    """``asyncio.Event``'s ``set``, ``is_set`` and ``wait``, set once and never cleared, with the
    Event (and its 760-byte waiter deque) made only if something waits before it is set: most
    connections' attaches come after the Open is answered, and memory per connection counts
    (docs/performance.md, "Memory per connection")."""

    __slots__ = ('_event', '_set')

    def __init__(self) -> None:
        self._set = False
        self._event: asyncio.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        if self._set:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()


class Door(Protocol):
    """What a connection asks of the broker's door (``guard.Guard``) as bytes come and go."""

    def connection_made(self, conn: 'AmqpConnection', socket: asyncio.BaseTransport) -> None: ...

    def handshake_input(self, conn: 'AmqpConnection', data: bytes) -> bytes: ...

    def connection_lost(self, conn: 'AmqpConnection') -> None: ...


class Node(Protocol):
    """What a connection hands its engine's events to (``broker.Broker``)."""

    @property
    def guard(self) -> Door: ...

    @property
    def max_frame_size(self) -> int: ...

    def connection_opened(self, conn: 'AmqpConnection') -> None: ...

    def connection_lost(self, conn: 'AmqpConnection') -> None: ...

    def on_accepts(self, conn: 'AmqpConnection', accepts: Ptr, count: int) -> None: ...

    def on_delivery(self, conn: 'AmqpConnection', delivery: Ptr, link: Ptr) -> None: ...

    def dispatch(self, conn: 'AmqpConnection', kind: int, event: Ptr) -> None: ...


class AmqpConnection(asyncio.BufferedProtocol):
    """The engine-side state of one peer connection."""

    def __init__(self, broker: Node) -> None:
        self.broker = broker
        self.id = next(_ids)
        self.peer = '?'
        self.alive = True
        self.links: dict[engine.Ptr, LinkState] = {}
        self.container_id: str | None = None
        self.opened = Gate()
        """Set once our Open is written (or refused): attaches wait for it. proton writes a
        Begin only after the Open, and never revisits a session opened before that."""
        self.pending_sessions: list[engine.Ptr] = []
        self.claimed_client: tuple[str, str] | None = None
        """(ClientID, holder) this connection holds cluster-wide, released when it ends."""
        self._socket: asyncio.Transport | None = None
        self._paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0.0
        self._loop = asyncio.get_running_loop()
        """Kept: Python 3.11's get_running_loop() makes a getpid() system call, per flush."""
        self._processing = False
        self._freed = False
        self._read_in_place = False
        """Whether the read under way goes straight into the engine (``get_buffer``)."""
        self.input_ended = False
        self.hang_up_when_flushed = False
        """The peer hung up (EOF or a dropped socket), as opposed to the engine refusing input."""
        t = self.transport = lib.pn_transport()
        lib.pn_transport_set_server(t)
        lib.pn_transport_set_max_frame(t, broker.max_frame_size)
        # SASL is ours (amqp/sasl.py, via amqp/guard.py): proton gets the bytes after it
        self.handshake: SaslHandshake | None = None
        self.identity: Identity | None = None
        self.refusal: BrokerError | None = None
        """Set when a limit refuses the connection: the peer's Open is answered with it."""
        self.counted = False
        self.connection = lib.pn_connection()
        self.collector = lib.pn_collector()
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_transport_bind(t, self.connection)

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._socket = cast(asyncio.Transport, transport)
        peer = self._socket.get_extra_info('peername')
        self.peer = f'{peer[0]}:{peer[1]}' if isinstance(peer, tuple) else str(peer)
        self.broker.guard.connection_made(self, transport)
        self.broker.connection_opened(self)
        self.process()

    def get_buffer(self, sizehint: int) -> Any:
        room = None
        if not self._freed and self.handshake is None:
            room = engine.read_room(self.transport)
        self._read_in_place = room is not None
        return engine.READ_BUFFER if room is None else room

    def buffer_updated(self, nbytes: int) -> None:
        if self._freed:
            return
        if self._read_in_place:
            wire.shoal_input_read(self.transport, nbytes)
        elif self.handshake is not None:
            data = self.broker.guard.handshake_input(self, engine.READ_BUFFER[0:nbytes])
            if not data:
                return
            # in slices of the engine's capacity; it takes less once its tail closed
            wire.shoal_push(self.transport, data, len(data))
        else:
            engine.push_read(self.transport, nbytes)
        self.process()

    def eof_received(self) -> bool | None:
        self._close_input()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_input()
        self.alive = False
        self.broker.guard.connection_lost(self)
        self.broker.connection_lost(self)
        self._free()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.process()

    # -- engine ----------------------------------------------------------------------------------

    def process(self) -> None:
        """Dispatch every pending engine event, then flush output. Never raises."""
        if self._freed or self._processing:
            return
        self._processing = True
        try:
            while True:
                self._dispatch_events()
                if not self._flush_output():
                    break
        finally:
            self._processing = False

    def _dispatch_events(self) -> None:
        collector, broker, slots = self.collector, self.broker, engine.EVENT_SLOTS
        accepts, taken = engine.ACCEPTS, engine.ACCEPTS_TAKEN
        pop = 0
        while True:
            kind = _next_event(collector, pop, slots, accepts, ACCEPTS_CAP, taken)
            subject, link = slots[0], slots[1]  # read before any handler runs: slots are shared
            try:
                if taken[0]:  # consumers' accepts settled on the way to this event: theirs first
                    broker.on_accepts(self, accepts, taken[0])
                if kind == PN_DELIVERY:  # a message in, or an outcome other than a plain accept
                    broker.on_delivery(self, subject, link)
                elif kind > 0:
                    broker.dispatch(self, kind, subject)
            except Exception:
                logger.exception('connection %d: handler failed; closing the connection', self.id)
                self.fail('amqp:internal-error', 'internal error')
            if not kind:
                return
            pop = 0 if kind == ACCEPTS_FULL else 1  # the event handled is popped by the next call

    def _flush_output(self) -> bool:
        """Tick, then write out what the engine produced. True if that posted new events."""
        t = self.transport
        now_ms = int(self._loop.time() * 1000)
        deadline = lib.pn_transport_tick(t, now_ms)  # before pending: the heartbeat goes out now
        if deadline:
            self._arm_timer(deadline / 1000.0)
        socket = self._socket
        while socket is not None and not self._paused:
            output = engine.take_output(t)
            if output is None:
                break
            socket.write(output)
        if lib.pn_collector_peek(self.collector) != ffi.NULL:
            return True
        pending = lib.pn_transport_pending(t)
        if socket is not None and (pending < 0 or (pending == 0 and self.hang_up_when_flushed)):
            socket.close()  # our Close went out (or the engine gave up): asyncio flushes first
        return False

    def write_now(self) -> None:
        """Write what the engine has to send now, its events left to the next ``process``:
        called from another connection's events, whose own walk goes on afterwards. Not while
        this connection is being processed: its walk writes at its end anyway."""
        socket = self._socket
        if self._freed or self._processing or self._paused or socket is None:
            return
        while (output := engine.take_output(self.transport)) is not None:
            socket.write(output)

    def _arm_timer(self, when: float) -> None:
        if self._timer is not None and self._timer_deadline <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_deadline = when
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.process()

    def _close_input(self) -> None:
        # once: the end of input (EOF) is followed by the socket's loss, and a second close of
        # the engine's tail raises its transport error (and our log line) again
        if self._freed or self.input_ended:
            return
        self.input_ended = True
        lib.pn_transport_close_tail(self.transport)
        lib.pn_transport_close_head(self.transport)
        self.process()

    def fail(self, condition: str, description: str) -> None:
        """Close the whole connection with an error (the peer sees it in the Close frame)."""
        c = self.connection
        if lib.pn_connection_state(c) & lib.PN_LOCAL_CLOSED:
            return
        engine.set_condition(lib.pn_connection_condition(c), condition, description)
        if lib.pn_connection_state(c) & lib.PN_LOCAL_UNINIT:
            lib.pn_connection_open(c)
        lib.pn_connection_close(c)

    def write_raw(self, data: bytes) -> None:
        """Bytes from outside proton (the SASL layer), written before anything proton makes."""
        if self._socket is not None:
            self._socket.write(data)

    def hang_up(self) -> None:
        """Close the socket once what was written has gone out."""
        if self._socket is not None:
            self._socket.close()

    def abort(self) -> None:
        """Drop the socket without ceremony."""
        if self._socket is not None:
            self._socket.abort()

    def _free(self) -> None:
        if self._freed:
            return
        self._freed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # order from the spike: unbind, release (frees sessions and links), then the references
        lib.pn_transport_unbind(self.transport)
        lib.pn_connection_release(self.connection)
        lib.pn_decref(self.connection)
        lib.pn_decref(self.transport)
        lib.pn_collector_free(self.collector)
        self.links.clear()
