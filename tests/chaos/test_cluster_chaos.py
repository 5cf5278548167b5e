"""Redis Cluster broken under load, with two broker replicas and reconnecting producers and
consumers (docs/redis-modes.md, "Redis Cluster"): kill -9 of the primary holding the queue's slot
(a replica is promoted; in ``replicated`` mode nothing accepted is lost), and the busy queue's
slot migrated to another primary key by key (ASK between batches, then MOVED; nothing lost, and
nothing delivered twice unless counted as a redelivery or sent twice after a release); with
the hold, duplicate detection and acks confirmed by a replica, a primary kill, and a migration
followed by the kill of the slot's new owner, deliver nothing twice and fail no send."""

import collections
import time
import uuid

import pytest
from failoverload import (
    BODIES_APART,
    INVISIBLE,
    REPLICATED,
    crossed_load,
    ledger,
    receipts_of,
    rhea_outcomes,
    rhea_producer,
    stop_load,
    tally,
)
from loadclient import ChaosRun
from processes import BrokerProcess
from redisclusters import ClusterGroup
from writability import SLACK_MS, cluster_writability

from shoal_broker.store import keys

LOAD = 4_000
RHEA_SENDS = 300
RHEA_PAUSE_MS = 30
"""The rhea producer's sends, one at a time this far apart: ~10 s, across the kill."""


def _pair(cluster, group: ClusterGroup, queue: str,  # type: ignore[no-untyped-def]
          env: dict[str, str]) -> tuple[BrokerProcess, BrokerProcess]:  # fmt: skip
    """Two brokers on the cluster, named after the queue."""
    a = cluster.broker(group.url, replica_id=f'cl-a-{queue[-4:]}', env=env)
    b = cluster.broker(group.url, replica_id=f'cl-b-{queue[-4:]}', env=env)
    return a, b


def _start(cluster, group: ClusterGroup, queue: str, env: dict[str, str],  # type: ignore[no-untyped-def]
           *, message_ids: bool = False) -> ChaosRun:  # fmt: skip
    a, b = _pair(cluster, group, queue, env)
    return crossed_load(a.url, b.url, queue, LOAD, message_ids=message_ids)


def _accounting(run: ChaosRun, since: float) -> tuple[set[int], set[int], str]:
    """(lost, duplicated without a reason, summary)."""
    counted = tally(run, since)
    summary = (
        f'accepted {len(run.accepted)} of {LOAD}, {run.released} released and sent again, '
        f'{len(run.in_doubt)} in doubt, {len(run.received)} received, '
        f'{len(counted.lost)} lost, {len(counted.duplicates)} bodies delivered more than once, '
        f'{len(counted.redelivered)} redelivered'
    )
    return counted.lost, counted.unexplained, summary


@pytest.mark.timeout(150)
def test_kill_9_of_the_primary_holding_the_queue_loses_no_accepted_message(cluster) -> None:  # type: ignore[no-untyped-def]
    group = ClusterGroup()
    try:
        queue = f'chaos-{uuid.uuid4().hex[:8]}'
        run = _start(cluster, group, queue, REPLICATED)
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=40), run.log
            killed_at = time.monotonic()
            victim, _, promoted_at = group.kill_primary_of(keys.AddressKeys.of(queue).tag)
            group.restart(victim)  # the promoted primary's replica again: WAIT 1 confirms
            finished = run.wait(ChaosRun.delivered_all, timeout=80)
            time.sleep(0.5)  # late duplicates
        finally:
            run.stop()
    finally:
        group.stop()
    lost, unexplained, summary = _accounting(run, killed_at)
    summary += f'; promoted {promoted_at - killed_at:.2f} s after the kill'
    cluster.report(f'cluster primary killed (replicated): {summary}')
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert finished, summary
    assert not unexplained, f'{summary}; e.g. {sorted(unexplained)[:10]}'


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_primary_kill_delivers_nothing_twice_and_fails_no_send(cluster) -> None:  # type: ignore[no-untyped-def]
    """The same kill with ``replicated`` durability (publishes, fetches and acks confirmed by a
    replica), the hold and duplicate detection, and a rhea producer sending synchronously, as
    Qpid JMS does, across it: nothing accepted lost, no body delivered twice, no send of the
    rhea producer fails, and each is answered within ``SLACK_MS`` of the slot's primary having
    a replica online again (``writability.py``)."""
    group = ClusterGroup()
    rhea = None
    watch = None
    try:
        queue = f'chaos-{uuid.uuid4().hex[:8]}'
        a, b = _pair(cluster, group, queue, INVISIBLE)
        run = crossed_load(a.url, b.url, queue, LOAD, message_ids=True)
        rhea_bodies = [f'rhea-{i}' for i in range(RHEA_SENDS)]
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=40), run.log
            watch = cluster_writability(group, group.keyslot(keys.AddressKeys.of(queue).tag))
            watch.start()
            rhea = rhea_producer(a.url, queue, rhea_bodies, pause_ms=RHEA_PAUSE_MS)
            # its first sends consumed before the kill: a connection opened during the outage is
            # refused (the ClientID check is not held), and rhea does not reconnect
            assert run.wait(lambda r: 'rhea-9' in r.received, timeout=30), run.log[-8:]
            killed_at = time.monotonic()
            victim, _, promoted_at = group.kill_primary_of(keys.AddressKeys.of(queue).tag)
            group.restart(victim)
            restarted_at = time.monotonic()
            sends = rhea_outcomes(rhea, rhea_bodies)
            finished = run.wait(lambda r: r.delivered_all() and sends.accepted <= r.received, 80)
            time.sleep(0.5)  # late duplicates
        finally:
            if watch is not None:
                watch.stop()
            stop_load(run, rhea)
    finally:
        group.stop()
    counted = tally(run, killed_at)
    went = ledger(run, sends.accepted)
    assert watch is not None
    late = watch.late_sends(sends.sent_at_ms, sends.waited_ms)
    summary = (
        f'cluster primary killed (replicated, durable acks, hold, duplicate detection): {went}; '
        f'{run.released} releases seen by the proton producers; rhea: '
        f'{collections.Counter(sends.outcomes)}, slowest send '
        f'{max(sends.waited_ms) / 1000:.2f} s, {len(late)} answered more than {SLACK_MS} ms '
        f'after the store was back; promoted {promoted_at - killed_at:.2f} s, its '
        f'replica back {restarted_at - killed_at:.2f} s after the kill; no replica confirming '
        f'writes for {watch.summary()}'
    )
    cluster.report(summary)
    assert not counted.lost, summary
    assert finished, summary
    assert went.twice == 0, f'{summary}; {receipts_of(run, counted.duplicates, killed_at)}'
    assert sends.outcomes == ['accepted'] * RHEA_SENDS, summary  # no send failed
    assert not late, f'{summary}; {late[:5]}'  # each within the outage it met + SLACK_MS
    assert run.released == 0, summary  # held through the promotion, never released


@pytest.mark.timeout(150)
@pytest.mark.parametrize(('env', 'batch'), [({}, 2), (BODIES_APART, 20)],
                         ids=['bodies-inline', 'bodies-apart'])  # fmt: skip
def test_migrating_a_busy_queues_slot_loses_nothing(
    cluster, env: dict[str, str], batch: int
) -> None:  # type: ignore[no-untyped-def]
    """``bodies-apart``: every body under a key of its own (``store/bodies.py``), so the slot
    holds a key per message and a publish's ``MULTI`` writes a new key in a slot on the move,
    which neither node takes while the address's keys are split between them (``ASK`` on the
    source, ``TRYAGAIN`` on the target): its writes wait in the hold until the keys have moved.
    A thousand keys and more move 20 at a time (``redis-cli --cluster reshard`` moves 10 per
    ``MIGRATE`` with no pause), so that they do within the hold's bound."""
    group = ClusterGroup()
    try:
        queue = f'chaos-{uuid.uuid4().hex[:8]}'
        run = _start(cluster, group, queue, env)
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=40), run.log
            slot = group.keyslot(keys.AddressKeys.of(queue).tag)
            owner = group.owner_of_slot(slot)
            target = next(n for n in group.primaries() if n.port != owner)
            started = time.monotonic()
            moved = group.migrate_slot(
                slot, target, batch=batch, between_batches=lambda: time.sleep(0.05)
            )
            finished = run.wait(ChaosRun.delivered_all, timeout=80)
            time.sleep(0.5)
        finally:
            run.stop()
    finally:
        group.stop()
    lost, unexplained, summary = _accounting(run, started)
    cluster.report(f'cluster slot migrated ({moved} keys, {env or "bodies inline"}): {summary}; '
                   f'{len(run.rejected)} rejected, e.g. {list(run.rejected)[:2]}')  # fmt: skip
    assert moved > 0
    assert not run.rejected, summary  # a migration is no outage: every send goes through
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert finished, summary
    assert not unexplained, f'{summary}; e.g. {sorted(unexplained)[:10]}'


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_migrated_slot_whose_new_owner_dies_delivers_nothing_twice(cluster) -> None:  # type: ignore[no-untyped-def]
    """The busy queue's slot moved to another primary key by key (ASK between batches, then
    MOVED), then that new owner killed, with what a failover should not show (``INVISIBLE``) and
    the rhea producer sending across both: nothing lost, nothing delivered twice, no send
    fails."""
    group = ClusterGroup()
    rhea = None
    try:
        queue = f'chaos-{uuid.uuid4().hex[:8]}'
        a, b = _pair(cluster, group, queue, INVISIBLE)
        run = crossed_load(a.url, b.url, queue, LOAD, message_ids=True)
        rhea_bodies = [f'rhea-{i}' for i in range(RHEA_SENDS)]
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 4, timeout=40), run.log
            rhea = rhea_producer(b.url, queue, rhea_bodies, pause_ms=RHEA_PAUSE_MS)
            slot = group.keyslot(keys.AddressKeys.of(queue).tag)
            target = next(n for n in group.primaries() if n.port != group.owner_of_slot(slot))
            started = time.monotonic()
            moved = group.migrate_slot(
                slot, target, batch=2, between_batches=lambda: time.sleep(0.05)
            )
            victim, _, _ = group.kill_primary_of(keys.AddressKeys.of(queue).tag)
            group.restart(victim)
            sends = rhea_outcomes(rhea, rhea_bodies)
            finished = run.wait(lambda r: r.delivered_all() and sends.accepted <= r.received, 80)
            time.sleep(0.5)  # late duplicates
        finally:
            stop_load(run, rhea)
    finally:
        group.stop()
    counted = tally(run, started)
    went = ledger(run, sends.accepted)
    summary = (
        f'cluster slot migrated ({moved} keys), then its new owner killed (replicated, durable '
        f'acks, hold, duplicate detection): {went}; {run.released} releases seen by the proton '
        f'producers; rhea: {collections.Counter(sends.outcomes)}, slowest send '
        f'{max(sends.waited_ms) / 1000:.2f} s'
    )
    cluster.report(summary)
    assert victim.port == target.port  # the kill hit the new owner
    assert not counted.lost, summary
    assert finished, summary
    assert went.twice == 0, f'{summary}; {receipts_of(run, counted.duplicates, started)}'
    assert sends.outcomes == ['accepted'] * RHEA_SENDS, summary  # no send failed
    assert run.released == 0, summary
