"""
A ``MultiRun`` for measuring how messages are shared: one producer sending a burst or at a fixed
rate, and consumers that settle at once or at a fixed rate. Counts where every message went;
never asserts.
"""

import time
from typing import Any

from loadclient import ConsumerSpec, MultiRun, ProducerSpec, _Call
from proton import Message

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
        self._held: dict[int, list[Any]] = {i: [] for i in self.settle_rates}
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
        self.received[i].append(event.message.body)
        if i in self._held:
            self._held[i].append((event.receiver, event.delivery))
        else:
            self.accept(event.delivery)
            event.receiver.flow(1)
        self._stop_when_done()

    def _settle_one(self, i: int) -> None:
        if not self._connections:
            return
        held = self._held[i]
        if held:
            rcv, delivery = held.pop(0)
            self.accept(delivery)
            rcv.flow(1)
        self._container.schedule(1 / self.settle_rates[i], _Call(lambda: self._settle_one(i)))
