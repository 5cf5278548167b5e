"""
JMS-shaped clients behind a failover URL, for the scale-down test: what a Qpid JMS app with
``failover:(amqp://<service>)`` does, on proton's Container.

- A producer sends persistent messages synchronously at a steady rate: one send at a time, the
  next only once the broker accepted the last (``MessageProducer.send``). When its connection is
  lost it reconnects (after Qpid JMS's default 10 ms) and sends again the message it was waiting
  on, as the failover provider does with a send under way; the app's ``send`` does not fail. A
  send that is answered otherwise than ``accepted`` would fail in the app: counted.
- A consumer is an AUTO_ACKNOWLEDGE ``MessageConsumer`` with a small prefetch: each message is
  accepted as it arrives and one credit returned. After losing its connection it reconnects and
  attaches again.

Counts; never asserts. Each receipt keeps the delivery count, so a test can tell a redelivery
the broker flagged from a duplicate it did not.
"""

import dataclasses
import threading
import time
import uuid
from typing import Any

from proton import Endpoint, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

RECONNECT_SECONDS = 0.01
"""Qpid JMS's failover ``reconnectDelay`` default."""


@dataclasses.dataclass(frozen=True, slots=True)
class Receipt:
    body: int
    consumer: int
    delivery_count: int
    at: float


@dataclasses.dataclass(eq=False)
class _Client:
    role: str
    index: int
    connection: Any = None
    link: Any = None
    reconnect_at: float | None = None
    waiting_on: int | None = None
    """A producer's send under way (its body), answered or sent again after a failover."""
    delivery: Any = None
    next_body: int = 0
    connections: int = 0


class FailoverRun(MessagingHandler):  # type: ignore[misc]
    """``producers`` steady senders (``rate`` messages a second each, bodies unique across
    them) and ``consumers`` auto-acknowledging receivers on one queue, all through ``url``."""

    TICK = 0.005

    def __init__(
        self, url: str, address: str, *, producers: int, consumers: int, rate: float,
        credit: int = 10, timeout: float = 120,
    ) -> None:  # fmt: skip
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.rate, self.credit = url, address, rate, credit
        self.timeout = timeout
        self.clients = [_Client('consumer', i) for i in range(consumers)]
        self.clients += [_Client('producer', i) for i in range(producers)]
        self.producers = producers
        self.intended: dict[int, float] = {}
        """Body -> when the app meant to send it (its place in the steady stream)."""
        self.accepted: set[int] = set()
        self.sent_at: dict[int, float] = {}
        """Body -> when it was first sent (``time.monotonic()``)."""
        self.accepted_at: dict[int, float] = {}
        self.resent = 0
        """Sends made again after a failover (the first answer never came)."""
        self.failed: list[tuple[int, str]] = []
        """Sends the app would see fail: answered other than accepted."""
        self.receipts: list[Receipt] = []
        self.errors: list[str] = []
        """Links refused and transport errors (a client connecting to no one)."""
        self.moves = 0
        """Connections lost and made again."""
        self._sending = False
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._container: Any = None
        self._by_connection: dict[Any, _Client] = {}
        self._by_link: dict[Any, _Client] = {}

    # -- the test thread's side ----------------------------------------------------------------

    def start(self) -> 'FailoverRun':
        self._thread = threading.Thread(target=Container(self).run, daemon=True)
        self._thread.start()
        return self

    def send_for(self, seconds: float) -> None:
        """Producers start their steady stream now and send for ``seconds``."""
        self._started = time.monotonic()
        self._until = self._started + seconds
        self._sending = True

    def sending_done(self) -> bool:
        return time.monotonic() > self._until and all(
            c.waiting_on is None for c in self.clients if c.role == 'producer'
        )

    def received(self) -> set[int]:
        return {r.body for r in self.receipts}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def wait(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return bool(predicate(self))

    def attached(self) -> bool:
        return all(c.link is not None and c.link.state & Endpoint.REMOTE_ACTIVE
                   for c in self.clients)  # fmt: skip

    # -- the container thread ------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self._container = event.container
        self._deadline = time.monotonic() + self.timeout
        for client in self.clients:
            self._connect(client)
        self._container.schedule(self.TICK, self)

    def _connect(self, client: _Client) -> None:
        client.reconnect_at = None
        client.connections += 1
        conn = self._container.connect(self.url, reconnect=False,
                                       container_id=f'ID:{uuid.uuid4()}:1')  # fmt: skip
        client.connection = conn
        self._by_connection[conn] = client
        if client.role == 'consumer':
            link = self._container.create_receiver(conn, self.address, name='jms-consumer')
        else:
            name = f'jms-producer-{client.index}'
            link = self._container.create_sender(conn, self.address, name=name)
        client.link = link
        self._by_link[link] = client

    def on_link_opened(self, event: Any) -> None:
        client = self._by_link.get(event.link)
        if client is not None and client.role == 'consumer':
            event.link.flow(self.credit)

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        client = self._by_link.get(link)
        if client is None or not link.is_sender:
            return
        self._send(client, time.monotonic())  # a send that waited for credit goes now
        if link.drain_mode:
            link.drained()  # as Qpid JMS's producer does: what it had is sent, the rest given back

    def on_timer_task(self, event: Any) -> None:
        now = time.monotonic()
        if self._stop.is_set() or now > self._deadline:
            for client in self.clients:
                client.reconnect_at = None
                if client.connection is not None:
                    client.connection.close()
            return
        for client in self.clients:
            if client.reconnect_at is not None and now >= client.reconnect_at:
                self.moves += 1
                self._connect(client)
            elif client.role == 'producer':
                self._send(client, now)
        self._container.schedule(self.TICK, self)

    def on_sendable(self, event: Any) -> None:
        client = self._by_link.get(event.sender)
        if client is not None:
            self._send(client, time.monotonic())

    def _send(self, client: _Client, now: float) -> None:
        sender = client.link
        if sender is None or sender.credit <= 0 or client.delivery is not None:
            return
        if client.waiting_on is not None:  # the send under way when the connection went
            self.resent += 1
            body = client.waiting_on
        else:
            if not self._sending or now > self._until:
                return
            body = client.next_body * self.producers + client.index
            due = self._started + client.next_body / self.rate
            if now < due:
                return
            client.next_body += 1
            client.waiting_on = body
            self.intended[body] = due
            self.sent_at[body] = now
        client.delivery = sender.send(Message(body=body, durable=True))

    def _answered(self, event: Any, outcome: str) -> None:
        client = self._by_link.get(event.link)
        if client is None or client.delivery != event.delivery:
            return
        body = client.waiting_on
        client.delivery = client.waiting_on = None
        if outcome == 'accepted':
            self.accepted.add(body)  # type: ignore[arg-type]
            self.accepted_at[body] = time.monotonic()  # type: ignore[index]
        else:
            self.failed.append((body, f'{outcome}: {event.delivery.remote.condition}'))  # type: ignore[arg-type]
        self._send(client, time.monotonic())

    def on_accepted(self, event: Any) -> None:
        self._answered(event, 'accepted')

    def on_rejected(self, event: Any) -> None:
        self._answered(event, 'rejected')

    def on_released(self, event: Any) -> None:
        self._answered(event, 'released')

    def on_modified(self, event: Any) -> None:
        self._answered(event, 'modified')

    def on_message(self, event: Any) -> None:
        client = self._by_link.get(event.receiver)
        index = client.index if client is not None else -1
        self.receipts.append(
            Receipt(event.message.body, index, event.message.delivery_count, time.monotonic())
        )
        self.accept(event.delivery)
        event.receiver.flow(1)

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f'link {event.link.name}: {event.link.remote_condition}')

    def on_connection_remote_close(self, event: Any) -> None:
        # answer the broker's Close (amqp:connection:forced), as Qpid JMS does, then fail over
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def on_connection_error(self, event: Any) -> None:
        pass

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        if condition is not None and 'connection aborted' not in str(condition):
            self.errors.append(f'transport: {condition}')

    def on_transport_closed(self, event: Any) -> None:
        client = self._by_connection.pop(event.connection, None)
        if client is None or self._stop.is_set() or client.connection != event.connection:
            return
        self._by_link.pop(client.link, None)
        client.link = client.connection = client.delivery = None
        client.reconnect_at = time.monotonic() + RECONNECT_SECONDS
