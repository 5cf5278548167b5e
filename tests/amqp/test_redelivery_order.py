"""
A failed message's return reaches the store ahead of any later fetch of its subscription by the
replica that read the failure, so on a subscription that keeps its order through a redelivery
delay (exclusive, or with message groups) a message sent after the failure never overtakes it.

The window: the consumer's replica reads something that asks for a fetch (a store reply, an
announcement, credit) and, in the same turn, the failure; the message sent next through the
other replica is stored before that fetch runs. The first test holds it open (the consumer's
replica is stopped while the outcome waits in its socket and the next message is stored); the
second repeats fail-then-send for many rounds, where it opens by chance, more often on a busy
machine. Real brokers, two replicas on one Redis.
"""

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from amqpclient import connect, flush, nothing_more, receiver, send_all, settle
from processes import BrokerProcess
from proton import Delivery, Message

ROUNDS = 40
DELAY_MS = '50'


def _message(body: str, grouped: bool) -> Message:
    return Message(body=body, group_id='g' if grouped else None)


def _until_stopped(pid: int) -> None:
    """Return once the process is stopped (state T in /proc): a signal takes effect later."""
    for _ in range(1000):
        stat = Path(f'/proc/{pid}/stat').read_text()
        if stat.rpartition(')')[2].split()[0] == 'T':
            return
        time.sleep(0.001)
    raise AssertionError(f'process {pid} did not stop')


def _two_replicas(
    start_broker: Callable[..., BrokerProcess], address: str, order: str
) -> tuple[BrokerProcess, Any, Any, Any, Any]:
    """Two replicas ordering ``address`` as ``order`` says: (the consuming one, its connection
    and receiver (credit 20), the producing one's connection and sender)."""
    env = {'SHOAL_REDELIVERY_DELAY_MS': DELAY_MS}
    if order == 'exclusive':
        env['SHOAL_EXCLUSIVE_ADDRESSES'] = address
    producing, consuming = start_broker(env=env), start_broker(env=env)
    consumer = connect(consuming.url)
    rcv = receiver(consumer, address, credit=20)
    conn = connect(producing.url)
    return consuming, consumer, rcv, conn, send_all(conn, address, [])


@pytest.mark.parametrize('order', ['exclusive', 'group'])
def test_an_outcome_read_in_one_turn_with_a_drain_reaches_the_store_before_its_fetch(
    start_broker: Callable[..., BrokerProcess], address: str, order: str
) -> None:
    """The consumer asks to drain, then fails the message it holds, while its replica is
    stopped; the next message is stored meanwhile. The replica reads both at once: the fetch
    the drain asks for finds the failed message waiting, and hands out nothing past it."""
    consuming, consumer, rcv, conn, snd = _two_replicas(start_broker, address, order)
    grouped = order == 'group'
    snd.send(_message('failed', grouped))
    assert rcv.receive(timeout=10).body == 'failed'
    consuming.process.send_signal(signal.SIGSTOP)
    try:
        _until_stopped(consuming.pid)  # what follows waits in its socket, unread
        rcv.link.drain(0)  # a fetch asked for, read in the same turn as the outcome below
        flush(consumer)
        rcv.link.drain_mode = False  # later credit is plain credit
        settle(rcv, Delivery.MODIFIED, failed=True)
        flush(consumer)
        snd.send(_message('next', grouped))  # stored while the outcome waits to be read
    finally:
        consuming.process.send_signal(signal.SIGCONT)
    # the drain answered (its credit used up), or a message came instead
    consumer.wait(lambda: not rcv.link.credit or rcv.fetcher.has_message, timeout=10)
    rcv.link.flow(20)
    got = []
    for _ in range(2):
        message = rcv.receive(timeout=10)
        got.append((message.body, message.delivery_count))
        rcv.accept()
    assert got == [('failed', 1), ('next', 0)]
    assert nothing_more(rcv)
    consumer.close()
    conn.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize('order', ['exclusive', 'group'])
def test_a_message_sent_after_a_failure_never_overtakes_the_failed_one(
    start_broker: Callable[..., BrokerProcess], address: str, order: str
) -> None:
    _, consumer, rcv, conn, snd = _two_replicas(start_broker, address, order)
    grouped = order == 'group'
    overtaken = []
    for r in range(ROUNDS):
        snd.send(_message(f'failed-{r}', grouped))
        first = rcv.receive(timeout=10)
        assert (first.body, first.delivery_count) == (f'failed-{r}', 0)
        settle(rcv, Delivery.MODIFIED, failed=True)
        flush(consumer)
        snd.send(_message(f'next-{r}', grouped))  # while the failed one waits out its delay
        got = []
        for _ in range(2):
            message = rcv.receive(timeout=10)
            got.append((message.body, message.delivery_count))
            rcv.accept()
        flush(consumer)
        if got != [(f'failed-{r}', 1), (f'next-{r}', 0)]:
            overtaken.append((r, got))
    assert overtaken == []
    assert nothing_more(rcv)
    consumer.close()
    conn.close()
