"""
What a replica does between SIGTERM and its exit (``running/draining.py``), watched from its
clients, its probe and its metrics: it stops taking anything at once, lets each connection go
once it owes nothing, and closes it with ``amqp:connection:forced``.
"""

import signal
import socket
import time

import pytest
from amqpclient import connect, receiver, send_all, settle
from exposition import samples, value
from processes import LOOPBACK
from proton import Delivery
from proton.utils import ConnectionClosed

LONG_DRAIN = {'SHOAL_CONNECTION_DRAIN_SECONDS': '20'}
"""Far longer than the test takes: the connections, not the bound, end the drain."""


def _closed_by_broker(conn, timeout: float = 10) -> str:  # type: ignore[no-untyped-def]
    """Pump ``conn`` until the broker closes it; the condition it gave."""
    try:
        conn.wait(lambda: False, timeout=timeout, msg='the broker did not close the connection')
    except ConnectionClosed:
        return str(conn.conn.remote_condition.name)
    raise AssertionError('unreachable')


def _refused(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=1).close()
    except OSError:
        return True
    return False


@pytest.mark.timeout(60)
def test_sigterm_turns_readiness_off_at_once_and_each_connection_goes_once_it_owes_nothing(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env=LONG_DRAIN)
    producer = connect(b.url)
    send_all(producer, address, range(6)).close()
    producer.close()
    holding = connect(b.url)
    held = receiver(holding, address, credit=2)
    holding.wait(lambda: held.fetcher.has_message == 2, timeout=10)  # out, unsettled
    idle = connect(b.url)
    receiver(idle, f'{address}-idle', credit=5)

    b.process.send_signal(signal.SIGTERM)
    assert _closed_by_broker(idle) == 'amqp:connection:forced'  # it owed nothing: at once
    status, _ = b.http_get('/readyz')
    assert status == 503
    assert _refused(b.port)  # no new connection
    found = samples(b)
    assert value(found, 'shoal_draining') == 1
    out = value(found, 'shoal_drain_owed', kind='delivery')
    assert out >= 2
    holding.wait(lambda: held.fetcher.has_message == out, timeout=10)
    assert value(found, 'shoal_drain_owed', kind='send') == 0
    bodies = [held.fetcher.pop().body for _ in range(int(out))]
    assert bodies == list(range(int(out)))
    assert held.link.credit > 0  # the client's prefetch: credit it has, and it gets nothing
    settle(held, Delivery.ACCEPTED)
    holding.wait(lambda: value(samples(b), 'shoal_drain_owed', kind='delivery') == out - 1,
                 timeout=10)  # fmt: skip
    assert held.fetcher.has_message == 0  # nothing more was dealt
    started = time.monotonic()
    for _ in range(int(out) - 1):
        settle(held, Delivery.ACCEPTED)
    assert _closed_by_broker(holding) == 'amqp:connection:forced'
    assert b.process.wait(timeout=15) == 0
    assert time.monotonic() - started < 10  # the connections ended the drain, not its bound
    assert 'drained in' in b.log()

    other = start_broker()
    conn = connect(other.url)
    rest = receiver(conn, address, credit=5)
    again = [rest.receive(timeout=10) for _ in range(6 - int(out))]
    rest.accept()
    # never delivered, so not counted: the next consumer gets them as first deliveries
    assert [(m.body, m.delivery_count) for m in again] == [(n, 0) for n in range(int(out), 6)]
    conn.close()
