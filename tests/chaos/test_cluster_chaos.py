"""Redis Cluster broken under load, with two broker replicas and reconnecting producers and
consumers (docs/redis-modes.md, "Redis Cluster"): kill -9 of the primary holding the queue's slot
(a replica is promoted; in ``replicated`` mode nothing accepted is lost), and the busy queue's
slot migrated to another primary key by key (ASK between batches, then MOVED; nothing lost, and
nothing delivered twice unless counted as a redelivery or sent twice after a release)."""

import collections
import time
import uuid

import pytest
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from redisclusters import ClusterGroup

from shoal_broker.store import keys

LOAD = 4_000
ROLLBACK_WINDOW = 1.0
"""Seconds before the kill within which a delivery may be undone by the failover (the last
fetches and acks a replica had not received)."""
REPLICATED = {'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '500'}


def _start(cluster, group: ClusterGroup, queue: str, env: dict[str, str]) -> ChaosRun:  # type: ignore[no-untyped-def]
    a = cluster.broker(group.url, replica_id=f'cl-a-{queue[-4:]}', env=env)
    b = cluster.broker(group.url, replica_id=f'cl-b-{queue[-4:]}', env=env)
    return ChaosRun(
        [ChaosProducer([a.url, b.url], queue, range(0, LOAD, 2)),
         ChaosProducer([b.url, a.url], queue, range(1, LOAD, 2))],
        [ChaosConsumer([a.url, b.url], queue, 'c0', credit=50),
         ChaosConsumer([b.url, a.url], queue, 'c1', credit=50)],
        timeout=100,
    ).start()  # fmt: skip


def _accounting(run: ChaosRun, since: float) -> tuple[set[int], set[int], str]:
    """(lost, duplicated without a reason, summary)."""
    lost = run.accepted - run.received
    by_body = collections.Counter(r.body for r in run.receipts)
    duplicates = {body for body, n in by_body.items() if n > 1}
    redelivered = {r.body for r in run.receipts if r.delivery_count > 0}
    first_at: dict[int, float] = {}
    for r in run.receipts:
        first_at.setdefault(r.body, r.at)
    unexplained = {
        body
        for body in (duplicates & run.accepted) - redelivered - run.released_bodies
        if first_at[body] < since - ROLLBACK_WINDOW
    }
    summary = (
        f'accepted {len(run.accepted)} of {LOAD}, {run.released} released and sent again, '
        f'{len(run.in_doubt)} in doubt, {len(run.received)} received, {len(lost)} lost, '
        f'{len(duplicates)} bodies delivered more than once, {len(redelivered)} redelivered'
    )
    return lost, unexplained, summary


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


@pytest.mark.timeout(150)
def test_migrating_a_busy_queues_slot_loses_nothing(cluster) -> None:  # type: ignore[no-untyped-def]
    group = ClusterGroup()
    try:
        queue = f'chaos-{uuid.uuid4().hex[:8]}'
        run = _start(cluster, group, queue, {})
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=40), run.log
            slot = group.keyslot(keys.AddressKeys.of(queue).tag)
            owner = group.owner_of_slot(slot)
            target = next(n for n in group.primaries() if n.port != owner)
            started = time.monotonic()
            moved = group.migrate_slot(
                slot, target, batch=2, between_batches=lambda: time.sleep(0.05)
            )
            finished = run.wait(ChaosRun.delivered_all, timeout=80)
            time.sleep(0.5)
        finally:
            run.stop()
    finally:
        group.stop()
    lost, unexplained, summary = _accounting(run, started)
    cluster.report(f'cluster slot migrated ({moved} keys): {summary}')
    assert moved > 0
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert finished, summary
    assert not unexplained, f'{summary}; e.g. {sorted(unexplained)[:10]}'
