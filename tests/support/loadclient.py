"""
A bounded many-link client on proton's Container, for tests that need concurrency (several
consumers on several brokers at once). Counts what each consumer got; never asserts itself.
"""

import collections
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from proton import Endpoint, Message, byte, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption


class CompetingRun(MessagingHandler):  # type: ignore[misc]
    def __init__(
        self, producer_url: str, consumer_urls: list[str], address: str, count: int,
        timeout: float, credit: int = 100,
    ) -> None:  # fmt: skip
        super().__init__(prefetch=credit, auto_accept=True)
        self.producer_url, self.consumer_urls = producer_url, consumer_urls
        self.address, self.count, self.timeout = address, count, timeout
        self.sent = 0
        self.confirmed = 0
        self.received: dict[int, list[int]] = {i: [] for i in range(len(consumer_urls))}
        self._receivers: dict[Any, int] = {}
        self._connections: list[Any] = []
        self.timed_out = False
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        container = event.container
        for i, url in enumerate(self.consumer_urls):
            conn = container.connect(url)
            self._connections.append(conn)
            self._receivers[container.create_receiver(conn, self.address, name=f'c{i}')] = i
        conn = container.connect(self.producer_url)
        self._connections.append(conn)
        container.create_sender(conn, self.address, name='producer')
        self._timer = container.schedule(self.timeout, self)

    def on_timer_task(self, event: Any) -> None:
        self.timed_out = True
        self._stop()

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body=self.sent))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        self._stop_when_done()

    def on_message(self, event: Any) -> None:
        self.received[self._receivers[event.receiver]].append(event.message.body)
        self._stop_when_done()

    def _stop_when_done(self) -> None:
        done = sum(len(v) for v in self.received.values()) >= self.count
        if done and self.confirmed >= self.count:
            self._stop()

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()  # a pending timer would keep the container running
            self._timer = None
        for conn in self._connections:
            conn.close()
        self._connections = []

    def run(self) -> 'CompetingRun':
        container = Container(self)
        thread = threading.Thread(target=container.run, daemon=True)
        thread.start()
        thread.join(self.timeout + 10)
        return self


def settle_time(seconds: float = 0.5) -> None:
    time.sleep(seconds)


# -- additions: several producers and consumers with their own connections and link options -------


@dataclasses.dataclass
class ConsumerSpec:
    """One consumer on its own connection: the link name and options decide what it attaches to
    (e.g. a Qpid JMS shared subscription), ``credit`` is kept topped up as messages are settled."""

    url: str
    address: str
    link_name: str
    options: list[LinkOption] = dataclasses.field(default_factory=list)
    credit: int = 10
    container_id: str | None = None
    """None: a generated ``ID:<uuid>:1`` container-id, as Qpid JMS has without a ClientID."""
    desired_capabilities: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ProducerSpec:
    url: str
    address: str
    count: int
    options: list[LinkOption] = dataclasses.field(default_factory=list)


class MultiRun(MessagingHandler):  # type: ignore[misc]
    """Producers and consumers on their own connections in one Container thread.

    Producers start once every consumer link is attached (topic subscribers only get what is
    published after they exist). Producer ``p`` sends bodies ``'<p>:<n>'``. Each consumer
    accepts every message and returns one credit per message, so its credit stays at
    ``credit``. Stops when everything sent is confirmed and as many messages were received,
    on the first link or connection error, or at ``timeout``. Counts; never asserts.
    """

    def __init__(
        self,
        producers: list[ProducerSpec],
        consumers: list[ConsumerSpec],
        timeout: float,
        linger: float = 0.5,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.producers, self.consumers, self.timeout = producers, consumers, timeout
        self.linger = linger
        """Seconds to keep consuming after everything arrived, so late duplicates are seen."""
        self._lingering = False
        self.total = sum(p.count for p in producers)
        self.received: list[list[str]] = [[] for _ in consumers]
        self.sent = [0 for _ in producers]
        self.confirmed = 0
        self.not_accepted = 0
        self.errors: list[str] = []
        self.timed_out = False
        self.elapsed = 0.0
        self._receivers: dict[Any, int] = {}
        self._consumer_connections: dict[Any, int] = {}
        self._senders: dict[Any, int] = {}
        self._opened = 0
        self._connections: list[Any] = []
        self._container: Any = None
        self._timer: Any = None
        self._started = 0.0

    def on_start(self, event: Any) -> None:
        self._container = event.container
        self._started = time.monotonic()
        for i, spec in enumerate(self.consumers):
            conn = self._container.connect(
                spec.url,
                container_id=spec.container_id or f'ID:{uuid.uuid4()}:1',
                desired_capabilities=[symbol(c) for c in spec.desired_capabilities] or None,
            )
            self._connections.append(conn)
            self._consumer_connections[conn] = i
        self._timer = self._container.schedule(self.timeout, self)
        if not self.consumers:
            self._start_producers()

    def on_connection_opened(self, event: Any) -> None:
        # like Qpid JMS, attach only once the broker's Open has arrived
        i = self._consumer_connections.pop(event.connection, None)
        if i is None:
            return
        spec = self.consumers[i]
        rcv = self._container.create_receiver(
            event.connection, spec.address, name=spec.link_name, options=spec.options or None
        )
        self._receivers[rcv] = i

    def on_link_opened(self, event: Any) -> None:
        index = self._receivers.get(event.receiver) if event.receiver else None
        if index is None:
            return
        event.receiver.flow(self.consumers[index].credit)
        self._opened += 1
        if self._opened == len(self.consumers):
            self._start_producers()

    def _start_producers(self) -> None:
        for i, spec in enumerate(self.producers):
            conn = self._container.connect(spec.url)
            self._connections.append(conn)
            snd = self._container.create_sender(
                conn, spec.address, name=f'producer-{i}', options=spec.options or None
            )
            self._senders[snd] = i

    def on_sendable(self, event: Any) -> None:
        i = self._senders.get(event.sender)
        if i is None:
            return
        spec = self.producers[i]
        while event.sender.credit and self.sent[i] < spec.count:
            event.sender.send(Message(body=f'{i}:{self.sent[i]}'))
            self.sent[i] += 1

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        self._stop_when_done()

    def on_rejected(self, event: Any) -> None:
        self.not_accepted += 1
        self._stop_when_done()

    def on_released(self, event: Any) -> None:
        self.not_accepted += 1
        self._stop_when_done()

    def on_message(self, event: Any) -> None:
        self.received[self._receivers[event.receiver]].append(event.message.body)
        self.accept(event.delivery)
        event.receiver.flow(1)
        self._stop_when_done()

    def on_link_error(self, event: Any) -> None:
        condition = event.link.remote_condition
        self.errors.append(f'link {event.link.name}: {condition}')
        self._stop()

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f'connection: {event.connection.remote_condition}')
        self._stop()

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f'transport: {event.transport.condition}')
        self._stop()

    def on_timer_task(self, event: Any) -> None:
        self.timed_out = not self._lingering
        self._stop()

    def _stop_when_done(self) -> None:
        settled = self.confirmed + self.not_accepted
        done = settled >= self.total and sum(len(r) for r in self.received) >= self.confirmed
        if done and not self._lingering:
            self._lingering = True
            self.elapsed = time.monotonic() - self._started
            self._container.schedule(self.linger, _Call(self._stop))

    def _stop(self) -> None:
        if not self.elapsed:
            self.elapsed = time.monotonic() - self._started
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for conn in self._connections:
            conn.close()
        self._connections = []

    def run(self) -> 'MultiRun':
        container = Container(self)
        thread = threading.Thread(target=container.run, daemon=True)
        thread.start()
        thread.join(self.timeout + 10)
        return self


class _Call:
    """A Container timer target that calls a function."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def on_timer_task(self, event: Any) -> None:
        self.function()


# -- additions: a load that survives broker and Redis failures (tests/chaos) ----------------------


@dataclasses.dataclass
class ChaosProducer:
    """One producer sending each of ``bodies`` once, as a durable message.

    ``urls`` is its failover list: after losing its connection it reconnects to the next one and
    goes on with the bodies not sent yet. Sends unsettled when the connection went are *in doubt*
    (stored or not: the broker's answer never came) and are not sent again; released ones (the
    broker could not store them) are sent again after ``resend_delay``.
    """

    urls: list[str]
    address: str | None
    bodies: Sequence[Any]
    route: Callable[[Any], tuple[str, int | None]] | None = None
    """With the anonymous relay (``address`` None): each body's ``to`` and x-opt-jms-dest."""
    resend_released: bool = True
    message_ids: bool = False
    """Give each body a message-id of its own, the same when it is sent again (what duplicate
    detection compares)."""
    window: int | None = None
    """At most this many sends unanswered at a time; 1 is a synchronous producer, as Qpid JMS
    sends a persistent message outside a transaction (waiting for each outcome)."""


@dataclasses.dataclass
class ChaosConsumer:
    """One consumer on its own connection; reconnects to the next of ``urls`` when it loses it.
    Accepts each message on receipt and returns one credit per message."""

    urls: list[str]
    address: str
    link_name: str
    options: list[LinkOption] = dataclasses.field(default_factory=list)
    credit: int = 20
    cycle_after: int | None = None
    """A consumer that comes and goes: close the connection after this many messages on it,
    then connect again."""


@dataclasses.dataclass(frozen=True, slots=True)
class Receipt:
    body: Any
    consumer: int
    url: str
    """The broker that delivered it."""
    delivery_count: int
    at: float
    """time.monotonic() when it arrived."""
    address: str | None = None
    """The message's ``to``."""


@dataclasses.dataclass(eq=False)
class _Slot:
    role: str  # 'producer' or 'consumer'
    index: int
    urls: list[str]
    url_index: int = 0
    url: str = ''
    connection: Any = None
    link: Any = None
    reconnect_at: float | None = None
    unsettled: dict[Any, Any] = dataclasses.field(default_factory=dict)
    sent_at: dict[Any, float] = dataclasses.field(default_factory=dict)
    resend: collections.deque[tuple[float, Any]] = dataclasses.field(
        default_factory=collections.deque
    )
    next_body: int = 0
    generation: int = 0
    received_here: int = 0


class ChaosRun(MessagingHandler):  # type: ignore[misc]
    """Producers and consumers that outlive broker kills, restarts and Redis outages.

    Runs in its own thread (``start``/``stop``); the test thread watches the counters, breaks
    things, and decides when to stop. Bodies must be unique across producers. Counts; never
    asserts. ``accepted`` holds exactly the bodies the broker answered ``accepted``.
    """

    TICK = 0.05

    def __init__(
        self,
        producers: list[ChaosProducer],
        consumers: list[ChaosConsumer],
        *,
        timeout: float,
        reconnect_delay: float = 0.25,
        resend_delay: float = 0.2,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.producers, self.consumers = producers, consumers
        self.timeout, self.reconnect_delay, self.resend_delay = (
            timeout, reconnect_delay, resend_delay,
        )  # fmt: skip
        self.accepted: set[Any] = set()
        self.accepted_order: list[list[Any]] = [[] for _ in producers]
        self.in_doubt: set[Any] = set()
        self.rejected: list[tuple[Any, str]] = []
        self.released = 0
        self.released_bodies: set[Any] = set()
        """Bodies released at least once (sent again): a store that wrote one but could not
        confirm it in time (``replicated``) may deliver both copies."""
        self.sent = 0
        self.answer_seconds: list[float] = []
        """How long each answered send waited for its outcome."""
        self.receipts: list[Receipt] = []
        self.received: set[Any] = set()
        self.log: list[tuple[float, str]] = []
        """(time.monotonic(), what): connections lost and made, link errors."""
        self.timed_out = False
        self._slots = [_Slot('producer', i, p.urls) for i, p in enumerate(producers)]
        self._slots += [_Slot('consumer', i, c.urls) for i, c in enumerate(consumers)]
        self._by_connection: dict[Any, _Slot] = {}
        self._by_link: dict[Any, _Slot] = {}
        self._producers_started = False
        self._consumers_attached: set[int] = set()
        self._container: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._deadline = 0.0

    # -- the test thread's side ----------------------------------------------------------------

    def start(self) -> 'ChaosRun':
        self._deadline = time.monotonic() + self.timeout
        container = Container(self)
        self._thread = threading.Thread(target=container.run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> 'ChaosRun':
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
        return self

    def wait(self, predicate: Callable[['ChaosRun'], bool], timeout: float) -> bool:
        """Poll ``predicate`` until it holds (True), the time is up or the run ended (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            if self._thread is not None and not self._thread.is_alive():
                return predicate(self)
            time.sleep(0.02)
        return False

    def wait_while_progressing(
        self, predicate: Callable[['ChaosRun'], bool], quiet: float = 2.0, timeout: float = 60
    ) -> bool:
        """Like ``wait``, but also gives up once nothing arrived for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        seen = -1
        while seen != len(self.receipts) and time.monotonic() < deadline:
            seen = len(self.receipts)
            if self.wait(predicate, timeout=min(quiet, deadline - time.monotonic())):
                return True
        return predicate(self)

    def missing(self) -> set[Any]:
        """Accepted bodies not received (yet)."""
        return self.accepted - self.received  # one C-level operation: safe across threads

    def producers_done(self) -> bool:
        """Every body was answered (accepted, rejected) or is in doubt; nothing left to send."""
        return all(
            s.next_body >= len(self.producers[s.index].bodies) and not s.unsettled and not s.resend
            for s in self._slots
            if s.role == 'producer'
        )

    def delivered_all(self) -> bool:
        return self.producers_done() and not self.missing()

    def state(self) -> str:
        """Where each producer and consumer stands, for a failed test's message: its broker,
        link credit, sends unanswered (and for how long), what is left to send, what arrived.
        Read from the test thread: a snapshot, good enough to tell a send never answered from
        one never sent."""
        now = time.monotonic()
        lines = [
            f'accepted {len(self.accepted)}, rejected {len(self.rejected)}, released '
            f'{self.released}, in doubt {len(self.in_doubt)}, sent {self.sent}, received '
            f'{len(self.received)} ({len(self.receipts)} receipts), missing '
            f'{sorted(self.missing(), key=str)[:5]}, timed out {self.timed_out}'
        ]
        for slot in list(self._slots):
            link = slot.link
            credit = link.credit if link is not None else None
            waiting = sorted(now - at for at in list(slot.sent_at.values()))
            what = f'{slot.role} {slot.index} on {slot.url or "-"} (generation {slot.generation})'
            what += f': credit {credit}, {len(slot.unsettled)} unanswered'
            if waiting:
                what += f' (oldest {waiting[-1]:.1f} s: {list(slot.unsettled.values())[:3]})'
            if slot.role == 'producer':
                what += f', next body {slot.next_body} of {len(self.producers[slot.index].bodies)}'
                what += f', {len(slot.resend)} to send again'
            else:
                what += f', {slot.received_here} received on this connection'
            lines.append(what)
        return '\n'.join(lines)

    # -- the container thread ------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self._container = event.container
        for slot in self._slots:
            if slot.role == 'consumer' or not self.consumers:
                self._connect(slot)
        self._container.schedule(self.TICK, self)

    def _connect(self, slot: _Slot) -> None:
        slot.url = slot.urls[slot.url_index % len(slot.urls)]
        slot.reconnect_at = None
        slot.generation += 1
        slot.received_here = 0
        conn = self._container.connect(
            slot.url, reconnect=False, container_id=f'ID:{uuid.uuid4()}:1'
        )
        slot.connection = conn
        self._by_connection[conn] = slot
        if slot.role == 'consumer':
            spec = self.consumers[slot.index]
            link = self._container.create_receiver(
                conn, spec.address, name=spec.link_name, options=spec.options or None
            )
        else:
            producer = self.producers[slot.index]
            link = self._container.create_sender(
                conn, producer.address, name=f'chaos-producer-{slot.index}-{slot.generation}'
            )
        slot.link = link
        self._by_link[link] = slot

    def on_link_opened(self, event: Any) -> None:
        slot = self._by_link.get(event.link)
        if slot is None or slot.role != 'consumer':
            return
        event.link.flow(self.consumers[slot.index].credit)
        self._consumers_attached.add(slot.index)
        self._note(f'consumer {slot.index} attached on {slot.url}')
        if not self._producers_started and len(self._consumers_attached) == len(self.consumers):
            self._producers_started = True
            for s in self._slots:
                if s.role == 'producer':
                    self._connect(s)

    def on_timer_task(self, event: Any) -> None:
        now = time.monotonic()
        if self._stop.is_set() or now > self._deadline:
            self.timed_out = not self._stop.is_set()
            self._close_everything()
            return
        for slot in self._slots:
            if slot.reconnect_at is not None and now >= slot.reconnect_at:
                self._note(f'{slot.role} {slot.index} reconnecting to the next url')
                slot.url_index += 1
                self._connect(slot)
            elif slot.role == 'producer' and slot.resend and slot.link is not None:
                self._pump(slot)
        self._container.schedule(self.TICK, self)

    def on_sendable(self, event: Any) -> None:
        slot = self._by_link.get(event.sender)
        if slot is not None and slot.link == event.sender:
            self._pump(slot)

    def _pump(self, slot: _Slot) -> None:
        producer = self.producers[slot.index]
        sender = slot.link
        now = time.monotonic()
        while sender.credit > 0:
            if producer.window is not None and len(slot.unsettled) >= producer.window:
                return
            if slot.resend and slot.resend[0][0] <= now:
                body = slot.resend.popleft()[1]
            elif slot.next_body < len(producer.bodies):
                body = producer.bodies[slot.next_body]
                slot.next_body += 1
            else:
                return
            message = Message(body=body, durable=True)
            if producer.message_ids:
                message.id = f'ID:chaos:{body}'
            if producer.route is not None:
                to, jms_dest = producer.route(body)
                message.address = to
                if jms_dest is not None:
                    message.annotations = {symbol('x-opt-jms-dest'): byte(jms_dest)}
            delivery = sender.send(message)
            slot.unsettled[delivery] = body
            slot.sent_at[delivery] = time.monotonic()
            self.sent += 1

    def _answered(self, event: Any) -> tuple[_Slot | None, Any]:
        slot = self._by_link.get(event.link)
        if slot is None:
            return None, None
        sent_at = slot.sent_at.pop(event.delivery, None)
        if sent_at is not None:
            self.answer_seconds.append(time.monotonic() - sent_at)
        body = slot.unsettled.pop(event.delivery, None)
        if self.producers[slot.index].window is not None and slot.link is not None:
            self._container.schedule(0, _Call(lambda: slot.link is not None and self._pump(slot)))
        return slot, body

    def on_accepted(self, event: Any) -> None:
        slot, body = self._answered(event)
        if slot is not None and body is not None:
            self.accepted.add(body)
            self.accepted_order[slot.index].append(body)

    def on_released(self, event: Any) -> None:
        slot, body = self._answered(event)
        if slot is None or body is None:
            return
        self.released += 1
        self.released_bodies.add(body)
        if self.producers[slot.index].resend_released:
            slot.resend.append((time.monotonic() + self.resend_delay, body))

    def on_rejected(self, event: Any) -> None:
        slot, body = self._answered(event)
        if slot is not None and body is not None:
            self.rejected.append((body, str(event.delivery.remote.condition)))

    def on_message(self, event: Any) -> None:
        slot = self._by_link.get(event.receiver)
        index = slot.index if slot is not None else -1
        url = slot.url if slot is not None else '?'
        message = event.message
        self.receipts.append(
            Receipt(message.body, index, url, message.delivery_count, time.monotonic(),
                    message.address)
        )  # fmt: skip
        self.received.add(message.body)
        self.accept(event.delivery)
        event.receiver.flow(1)
        if slot is not None and slot.role == 'consumer':
            slot.received_here += 1
            cycle = self.consumers[slot.index].cycle_after
            if cycle and slot.received_here == cycle and slot.connection is not None:
                self._note(f'consumer {slot.index} leaves after {cycle} messages')
                slot.connection.close()

    def on_link_error(self, event: Any) -> None:
        self._note(f'link {event.link.name} refused: {event.link.remote_condition}')

    def on_connection_remote_close(self, event: Any) -> None:
        # proton's handler leaves a Close with amqp:connection:forced unanswered (it expects
        # the peer to drop the socket, which an AMQP peer waiting for our Close does not do):
        # answer it, as Qpid JMS does, so the broker hangs up and we reconnect
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            self._note(f'connection closed by the broker: {event.connection.remote_condition}')
            event.connection.close()

    def on_connection_error(self, event: Any) -> None:
        pass  # noted by on_connection_remote_close

    def on_transport_error(self, event: Any) -> None:
        self._note(f'transport error: {event.transport.condition}')

    def on_transport_closed(self, event: Any) -> None:
        slot = self._by_connection.pop(event.connection, None)
        if slot is None or self._stop.is_set() or slot.connection != event.connection:
            return
        self._note(f'{slot.role} {slot.index} lost its connection to {slot.url}')
        self.in_doubt.update(slot.unsettled.values())
        slot.unsettled.clear()
        slot.sent_at.clear()
        self._by_link.pop(slot.link, None)
        slot.link = slot.connection = None
        slot.reconnect_at = time.monotonic() + self.reconnect_delay

    def _note(self, what: str) -> None:
        self.log.append((time.monotonic(), what))

    def _close_everything(self) -> None:
        self._stop.set()
        for slot in self._slots:
            if slot.connection is not None:
                slot.connection.close()
            slot.reconnect_at = None
