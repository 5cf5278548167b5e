"""
A bounded many-link client on proton's Container, for tests that need concurrency (several
consumers on several brokers at once). Counts what each consumer got; never asserts itself.
"""

import threading
import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


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
