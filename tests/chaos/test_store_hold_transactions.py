"""A transacted producer, as a Qpid JMS transacted session drives one (jms-amqp-facts §7: sends
in a transaction, then a discharge waited for), through a Sentinel failover and a Redis Cluster
primary kill in ``replicated`` mode with duplicate detection (a commit the broker writes again,
its first write's outcome unknown, stores nothing twice): every commit completes, none fails,
each is answered within ``SLACK_MS`` of the store confirming writes again (``writability.py``),
and every message committed is consumed once."""

import collections
import threading
import time
import uuid
from typing import Any

import pytest
from failoverload import INVISIBLE
from loadclient import ChaosConsumer, ChaosRun
from proton import Described, Message, ulong
from proton.utils import BlockingConnection
from redisclusters import ClusterGroup
from txnclient import ACCEPTED, Controller, send_in
from writability import SLACK_MS, cluster_writability, sentinel_writability

from shoal_broker.store import keys

PER_TRANSACTION = 5


class TransactedProducer:
    """In a thread of its own: ``transactions`` transactions of PER_TRANSACTION sends each to
    ``queue``, one after the other, each discharge waited for up to ``wait`` seconds. Counts;
    never asserts."""

    def __init__(self, url: str, queue: str, transactions: int, wait: float = 60.0) -> None:
        self.url, self.queue, self.transactions, self.wait = url, queue, transactions, wait
        self.outcomes: list[tuple[int, Any, float]] = []
        """(transaction number, discharge outcome or the exception's text, seconds waited)."""
        self.sent_at_ms: list[int] = []
        self.waited_ms: list[int] = []
        """When each discharge was sent (ms since the epoch) and how long it waited."""
        self.committed: list[str] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> 'TransactedProducer':
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        conn = BlockingConnection(self.url, timeout=self.wait)
        try:
            controller = Controller(conn)
            sender = conn.create_sender(self.queue)
            for n in range(self.transactions):
                if self.stop.is_set():
                    return
                txn = controller.declare()
                bodies = [f't{n}-{i}' for i in range(PER_TRANSACTION)]
                for body in bodies:
                    # a message-id on each, as Qpid JMS sets: what duplicate detection keys on
                    message = Message(id=f'ID:{self.queue}:{body}', body=body, durable=True)
                    send_in(conn, sender, txn, message)
                sent_at, sent_at_ms = time.monotonic(), int(time.time() * 1000)
                try:
                    delivery = discharge(conn, controller, txn, self.wait)
                except Exception as exc:  # counted: a commit that failed
                    self.outcomes.append((n, f'{type(exc).__name__}: {exc}', 0.0))
                    return
                waited = time.monotonic() - sent_at
                self.outcomes.append((n, delivery.remote_state, waited))
                self.sent_at_ms.append(sent_at_ms)
                self.waited_ms.append(int(waited * 1000))
                if delivery.remote_state == ACCEPTED:
                    self.committed += bodies
        except Exception as exc:  # the connection itself failed
            self.outcomes.append((-1, f'{type(exc).__name__}: {exc}', 0.0))
        finally:
            conn.close()


def discharge(conn: BlockingConnection, controller: Controller, txn: bytes, wait: float) -> Any:
    """``Controller.discharge`` (commit), its answer waited for up to ``wait`` seconds."""
    link = controller.link
    conn.wait(lambda: link.credit > 0, timeout=wait, msg='coordinator credit')
    delivery = link.delivery(uuid.uuid4().hex)
    link.send(Message(body=Described(ulong(0x32), [txn, False])).encode())
    link.advance()
    conn.wait(lambda: delivery.settled, timeout=wait, msg='the discharge answered')
    return delivery


def _drained(url: str, queue: str, expected: set[str]) -> collections.Counter[Any]:
    run = ChaosRun([], [ChaosConsumer([url], queue, 'drain', credit=100)], timeout=60).start()
    try:
        run.wait(lambda r: expected <= r.received, timeout=45)
        time.sleep(1.0)  # anything delivered twice would come now
    finally:
        run.stop()
    return collections.Counter(receipt.body for receipt in run.receipts)


def _failed(producer: TransactedProducer) -> list[tuple[int, Any, float]]:
    return [outcome for outcome in producer.outcomes if outcome[1] != ACCEPTED]


@pytest.mark.timeout(180)
def test_a_transacted_producer_through_a_sentinel_failover_sees_no_commit_fail(cluster) -> None:  # type: ignore[no-untyped-def]
    group = cluster.sentinels()
    b = cluster.broker(group.url, replica_id='hold-txn-sentinel', env=INVISIBLE)
    queue = f'hold-txn-{uuid.uuid4().hex[:8]}'
    watch = sentinel_writability(group).start()
    producer = TransactedProducer(b.url, queue, transactions=150).start()
    try:
        deadline = time.monotonic() + 60
        while len(producer.outcomes) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        old = group.primary_port()
        assert old is not None
        killed_at = cluster.kill_9(group.running(old).process)
        new, promoted_at = group.wait_promoted(old, timeout=30)
        group.server('--replicaof', '127.0.0.1', str(new), port=old)
        group.wait_linked(old, timeout=15)
        linked_at = time.monotonic()
        producer.join(120)
    finally:
        producer.stop.set()
        watch.stop()
    counts = _drained(b.url, queue, set(producer.committed))
    slowest = max((waited for _, _, waited in producer.outcomes), default=0.0)
    late = watch.late_sends(producer.sent_at_ms, producer.waited_ms)
    cluster.report(
        f'sentinel failover (replicated) under a transacted producer: {len(producer.outcomes)} '
        f'discharges, {len(_failed(producer))} failed; promoted {promoted_at - killed_at:.2f} s, '
        f'linked {linked_at - killed_at:.2f} s after the kill; slowest commit {slowest:.2f} s, '
        f'{len(late)} answered more than {SLACK_MS} ms after the store was back; no replica '
        f'confirming writes for {watch.summary()}'
    )
    assert not _failed(producer), _failed(producer)[:3]
    assert len(producer.outcomes) == 150
    assert set(counts) == set(producer.committed)
    assert all(n == 1 for n in counts.values()), [b for b, n in counts.items() if n > 1][:10]
    assert not late, late[:5]


@pytest.mark.timeout(180)
def test_a_transacted_producer_through_a_cluster_primary_kill_sees_no_commit_fail(cluster) -> None:  # type: ignore[no-untyped-def]
    group = ClusterGroup()
    try:
        queue = f'hold-txn-{uuid.uuid4().hex[:8]}'
        b = cluster.broker(group.url, replica_id=f'hold-txn-cl-{queue[-4:]}', env=INVISIBLE)
        watch = cluster_writability(group, group.keyslot(keys.AddressKeys.of(queue).tag))
        watch.start()
        producer = TransactedProducer(b.url, queue, transactions=150).start()
        try:
            deadline = time.monotonic() + 60
            while len(producer.outcomes) < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            killed_at = time.monotonic()
            victim, _, promoted_at = group.kill_primary_of(keys.AddressKeys.of(queue).tag)
            group.restart(victim)  # the promoted primary's replica again: WAIT 1 confirms
            restarted_at = time.monotonic()
            producer.join(120)
        finally:
            producer.stop.set()
            watch.stop()
        counts = _drained(b.url, queue, set(producer.committed))
    finally:
        group.stop()
    slowest = max((waited for _, _, waited in producer.outcomes), default=0.0)
    late = watch.late_sends(producer.sent_at_ms, producer.waited_ms)
    cluster.report(
        f'cluster primary killed (replicated) under a transacted producer: '
        f'{len(producer.outcomes)} discharges, {len(_failed(producer))} failed; promoted '
        f'{promoted_at - killed_at:.2f} s, its replica back {restarted_at - killed_at:.2f} s '
        f'after the kill; slowest commit {slowest:.2f} s, {len(late)} answered more than '
        f'{SLACK_MS} ms after the store was back; no replica confirming writes for '
        f'{watch.summary()}'
    )
    assert not _failed(producer), _failed(producer)[:3]
    assert len(producer.outcomes) == 150
    assert set(counts) == set(producer.committed)
    assert all(n == 1 for n in counts.values()), [b for b, n in counts.items() if n > 1][:10]
    assert not late, late[:5]
