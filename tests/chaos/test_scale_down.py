"""
A scale-down nobody notices: replicas go 4 → 2 → 4 → 1 under a steady JMS-shaped load that
reaches them through one address (a Service), and the app sees nothing but a short pause.

The replicas share the test run's store (any mode: SHOAL_TEST_STORE). Each replica that goes
is first dropped from the balancer (its readiness going false and kube-proxy routing new
connections elsewhere), then sent SIGTERM, as Kubernetes does; new ones are started and added.
Producers send persistent messages synchronously at a steady rate, consumers auto-acknowledge;
both fail over through the same address (``jmsfailover.py``).
"""

import collections
import statistics
import time
import uuid

import pytest
from balancer import Balancer
from jmsfailover import FailoverRun
from processes import BrokerProcess

PRODUCERS = CONSUMERS = 3
RATE = 50.0 / PRODUCERS
"""Messages a second per producer: 50 a second in all."""
PHASE_SECONDS = 7.0
STEPS = (4, 2, 4, 1)
MAX_PAUSE_SECONDS = 2.0
EXIT_BOUND_SECONDS = 15.0


def _scale(cluster, balancer: Balancer, live: list[BrokerProcess], redis_url: str, to: int,
           names: collections.Counter[str]) -> list[float]:  # type: ignore[no-untyped-def]  # fmt: skip
    """Start or stop replicas until ``to`` run; returns the seconds each stopped one took."""
    took = []
    while len(live) < to:
        names['started'] += 1
        b = cluster.broker(redis_url, replica_id=f'scale-{names["started"]}')
        live.append(b)
        balancer.add(b.port)
    going = live[to:]
    del live[to:]
    for b in going:  # readiness false: no new connection reaches them
        balancer.drop(b.port)
    started = time.monotonic()
    for b in going:
        b.process.terminate()
    for b in going:
        code = b.process.wait(timeout=EXIT_BOUND_SECONDS + 5)
        took.append(time.monotonic() - started)
        assert code == 0, b.log()[-3000:]
        assert 'drained in' in b.log(), b.log()[-3000:]  # every connection left owing nothing
    return took


@pytest.mark.timeout(180)
def test_replicas_go_4_2_4_1_under_a_steady_jms_load_and_nobody_notices(
    cluster, store_url: str, record_property
) -> None:  # type: ignore[no-untyped-def]
    balancer = Balancer()
    names: collections.Counter[str] = collections.Counter()
    live: list[BrokerProcess] = []
    queue = f'scale-{uuid.uuid4().hex[:8]}'
    stops: list[float] = []
    steps: list[tuple[float, str]] = []
    """(when a step began, which): to tell where the longest pause fell."""
    try:
        _scale(cluster, balancer, live, store_url, STEPS[0], names)
        run = FailoverRun(
            balancer.url, queue, producers=PRODUCERS, consumers=CONSUMERS, rate=RATE
        ).start()
        try:
            assert run.wait(FailoverRun.attached, timeout=20), run.errors
            run.send_for(PHASE_SECONDS * len(STEPS))
            for to in STEPS[1:]:
                time.sleep(PHASE_SECONDS)
                steps.append((time.monotonic(), f'{len(live)}→{to}'))
                stops += _scale(cluster, balancer, live, store_url, to, names)
            assert run.wait(FailoverRun.sending_done, timeout=PHASE_SECONDS + 20)
            run.wait(lambda r: r.accepted <= r.received(), timeout=20)
            time.sleep(0.5)  # late duplicates
        finally:
            run.stop()
    finally:
        balancer.close()
    by_body = collections.Counter(r.body for r in run.receipts)
    duplicates = {b for b, n in by_body.items() if n > 1}
    flagged = {r.body for r in run.receipts if r.delivery_count > 0}
    first: dict[int, float] = {}
    for r in run.receipts:
        first.setdefault(r.body, r.at)
    pause = {b: first[b] - run.intended[b] for b in first if b in run.intended}
    pauses = sorted(pause.values())
    lost = run.accepted - run.received()
    p50, worst = statistics.median(pauses), pauses[-1]
    slowest = max(pause, key=pause.__getitem__)
    worst_due = run.intended[slowest]
    legs = (f'sent +{run.sent_at[slowest] - worst_due:.2f} s, accepted '
            f'+{run.accepted_at[slowest] - worst_due:.2f} s')  # fmt: skip
    during = [f'{what} +{worst_due - at:.1f} s' for at, what in steps if at <= worst_due][-1:]
    summary = (
        f'4→2→4→1: {len(run.intended)} sent, {len(run.accepted)} accepted, {len(run.failed)} '
        f'failed, {run.resent} sent again after a failover, {len(lost)} lost, {len(duplicates)} '
        f'duplicates ({len(duplicates - flagged)} not flagged redelivered), {run.moves} '
        f'reconnects; pause p50 {p50 * 1000:.0f} ms, max {worst * 1000:.0f} ms (due at '
        f'{during or "the start"}, {legs}); replicas '
        f'stopped in {max(stops):.2f} s at most; errors {run.errors[:3]}'
    )
    cluster.report(summary)
    record_property('pause_p50_ms', round(p50 * 1000))
    record_property('pause_max_ms', round(worst * 1000))
    record_property('duplicates', len(duplicates))
    assert run.moves >= 2, summary  # clients did move
    assert not run.failed, summary
    assert len(run.accepted) == len(run.intended) >= 50 * PHASE_SECONDS * 3, summary
    assert not lost, summary
    assert duplicates <= flagged, summary  # at least once, and a redelivery says so
    assert worst <= MAX_PAUSE_SECONDS, summary
    assert not [e for e in run.errors if e.startswith('link')], summary
