"""Sends held through a Redis outage (amqp/holding.py): a producer waiting for each outcome, as
Qpid JMS does, sees its sends wait and then accepted, never released; past the hold's bound, or
past its memory bound, it gets a clear rejection, and nothing accepted is lost. Consumers keep
their links meanwhile."""

import collections
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from failoverload import REPLICATED, synchronous_load
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from proton import Described, Message, ulong
from proton.utils import BlockingConnection
from redisclusters import ClusterGroup
from txnclient import ACCEPTED, Controller, send_in
from writability import sentinel_writability

from shoal_broker.store import keys

OUTAGE_SECONDS = 10.0
SENDS = 3_000


def _held(b: Any) -> dict[str, Any]:
    _, body = b.http_get('/readyz')
    return dict(json.loads(body))


def _copies(run: ChaosRun) -> collections.Counter[Any]:
    return collections.Counter(receipt.body for receipt in run.receipts)


def _diagnosis(run: ChaosRun, b: Any) -> str:
    """A failed run's clients (each link's credit and unanswered sends), what the broker says it
    holds, and the end of the broker's log."""
    try:
        held: Any = _held(b)
    except OSError as exc:  # the broker not answering is itself part of the picture
        held = f'/readyz did not answer: {exc!r}'
    return (
        f'\n{run.state()}\nclient log: {run.log[-10:]}\nbroker /readyz: {held}\n'
        f'broker log (last 12000 characters):\n{b.log()[-12_000:]}'
    )


def _twice(run: ChaosRun) -> int:
    """Bodies delivered more than once: a write no replica confirmed is written again (a copy,
    unless duplicate detection drops it), and acks the promoted replica had not received come
    again."""
    return sum(1 for n in _copies(run).values() if n > 1)


@pytest.mark.timeout(150)
def test_a_synchronous_producer_waits_through_a_10_s_redis_stop_and_no_send_fails(
    cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path)
    b = cluster.broker(server.url)
    queue = f'hold-{uuid.uuid4().hex[:8]}'
    run = ChaosRun(
        [ChaosProducer([b.url], queue, range(SENDS), window=1)],
        [ChaosConsumer([b.url], queue, 'c0', credit=20)],
        timeout=120,
    ).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= 200, timeout=60), run.log
        stopped_at = time.monotonic()
        server.stop()  # SIGTERM: Redis writes its AOF out and exits
        accepted_at_stop = len(run.accepted)
        # the send in flight is held: /readyz and the gauge say so, and nothing is answered
        assert run.wait(lambda r: _held(b).get('held_sends', 0) >= 1, timeout=10), _held(b)
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))
        during = _held(b)
        accepted_during = len(run.accepted) - accepted_at_stop
        cluster.restart(server)
        restarted_at = time.monotonic()
        assert run.wait(ChaosRun.delivered_all, timeout=90), (run.log[-10:], _held(b))
        time.sleep(0.5)  # anything delivered twice would come now
    finally:
        run.stop()
    copies = _copies(run)
    twice = sorted(body for body, n in copies.items() if n > 1)
    slowest = max(run.answer_seconds)
    cluster.report(
        f'redis stopped {restarted_at - stopped_at:.1f} s under a synchronous producer: '
        f'{len(run.accepted)} of {SENDS} accepted, {run.released} released, '
        f'{len(run.rejected)} rejected, {len(run.in_doubt)} in doubt, {len(twice)} delivered '
        f'twice; slowest send {slowest:.2f} s; during the outage {during}'
    )
    assert accepted_during == 0  # nothing is accepted that Redis does not have
    assert during['held_sends'] >= 1
    assert during['held_sends_oldest_seconds'] >= OUTAGE_SECONDS / 2
    assert run.released == 0
    assert not run.rejected
    assert not run.in_doubt
    assert run.accepted == set(range(SENDS))
    assert set(copies) == set(range(SENDS))
    assert not twice, twice[:10]
    # written again in the order they were sent: the one consumer got them in that order
    assert [receipt.body for receipt in run.receipts] == list(range(SENDS))
    assert slowest < OUTAGE_SECONDS + 5  # the held send completes soon after the store is back
    # the consumer kept its link and connection through the outage and received after it
    assert not [what for _, what in run.log if 'lost' in what or 'refused' in what], run.log
    assert any(receipt.at > restarted_at for receipt in run.receipts)
    assert _held(b)['held_sends'] == 0
    assert b.process.poll() is None


@pytest.mark.timeout(150)
def test_past_the_hold_bound_a_send_is_rejected_with_a_reason_and_nothing_accepted_is_lost(
    cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path)
    b = cluster.broker(server.url, env={'SHOAL_STORE_HOLD_SECONDS': '2'})
    queue = f'hold-{uuid.uuid4().hex[:8]}'
    count = 1_000
    run = ChaosRun([ChaosProducer([b.url], queue, range(count), window=1)], [], timeout=120).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= 100, timeout=60), run.log
        server.stop()
        stopped_at = time.monotonic()
        assert run.wait(lambda r: len(r.rejected) >= 2, timeout=20), (run.log, _held(b))
        given_up_after = time.monotonic() - stopped_at
        cluster.restart(server)
        assert run.wait(ChaosRun.producers_done, timeout=60), (run.log[-10:], _held(b))
    finally:
        run.stop()
    drained = ChaosRun([], [ChaosConsumer([b.url], queue, 'drain', credit=100)], timeout=60)
    drained.start()
    try:
        drained.wait(lambda r: run.accepted <= r.received, timeout=45)
    finally:
        drained.stop()
    rejected = {body for body, _ in run.rejected}
    cluster.report(
        f'redis stopped past a 2 s hold: {len(run.accepted)} accepted, {len(rejected)} '
        f'rejected (first after {given_up_after:.1f} s), {run.released} released, '
        f'{len(run.in_doubt)} in doubt; e.g. {run.rejected[:1]}'
    )
    assert run.released == 0
    assert all('amqp:resource-limit-exceeded' in condition for _, condition in run.rejected)
    assert all('did not answer for 2 s' in condition for _, condition in run.rejected)
    assert given_up_after >= 2.0
    assert not run.in_doubt
    assert run.accepted | rejected == set(range(count))
    assert not run.accepted - drained.received  # nothing accepted is lost
    assert b.process.poll() is None


@pytest.mark.timeout(120)
def test_a_commit_during_a_redis_stop_waits_and_completes(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path)
    b = cluster.broker(server.url)
    queue = f'hold-txn-{uuid.uuid4().hex[:8]}'
    conn = BlockingConnection(b.url, timeout=60)
    try:
        controller = Controller(conn)
        sender = conn.create_sender(queue)
        txn = controller.declare()
        for i in range(5):
            assert send_in(conn, sender, txn, f'm{i}').remote_state != 0
        server.stop()
        stopped_at = time.monotonic()
        restart = threading.Timer(OUTAGE_SECONDS / 2, lambda: cluster.restart(server))
        restart.start()
        link = controller.link
        conn.wait(lambda: link.credit > 0, timeout=10, msg='coordinator credit')
        # a discharge as Controller.discharge sends it, waited for longer than its 10 s
        delivery = link.delivery(uuid.uuid4().hex)
        link.send(Message(body=Described(ulong(0x32), [txn, False])).encode())
        link.advance()
        conn.wait(lambda: delivery.settled, timeout=60, msg='the discharge answered')
        answered_after = time.monotonic() - stopped_at
        restart.join()
        assert delivery.remote_state == ACCEPTED, delivery.remote.condition
        receiver = conn.create_receiver(queue, credit=10)
        bodies = [receiver.receive(timeout=10).body for _ in range(5)]
        receiver.accept()
    finally:
        conn.close()
    cluster.report(f'a commit during a {OUTAGE_SECONDS / 2:g} s redis stop: accepted after '
                   f'{answered_after:.1f} s')  # fmt: skip
    assert bodies == [f'm{i}' for i in range(5)]
    assert answered_after >= OUTAGE_SECONDS / 2 - 0.5


@pytest.mark.timeout(150)
def test_a_synchronous_producer_through_a_sentinel_failover_sees_no_send_fail(cluster) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the primary in ``replicated`` mode: the sends wait through the promotion and
    until the promoted primary has a replica that confirms them, then complete."""
    group = cluster.sentinels()
    b = cluster.broker(group.url, replica_id='hold-sentinel', env=REPLICATED)
    queue = f'hold-{uuid.uuid4().hex[:8]}'
    count = 1_500
    run = synchronous_load(b.url, queue, count, timeout=120)
    watch = sentinel_writability(group).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= 200, timeout=60), run.log
        old = group.primary_port()
        assert old is not None
        killed_at = cluster.kill_9(group.running(old).process)
        killed_epoch = time.time()
        new, promoted_at = group.wait_promoted(old, timeout=30)
        group.server('--replicaof', '127.0.0.1', str(new), port=old)
        group.wait_linked(old, timeout=15)
        linked_at = time.monotonic()
        assert run.wait(ChaosRun.delivered_all, timeout=90), _diagnosis(run, b)
        time.sleep(0.5)
    finally:
        run.stop()
        watch.stop()
    slowest = max(run.answer_seconds)
    # on a busy machine the sentinels may promote twice (writability.py): the primary then has no
    # replica for seconds more and sends wait meanwhile, so the bound counts from the end of the
    # last outage the watch saw
    back = max([linked_at - killed_at, *(end - killed_epoch for _, end in watch.outages)])
    cluster.report(
        f'sentinel failover (replicated) under a synchronous producer: {len(run.accepted)} of '
        f'{count} accepted, {run.released} released, {len(run.rejected)} rejected, '
        f'{len(run.in_doubt)} in doubt, {_twice(run)} delivered twice; promoted '
        f'{promoted_at - killed_at:.2f} s and linked {linked_at - killed_at:.2f} s after the '
        f'kill, writable again {back:.2f} s after it; outages {watch.summary()}; slowest send '
        f'{slowest:.2f} s'
    )
    assert run.released == 0
    assert not run.rejected
    assert not run.in_doubt, run.log
    assert run.accepted == set(range(count))
    assert not run.missing()
    # answered soon after a replica confirms again
    assert slowest < back + 5, _diagnosis(run, b)
    assert b.process.poll() is None


@pytest.mark.timeout(180)
def test_a_synchronous_producer_through_a_cluster_primary_kill_sees_no_send_fail(cluster) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the primary serving the queue's slot in ``replicated`` mode: the lanes' own
    retries and then the hold carry the sends through the promotion."""
    group = ClusterGroup()
    try:
        queue = f'hold-{uuid.uuid4().hex[:8]}'
        b = cluster.broker(group.url, replica_id=f'hold-cl-{queue[-4:]}', env=REPLICATED)
        count = 1_500
        run = synchronous_load(b.url, queue, count, timeout=150)
        try:
            assert run.wait(lambda r: len(r.accepted) >= 200, timeout=60), run.log
            killed_at = time.monotonic()
            victim, _, promoted_at = group.kill_primary_of(keys.AddressKeys.of(queue).tag)
            group.restart(victim)  # the promoted primary's replica again: WAIT 1 confirms
            restarted_at = time.monotonic()
            finished = run.wait(ChaosRun.delivered_all, timeout=100)
            time.sleep(0.5)
            # what a failure needs to be understood, read while the broker and store still run
            clean = finished and not run.rejected and not run.released
            diagnosis = '' if clean else _diagnosis(run, b)
        finally:
            run.stop()
    finally:
        group.stop()
    slowest = max(run.answer_seconds)
    cluster.report(
        f'cluster primary killed (replicated) under a synchronous producer: '
        f'{len(run.accepted)} of {count} accepted, {run.released} released, '
        f'{len(run.rejected)} rejected, {len(run.in_doubt)} in doubt, {_twice(run)} delivered '
        f'twice; promoted '
        f'{promoted_at - killed_at:.2f} s, its replica back {restarted_at - killed_at:.2f} s after '
        f'the kill; slowest send {slowest:.2f} s'
    )
    assert finished, diagnosis
    assert run.released == 0, diagnosis
    assert not run.rejected, (run.rejected[:3], diagnosis)
    assert not run.in_doubt, run.log
    assert run.accepted == set(range(count))
    assert slowest < restarted_at - killed_at + 5


@pytest.mark.timeout(120)
def test_past_the_memory_bound_a_held_send_is_rejected_at_once(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A producer with 20 sends in flight while Redis is stopped: the hold keeps what fits in
    SHOAL_STORE_HOLD_MAX_BYTES and rejects the rest at once; what it kept is accepted after."""
    server = cluster.aof_redis(tmp_path)
    b = cluster.broker(server.url, env={'SHOAL_STORE_HOLD_MAX_BYTES': '4000'})
    queue = f'hold-{uuid.uuid4().hex[:8]}'
    bodies = [f'{n:05d}' + 'x' * 1000 for n in range(5_000)]  # about 1 KiB each, once encoded
    run = ChaosRun([ChaosProducer([b.url], queue, bodies, window=20)], [], timeout=90).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= 20, timeout=60), run.log
        server.stop()
        assert run.wait(lambda r: len(r.rejected) >= 5, timeout=20), (run.log, _held(b))
        during = _held(b)
        cluster.restart(server)
        assert run.wait(ChaosRun.producers_done, timeout=60), (run.log[-10:], _held(b))
    finally:
        run.stop()
    cluster.report(
        f'held sends past a 4000-byte bound: {len(run.accepted)} accepted, {len(run.rejected)} '
        f'rejected, {run.released} released; held during the outage: {during}'
    )
    assert 1 <= during['held_sends'] <= 3  # what fits in 4000 bytes
    assert run.released == 0
    assert all('amqp:resource-limit-exceeded' in c for _, c in run.rejected)
    assert all('4000 bytes of messages are held' in c for _, c in run.rejected)
    assert run.accepted | {body for body, _ in run.rejected} == set(bodies)
