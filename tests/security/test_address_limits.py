"""
Addresses created on demand are limited per user, and ``/metrics`` stays bounded however many
addresses exist: past ``SHOAL_METRICS_MAX_ADDRESSES`` their series are added up under
``address="_other"``.
"""

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqpclient import connect, send_with_outcome, sender
from processes import BrokerProcess, RedisServer
from proton import Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import LinkDetached

from shoal_broker.settings import SecuritySettings

LIMITED = 'amqp:resource-limit-exceeded'
METRICS_BOUND = 640 * 1024
"""The documented bound of a scrape with the default address cap (docs/security.md): about
500 KB, six series for each of the 1 000 admitted queues, two of them (consumers, dead letters)
exported at 0 from the start so that Prometheus sees their first change."""


def test_addresses_created_on_demand_are_refused_past_the_users_limit(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    b = start_broker(env={'SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER': '50'})
    prefix = f'auto-{uuid.uuid4().hex[:8]}'
    conn = connect(b.url)
    relay = sender(conn, None)
    outcomes = [
        send_with_outcome(conn, relay, Message(address=f'{prefix}-{i}', body=i)) for i in range(60)
    ]
    assert outcomes[:50] == [(Delivery.ACCEPTED, None)] * 50
    assert {(state, condition) for state, condition in outcomes[50:]} == {
        (Delivery.REJECTED, LIMITED)
    }
    with pytest.raises(LinkDetached, match=LIMITED):
        sender(conn, f'{prefix}-attached')
    # an address that exists is not counted again
    assert send_with_outcome(conn, relay, Message(address=f'{prefix}-0', body='again')) == (
        Delivery.ACCEPTED, None,
    )  # fmt: skip
    conn.close()


class Spray(MessagingHandler):  # type: ignore[misc]
    """One message to each of ``count`` new addresses through the anonymous relay, pipelined;
    counts the accepted ones. Stops when all are settled or at ``timeout``."""

    def __init__(self, url: str, prefix: str, count: int, timeout: float) -> None:
        super().__init__()
        self.url, self.prefix, self.count, self.timeout = url, prefix, count, timeout
        self.sent = self.accepted = self.settled = 0
        self._conn: Any = None
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        self._conn = event.container.connect(self.url, reconnect=False)
        event.container.create_sender(self._conn, None)
        self._timer = event.container.schedule(self.timeout, self)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(address=f'{self.prefix}-{self.sent}', body=self.sent))
            self.sent += 1

    def on_settled(self, event: Any) -> None:
        self.settled += 1
        self.accepted += event.delivery.remote_state == Delivery.ACCEPTED
        if self.settled == self.count:
            self._timer.cancel()
            self._conn.close()

    def on_timer_task(self, event: Any) -> None:
        self._conn.close()

    def run(self) -> 'Spray':
        thread = threading.Thread(target=Container(self).run, daemon=True)
        thread.start()
        thread.join(self.timeout + 10)
        return self


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own: ten thousand addresses left in the shared one would make every
    later broker on it scan them (backlog gauges, idle records) for the rest of the run."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.mark.timeout(240)
def test_metrics_stay_bounded_with_ten_thousand_addresses(
    own_redis: RedisServer, start_broker: Callable[..., BrokerProcess]
) -> None:
    b = start_broker(
        redis_url=own_redis.url,
        env={
            'SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER': '20000',
            'SHOAL_METRICS_MAX_ADDRESSES': str(SecuritySettings().metrics_max_addresses),
        },
    )  # the default cap (the test harness turns it off)
    run = Spray(b.url, f'many-{uuid.uuid4().hex[:8]}', 10_000, timeout=180).run()
    assert run.accepted == 10_000, f'{run.accepted} of {run.sent} sent accepted'
    status, body = b.http_get('/metrics')
    assert status == 200
    assert b'address="_other"' in body
    assert len(body) < METRICS_BOUND, f'/metrics is {len(body)} bytes'
