"""
A ``MultiRun`` for measuring how messages are shared: one producer sending a burst or at a fixed
rate, and consumers that settle at once or at a fixed rate. Counts where every message went;
never asserts.

A slow consumer still holds unsettled messages when the run closes its connections. The broker
returns them (delivery-count + 1, as for every unsettled delivery of a connection that goes), and
the other replica may send one to a consumer whose connection the run has closed but whose Close
that replica has not read yet: a redelivery of a message nobody accepted, not a duplicate. Such
a message is kept apart (``returned_after_close``), not counted in ``received``; any other
message arriving after the close is counted as ever, so a real duplicate is still seen.
"""

import time
from typing import Any

from loadclient import ConsumerSpec, MultiRun, ProducerSpec, _Call
from proton import Endpoint, Message

TICK_SECONDS = 0.01
"""How often the paced producer and the slow consumers look at the clock."""


class ShareRun(MultiRun):
    """``rate`` (messages/s) paces the producer (None: as fast as credit allows, a burst);
    ``settle_rates`` maps a consumer's index to the messages per second it accepts (each accept
    returns one credit); the others accept at once. The producer starts ``warm_up`` seconds after
    every consumer is attached."""

    def __init__(
        self,
        producer: ProducerSpec,
        consumers: list[ConsumerSpec],
        timeout: float,
        rate: float | None = None,
        settle_rates: dict[int, float] | None = None,
        warm_up: float = 0.5,
    ) -> None:
        super().__init__([producer], consumers, timeout)
        self.rate = rate
        self.settle_rates = settle_rates or {}
        self.warm_up = warm_up
        self._held: dict[int, list[tuple[Any, Any, Any]]] = {i: [] for i in self.settle_rates}
        """Each slow consumer's unsettled messages in arrival order: receiver, delivery, body."""
        self.unsettled_at_close: set[Any] = set()
        """Bodies the slow consumers held unsettled when the run closed its connections."""
        self.returned_after_close: list[tuple[int, Any, int]] = []
        """(consumer, body, delivery-count) of each of those that arrived again after the close."""
        self._sender: Any = None
        self._sending_since = 0.0

    def shares(self) -> list[float]:
        total = sum(len(got) for got in self.received) or 1
        return [len(got) / total for got in self.received]

    def _start_producers(self) -> None:
        self._container.schedule(self.warm_up, _Call(self._start_paced))
        for i, rate in self.settle_rates.items():
            self._container.schedule(1 / rate, _Call(lambda i=i: self._settle_one(i)))

    def _start_paced(self) -> None:
        self._sending_since = time.monotonic()
        super()._start_producers()
        if self.rate is not None:
            self._container.schedule(TICK_SECONDS, _Call(self._tick))

    def _tick(self) -> None:
        if self._sender is not None:
            self._send(self._sender)
        if self.sent[0] < self.producers[0].count and self._connections:
            self._container.schedule(TICK_SECONDS, _Call(self._tick))

    def on_sendable(self, event: Any) -> None:
        if self._senders.get(event.sender) is None:
            return
        self._sender = event.sender
        self._send(event.sender)

    def _send(self, snd: Any) -> None:
        spec = self.producers[0]
        due = spec.count
        if self.rate is not None:
            due = min(due, int((time.monotonic() - self._sending_since) * self.rate) + 1)
        while snd.credit and self.sent[0] < due:
            snd.send(Message(body=self.sent[0]))
            self.sent[0] += 1

    def on_message(self, event: Any) -> None:
        i = self._receivers[event.receiver]
        message = event.message
        if self._returned(event.connection, message):
            self.returned_after_close.append((i, message.body, message.delivery_count))
            return  # not settled: the broker returns it again when it reads the Close
        self.received[i].append(message.body)
        if i in self._held:
            self._held[i].append((event.receiver, event.delivery, message.body))
        else:
            self.accept(event.delivery)
            event.receiver.flow(1)
        self._stop_when_done()

    def _settle_one(self, i: int) -> None:
        if not self._connections:
            return
        held = self._held[i]
        if held:
            rcv, delivery, _ = held.pop(0)
            self.accept(delivery)
            rcv.flow(1)
        self._container.schedule(1 / self.settle_rates[i], _Call(lambda: self._settle_one(i)))

    def _returned(self, connection: Any, message: Any) -> bool:
        """A message a slow consumer held unsettled at the close, delivered again (counted as a
        failed attempt) to a consumer whose connection is closed here."""
        return bool(
            connection.state & Endpoint.LOCAL_CLOSED
            and message.delivery_count > 0
            and message.body in self.unsettled_at_close
        )

    def _stop(self) -> None:
        if self._connections:
            self.unsettled_at_close.update(
                body for held in self._held.values() for _, _, body in held
            )
        super()._stop()
