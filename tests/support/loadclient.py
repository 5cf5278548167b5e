"""
A bounded many-link client on proton's Container, for tests that need concurrency (several
consumers on several brokers at once). Counts what each consumer got; never asserts itself.
"""

import dataclasses
import threading
import time
import uuid
from typing import Any

from proton import Message, symbol
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
