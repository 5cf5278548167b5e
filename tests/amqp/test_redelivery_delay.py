"""
Redelivery delay with backoff: a message a consumer gives back (modified delivery-failed,
released, rolled back, its consumer or replica gone) is deliverable again only after
``delay * multiplier ** (count - 1)``; the messages behind it flow past meanwhile. Real brokers,
two replicas on one Redis; the bounds asserted are lower bounds (behaviour, not speed).
"""

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from amqpclient import connect, flush, nothing_more, receiver, send_all, settle
from exposition import samples, value
from processes import BrokerProcess
from proton import Delivery, Message, Timeout
from proton.utils import BlockingReceiver
from txnclient import Controller, accept_in

from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.store import keys
from shoal_broker.store.inspect import Inspector, QueueInfo

DELAY = {'SHOAL_REDELIVERY_DELAY_MS': '200', 'SHOAL_REDELIVERY_MULTIPLIER': '2'}
WAITS = (0.2, 0.4, 0.8)


def _next(rcv: BlockingReceiver, timeout: float = 15) -> tuple[Message, float]:
    message = rcv.receive(timeout=timeout)
    return message, time.monotonic()


@pytest.mark.timeout(90)
def test_a_message_failed_three_times_waits_200_400_800_ms_while_100_others_flow_past(
    start_broker: Callable[..., BrokerProcess], store_client: Any, address: str
) -> None:
    # declared on the queue (its policy, as the operator files it); the brokers have no default
    policy = EntityPolicy(redelivery_delay_ms=200, redelivery_multiplier=2.0)
    store_client.hset(keys.POLICIES, f'queue:{address}', policy.to_json())
    try:
        producing, consuming = start_broker(), start_broker()
        conn = connect(producing.url)
        send_all(conn, address, ['poison', *(f'm{i}' for i in range(100))])
        consumer = connect(consuming.url)
        rcv = receiver(consumer, address, credit=200)
        first, _ = _next(rcv)
        assert (first.body, first.delivery_count) == ('poison', 0)
        others: list[str] = []
        failures = 0
        failed_at = time.monotonic()
        settle(rcv, Delivery.MODIFIED, failed=True)
        flush(consumer)
        before_first_redelivery = None
        deadline = time.monotonic() + 60
        while (failures < 3 or len(others) < 100) and time.monotonic() < deadline:
            message, arrived = _next(rcv)
            if message.body != 'poison':
                others.append(message.body)
                rcv.accept()
                continue
            # a redelivery: not before its wait, with its count (JMSRedelivered)
            assert arrived - failed_at >= WAITS[failures], (failures, arrived - failed_at)
            assert message.delivery_count == failures + 1
            if before_first_redelivery is None:
                before_first_redelivery = len(others)
            failures += 1
            if failures < 3:
                failed_at = time.monotonic()
                settle(rcv, Delivery.MODIFIED, failed=True)
            else:
                rcv.accept()
            flush(consumer)
        assert failures == 3
        assert sorted(others) == sorted(f'm{i}' for i in range(100))  # each once, none lost
        assert before_first_redelivery  # the others went past the waiting message
        assert nothing_more(rcv)
        counted = value(samples(consuming), 'shoal_messages_redelivery_delayed_total',
                        address=address, subscription='queue')  # fmt: skip
        assert counted == 3  # one per failure
        consumer.close()
        conn.close()
    finally:
        store_client.hdel(keys.POLICIES, f'queue:{address}')


@pytest.mark.timeout(90)
def test_a_delay_survives_kill_9_of_the_replica_and_nothing_is_lost(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    env = {**DELAY, 'SHOAL_LEASE_SECONDS': '1.5'}
    survivor, doomed = start_broker(env=env), start_broker(env=env)
    conn = connect(survivor.url)
    bodies = ['poison', *(f'm{i}' for i in range(30))]
    send_all(conn, address, bodies)
    victim = connect(doomed.url)
    held = receiver(victim, address, credit=2)
    assert held.receive(timeout=10).body == 'poison'
    assert held.receive(timeout=10).body == 'm0'  # held unsettled: reclaimed after the crash
    failed_at = time.monotonic()
    settle(held, Delivery.MODIFIED, failed=True)  # poison: due in 200 ms, in Redis
    flush(victim)
    doomed.process.send_signal(signal.SIGKILL)
    doomed.process.wait(timeout=5)
    rcv = receiver(conn, address, credit=100)
    seen: dict[str, list[int]] = {}
    deadline = time.monotonic() + 45
    while set(seen) != set(bodies) and time.monotonic() < deadline:
        message, arrived = _next(rcv, timeout=30)
        seen.setdefault(message.body, []).append(message.delivery_count)
        if message.body == 'poison':
            assert arrived - failed_at >= WAITS[0]
        rcv.accept()
    flush(conn)
    assert set(seen) == set(bodies)  # nothing lost
    assert seen['poison'] == [1]  # redelivered once, flagged
    assert seen['m0'] == [1]
    # what the killed replica had sent ahead of its consumer's credit comes back flagged too
    assert all(seen[f'm{i}'] in ([0], [1]) for i in range(1, 30))
    assert nothing_more(rcv, wait=0.5)
    conn.close()


def test_a_transaction_rolled_back_gets_the_delay_too(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    b = start_broker(env=DELAY)
    conn = connect(b.url)
    send_all(conn, address, ['job'])
    control = Controller(conn)
    rcv = receiver(conn, address, credit=1)
    message = rcv.receive(timeout=10)
    for attempt in range(2):
        txn = control.declare()
        accept_in(rcv, txn)
        flush(conn)
        rolled_back_at = time.monotonic()
        assert control.discharge(txn, fail=True).remote_state == Delivery.ACCEPTED
        message, arrived = _next(rcv)
        assert arrived - rolled_back_at >= WAITS[attempt]
        assert (message.body, message.delivery_count) == ('job', attempt + 1)
    txn = control.declare()
    accept_in(rcv, txn)
    assert control.discharge(txn, fail=False).remote_state == Delivery.ACCEPTED
    assert nothing_more(receiver(conn, address, credit=1))
    conn.close()


def test_a_released_message_and_a_consumer_gone_wait_too_and_keep_their_counts(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    b = start_broker(env=DELAY)
    conn = connect(b.url)
    send_all(conn, address, ['back'])
    rcv = receiver(conn, address, credit=1)
    assert rcv.receive(timeout=10).body == 'back'
    released_at = time.monotonic()
    settle(rcv, Delivery.RELEASED)
    flush(conn)
    message, arrived = _next(rcv)
    assert arrived - released_at >= WAITS[0]
    assert message.delivery_count == 0  # released: the count is unchanged
    # the wait starts when the broker takes the detach, before its answer lets close() return
    closed_at = time.monotonic()
    rcv.close()  # unsettled: it goes back as modified(delivery-failed)
    message, arrived = _next(receiver(conn, address, credit=1))
    assert arrived - closed_at >= WAITS[0]
    assert message.delivery_count == 1
    conn.close()


def test_consumers_on_two_replicas_get_a_waiting_message_once_it_is_due(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    first, second = start_broker(env=DELAY), start_broker(env=DELAY)
    one, other = connect(first.url), connect(second.url)
    mine, theirs = receiver(one, address, credit=10), receiver(other, address, credit=10)
    send_all(one, address, ['only'])
    wait_for = time.monotonic() + 15
    got, holder = None, None
    while got is None and time.monotonic() < wait_for:  # whichever replica the sharing chose
        for rcv in (mine, theirs):
            try:
                got, holder = rcv.receive(timeout=0.2), rcv
                break
            except Timeout:
                continue
    assert got is not None
    assert holder is not None
    failed_at = time.monotonic()
    settle(holder, Delivery.MODIFIED, failed=True)
    flush(holder.connection)
    again = None
    while again is None and time.monotonic() < wait_for:
        for rcv in (mine, theirs):
            try:
                again = rcv.receive(timeout=0.2)
                arrived = time.monotonic()
                rcv.accept()
                flush(rcv.connection)
                break
            except Timeout:
                continue
    assert again is not None, 'the waiting message never came back'
    assert (again.body, again.delivery_count) == ('only', 1)
    assert arrived - failed_at >= WAITS[0]
    assert nothing_more(mine)
    assert nothing_more(theirs)
    one.close()
    other.close()


@pytest.mark.timeout(90)
def test_on_an_exclusive_queue_nothing_overtakes_a_waiting_message(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    """An exclusive queue keeps its order through a redelivery delay: messages sent while the
    failed one waits come after it, in order, on whichever replica they were sent."""
    env = {**DELAY, 'SHOAL_EXCLUSIVE_ADDRESSES': address}
    producing, consuming = start_broker(env=env), start_broker(env=env)
    consumer = connect(consuming.url)
    rcv = receiver(consumer, address, credit=20)
    conn = connect(producing.url)
    snd = send_all(conn, address, ['poison'])
    first, _ = _next(rcv)
    assert (first.body, first.delivery_count) == ('poison', 0)
    failed_at = time.monotonic()
    settle(rcv, Delivery.MODIFIED, failed=True)
    flush(consumer)
    for i in range(10):  # while the poison waits (200 ms): none of these may go ahead of it
        snd.send(Message(body=f'm{i}'))
    again, arrived = _next(rcv)
    assert (again.body, again.delivery_count) == ('poison', 1)
    assert arrived - failed_at >= WAITS[0]
    rcv.accept()
    rest = []
    for _ in range(10):
        message, _ = _next(rcv)
        rest.append(message.body)
        rcv.accept()
    assert rest == [f'm{i}' for i in range(10)]
    assert nothing_more(rcv)
    consumer.close()
    conn.close()


@pytest.mark.timeout(60)
def test_the_waiting_gauge_counts_a_message_while_it_waits_and_ready_leaves_it_out(
    start_broker: Callable[..., BrokerProcess], store_url: str, address: str
) -> None:
    """``shoal_redelivery_waiting_messages`` reads 1 while a failed message waits, and the
    queue's ready count leaves it out. The delay outlasts a backlog walk by any replica on the
    store: another broker of the run may be the one that walks, every 5 s by default."""
    quick = {'SHOAL_BACKLOG_REFRESH_SECONDS': '0.2', 'SHOAL_REDELIVERY_DELAY_MS': '30000'}
    b = start_broker(env=quick)
    conn = connect(b.url)
    send_all(conn, address, ['slow'])
    rcv = receiver(conn, address, credit=1)
    assert rcv.receive(timeout=10).body == 'slow'
    settle(rcv, Delivery.MODIFIED, failed=True)
    flush(conn)

    def waiting() -> float | None:
        return value(samples(b), 'shoal_redelivery_waiting_messages', address=address,
                     subscription='queue')  # fmt: skip

    async def row() -> QueueInfo:
        async with Inspector.from_url(store_url) as inspector:
            return (await inspector.queues([address]))[0]

    deadline = time.monotonic() + 20
    while waiting() != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert waiting() == 1
    found = asyncio.run(row())
    assert (found.backlog, found.ready) == (1, 0)  # returned, but no consumer may have it yet
    assert nothing_more(rcv)  # still waiting
    conn.close()
