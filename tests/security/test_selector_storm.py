"""
A peer's selectors never stall the replica: ten long selectors attached at once on one
connection, while a producer/consumer pair runs on the same broker.

The pair's longest gap between two messages is the issue's own acceptance criterion (no pause
over 100 ms). Wall-clock bounds are flaky on a shared 2-core machine, so the test asserts a
generous multiple of it (``MAX_GAP_SECONDS``, still far below the several seconds ten such
selectors used to block the loop); the failure message says what it measured. The lease holds
(no lapse logged, ``shoal_replica_lease_up`` 1), and a user without permission is refused before
any compilation (``shoal_selector_compilations`` does not move).
"""

import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from amqpclient import Filter
from jmswire import SELECTOR
from processes import BrokerProcess
from proton import Described, Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container
from testusers import PASSWORDS, write_users

MAX_GAP_SECONDS = 1.0
"""Ten times the issue's 100 ms: on a quiet machine the gaps measure 16-67 ms, but with other
test runs sharing the 2 cores one run saw 0.58 s. Before the fix the ten selectors were compiled
back to back on the loop, one loop turn of 7-10 s (the test ran into its timeout)."""

STORM_SIZE = 10
PAIR_INTERVAL = 0.01
PAIR_MAX_MESSAGES = 12_000
STORM_TIMEOUT = 120.0
DENIED = 'amqp:unauthorized-access'
INVALID = 'amqp:invalid-field'


def pathological(name: str) -> str:
    """The issue's 61 KiB selector (``a = 1+1+...+1``), distinct per name so no cache helps."""
    return f'{name} = ' + '+'.join(['1'] * 31_000)


def heavy_but_valid(name: str) -> str:
    """A valid selector just under the token limit (about 32 KiB): compiled, not refused."""
    return f'{name} = ' + '+'.join(['1'] * 8_000)


def login(user: str) -> dict[str, Any]:
    return {
        'user': user, 'password': PASSWORDS[user], 'allowed_mechs': 'PLAIN',
        'allow_insecure_mechs': True, 'reconnect': False,
    }  # fmt: skip


class Pair(MessagingHandler):  # type: ignore[misc]
    """A producer sending one message every PAIR_INTERVAL and a consumer, on their own
    connections; records when each message arrives and any error. Runs until ``stop`` is set,
    PAIR_MAX_MESSAGES or ``timeout``."""

    def __init__(self, url: str, address: str, user: str, timeout: float) -> None:
        super().__init__(prefetch=100, auto_accept=True)
        self.url, self.address, self.user, self.timeout = url, address, user, timeout
        self.arrivals: list[float] = []
        self.storm_started = 0.0
        """When the storm began (the last arrival before it): gaps are measured from there."""
        self.errors: list[str] = []
        self.sent = 0
        self.stop = threading.Event()
        self._sender: Any = None
        self._connections: list[Any] = []
        self._deadline = time.monotonic() + timeout
        self.thread = threading.Thread(target=Container(self).run, daemon=True)

    def on_start(self, event: Any) -> None:
        container = event.container
        consumer = container.connect(self.url, **login(self.user))
        producer = container.connect(self.url, **login(self.user))
        self._connections = [consumer, producer]
        container.create_receiver(consumer, self.address)
        self._sender = container.create_sender(producer, self.address)
        container.schedule(PAIR_INTERVAL, self)

    def on_timer_task(self, event: Any) -> None:
        done = (
            self.stop.is_set()
            or self.sent >= PAIR_MAX_MESSAGES
            or time.monotonic() > self._deadline
        )
        if done:
            for conn in self._connections:
                conn.close()
            return
        if self._sender.credit:
            self._sender.send(Message(body=self.sent))
            self.sent += 1
        event.container.schedule(PAIR_INTERVAL, self)

    def on_message(self, event: Any) -> None:
        self.arrivals.append(time.monotonic())

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f'link: {event.link.remote_condition}')

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f'connection: {event.connection.remote_condition}')

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f'transport: {event.transport.condition}')

    def max_gap(self, since: float) -> float:
        times = [t for t in self.arrivals if t >= since]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


class Storm(MessagingHandler):  # type: ignore[misc]
    """One connection attaching a receiver per selector, all at once; records each link's
    outcome ('opened' or the refusal's condition) and stops when every link is answered. It
    advertises Qpid JMS's 1 MiB maximum frame size unless told otherwise (proton's default is
    too small for the echo of a 61 KiB selector)."""

    def __init__(
        self, url: str, address: str, user: str, selectors: list[str],
        max_frame_size: int = 1024 * 1024,
    ) -> None:  # fmt: skip
        super().__init__(prefetch=0)
        self.url, self.address, self.user, self.selectors = url, address, user, selectors
        self.max_frame_size = max_frame_size
        self.outcomes: dict[str, str] = {}
        self.errors: list[str] = []
        self._conn: Any = None
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        self._conn = event.container.connect(
            self.url, max_frame_size=self.max_frame_size, **login(self.user)
        )
        for i, text in enumerate(self.selectors):
            selector = Filter({symbol('jms-selector'): Described(SELECTOR, text)})
            event.container.create_receiver(
                self._conn, self.address, name=f'storm-{i}', options=selector
            )
        self._timer = event.container.schedule(STORM_TIMEOUT, self)

    def _answered(self, event: Any, outcome: str) -> None:
        self.outcomes.setdefault(event.link.name, outcome)
        if len(self.outcomes) == len(self.selectors):
            self._timer.cancel()  # a pending timer would keep the container running
            self._conn.close()

    def on_link_opened(self, event: Any) -> None:
        if event.link.remote_source.type != 0:  # a null source is a refusal; the detach follows
            self._answered(event, 'opened')

    def on_link_error(self, event: Any) -> None:
        self._answered(event, str(event.link.remote_condition.name))

    def on_timer_task(self, event: Any) -> None:
        self._conn.close()

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f'transport: {event.transport.condition}')
        self._timer.cancel()

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f'connection: {event.connection.remote_condition}')
        self._timer.cancel()
        self._conn.close()

    def run(self) -> 'Storm':
        Container(self).run()
        return self


def metric(broker: BrokerProcess, name: str) -> float:
    status, body = broker.http_get('/metrics')
    assert status == 200
    found = re.search(rf'^{name} (\S+)$', body.decode(), re.MULTILINE)
    assert found, f'{name} not exported'
    return float(found.group(1))


@pytest.fixture
def secure_broker_2s(start_broker: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    """A broker of its own (nothing else loads it), with a short lease that a stall would lapse."""
    users = write_users(tmp_path / 'users.json')
    return start_broker(
        env={
            'SHOAL_USERS_FILE': str(users), 'SHOAL_ALLOW_ANONYMOUS': 'false',
            'SHOAL_LEASE_SECONDS': '2',
        }
    )  # fmt: skip


def storm_beside_pair(broker: BrokerProcess, user: str, selectors: list[str]) -> tuple[Storm, Pair]:
    address = f'orders.storm-{uuid.uuid4().hex[:8]}'
    pair = Pair(broker.url, address, 'carol', timeout=STORM_TIMEOUT + 30)
    pair.thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(pair.arrivals) < 20 and time.monotonic() < deadline and not pair.errors:
            time.sleep(0.05)
        assert len(pair.arrivals) >= 20, f'the pair did not start: {pair.errors}'
        pair.storm_started = pair.arrivals[-1]
        storm = Storm(broker.url, address, user, selectors).run()
        time.sleep(1.0)  # the pair keeps running past the storm: a late stall shows too
    finally:
        pair.stop.set()
        pair.thread.join(30)
    return storm, pair


def assert_replica_unharmed(broker: BrokerProcess, pair: Pair) -> None:
    gap = pair.max_gap(pair.storm_started)
    assert not pair.errors, f'the pair was disturbed: {pair.errors}'
    assert gap < MAX_GAP_SECONDS, (
        f'the pair waited {gap:.3f} s between two messages (acceptance: 0.1 s; asserted '
        f'{MAX_GAP_SECONDS} s): the event loop was blocked'
    )
    assert 'lease lapsed' not in broker.log()
    assert metric(broker, 'shoal_replica_lease_up') == 1


def test_ten_long_selectors_leave_the_pair_and_the_lease_alone(
    secure_broker_2s: BrokerProcess,
) -> None:
    broker = secure_broker_2s
    selectors = [pathological(f'p{i}') for i in range(STORM_SIZE // 2)] + [
        heavy_but_valid(f'v{i}') for i in range(STORM_SIZE - STORM_SIZE // 2)
    ]
    storm, pair = storm_beside_pair(broker, 'carol', selectors)
    expected = {f'storm-{i}': INVALID for i in range(STORM_SIZE // 2)} | {
        f'storm-{i}': 'opened' for i in range(STORM_SIZE // 2, STORM_SIZE)
    }
    assert storm.outcomes == expected
    assert_replica_unharmed(broker, pair)
    assert metric(broker, 'shoal_selector_compilations') == STORM_SIZE


def test_a_user_without_permission_is_refused_before_any_compilation(
    secure_broker_2s: BrokerProcess,
) -> None:
    broker = secure_broker_2s
    selectors = [pathological(f'p{i}') for i in range(STORM_SIZE)]
    before = metric(broker, 'shoal_selector_compilations')
    storm, pair = storm_beside_pair(broker, 'bob', selectors)  # bob may only browse orders
    assert storm.outcomes == {f'storm-{i}': DENIED for i in range(STORM_SIZE)}
    assert metric(broker, 'shoal_selector_compilations') == before
    assert_replica_unharmed(broker, pair)


def test_a_refused_selector_is_not_compiled_again(secure_broker_2s: BrokerProcess) -> None:
    broker = secure_broker_2s
    text = pathological('again')
    address = f'orders.again-{uuid.uuid4().hex[:8]}'
    first = Storm(broker.url, address, 'carol', [text]).run()
    before = metric(broker, 'shoal_selector_compilations')
    second = Storm(broker.url, address, 'carol', [text] * 3).run()
    assert first.outcomes == {'storm-0': INVALID}
    assert set(second.outcomes.values()) == {INVALID}
    assert metric(broker, 'shoal_selector_compilations') == before


def test_an_attach_reply_too_big_for_the_peers_frames_is_refused_clearly(
    secure_broker_2s: BrokerProcess,
) -> None:
    """The reply echoes the source's filter: a 40 KB selector cannot come back in the 32 KiB
    frames the peer allows, so that attach alone is refused; the connection lives on."""
    address = f'orders.frames-{uuid.uuid4().hex[:8]}'
    long_selector = "k = '" + 'x' * 40_000 + "'"
    storm = Storm(
        secure_broker_2s.url, address, 'carol', [long_selector, "k = 'y'"], max_frame_size=32_768
    ).run()
    assert storm.errors == []
    assert storm.outcomes == {'storm-0': 'amqp:frame-size-too-small', 'storm-1': 'opened'}
    assert 'maximum frame size of 32768 bytes' in secure_broker_2s.log()
