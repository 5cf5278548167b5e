"""A held send whose write the store leaves unanswered (amqp/holding.py, ``_give_up_overdue``):
the hold answers it at its bound all the same, and what is accepted is never lost.

A write the store never answers holds its producer for as long as nothing answers it; a
synchronous producer (Qpid JMS, one send at a time) waits with it. Here Redis itself holds the
write: ``WAIT`` for a replica that is frozen, on a connection whose socket timeout is longer than
the test, so no watchdog of the store ends it either.
"""

import signal
import time
import uuid
from typing import Any

import pytest
import redis
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from processes import LOOPBACK, wait_for

HOLD_SECONDS = 2
ENV = {
    'SHOAL_DURABILITY': 'replicated',
    'SHOAL_REPLICATION_TIMEOUT_MS': '90000',  # the WAIT a frozen replica holds: past the test
    'SHOAL_STORE_HOLD_SECONDS': str(HOLD_SECONDS),
}


def _given_up(b: Any) -> float:
    """shoal_held_sends_given_up_total{reason="time"} of a broker."""
    _, body = b.http_get('/metrics')
    for line in body.decode().splitlines():
        if line.startswith('shoal_held_sends_given_up_total{') and 'reason="time"' in line:
            return float(line.rsplit(' ', 1)[1])
    return 0.0


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize('sent_ahead', [False, True], ids=['published', 'sent-ahead'])
def test_a_held_send_whose_write_is_never_answered_is_rejected_at_the_hold_bound(
    cluster, sent_ahead: bool
) -> None:  # type: ignore[no-untyped-def]
    """The write a held send's rewrite makes waits for a frozen replica; the hold rejects the
    send at its bound with its reason, counted, and the producer goes on. With a consumer on the
    broker the send went ahead to it and is claimed (the path a cluster failover took)."""
    primary = cluster.redis()
    replica = cluster.redis('--replicaof', LOOPBACK, str(primary.port))
    wait_for(replica.linked, 15, 'the replica linked')
    b = cluster.broker(f'{primary.url}?socket_timeout=300', env=ENV)
    queue = f'overdue-{uuid.uuid4().hex[:8]}'
    count = 300
    consumers = [ChaosConsumer([b.url], queue, 'c0', credit=20)] if sent_ahead else []
    run = ChaosRun(
        [ChaosProducer([b.url], queue, range(count), window=1)], consumers, timeout=100
    ).start()
    admin = redis.Redis(host=LOOPBACK, port=primary.port, socket_timeout=5)
    thawed = False
    try:
        assert run.wait(lambda r: len(r.accepted) >= 20, timeout=60), run.state()
        replica.process.send_signal(signal.SIGSTOP)  # every WAIT from now on waits 90 s
        time.sleep(0.3)  # a send is waiting for its WAIT now
        # the store's connections cut: the waiting write fails and its send is held; written
        # again, it waits for the frozen replica, unanswered
        admin.execute_command('CLIENT', 'KILL', 'TYPE', 'normal')
        rejected = run.wait(lambda r: len(r.rejected) >= 1, timeout=30)
        given_up = _given_up(b)
        replica.process.send_signal(signal.SIGCONT)
        thawed = True
        done = run.wait(ChaosRun.producers_done, timeout=60)
        time.sleep(0.5)
    finally:
        if not thawed:
            replica.process.send_signal(signal.SIGCONT)
        admin.close()
        run.stop()
    assert rejected, run.state()
    assert done, run.state()
    drained = ChaosRun([], [ChaosConsumer([b.url], queue, 'drain', credit=100)], timeout=60)
    drained.start()
    try:
        drained.wait(lambda r: run.accepted - run.received <= r.received, timeout=45)
    finally:
        drained.stop()
    cluster.report(
        f'a held write never answered ({"sent ahead" if sent_ahead else "published"}): '
        f'{len(run.accepted)} accepted, {len(run.rejected)} rejected ({run.rejected[:1]}), '
        f'{run.released} released, {len(run.in_doubt)} in doubt'
    )
    assert all('amqp:resource-limit-exceeded' in c for _, c in run.rejected), run.rejected
    assert all(f'did not answer for {HOLD_SECONDS} s' in c for _, c in run.rejected)
    assert given_up >= 1
    assert run.released == 0
    assert not run.in_doubt
    assert run.accepted | {body for body, _ in run.rejected} == set(range(count))
    assert not run.accepted - run.received - drained.received  # nothing accepted is lost
    assert b.process.poll() is None
