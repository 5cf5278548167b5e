"""Redis Cluster broken under load, with two broker replicas and reconnecting producers and
consumers (docs/redis-modes.md, "Redis Cluster"): kill -9 of the primary holding the queue's slot
(a replica is promoted; in ``replicated`` mode nothing accepted is lost), and the busy queue's
slot migrated to another primary key by key (ASK between batches, then MOVED; nothing lost, and
nothing delivered twice unless counted as a redelivery or sent twice after a release)."""

import time
import uuid

import pytest
from failoverload import REPLICATED, crossed_load, tally
from loadclient import ChaosRun
from redisclusters import ClusterGroup

from shoal_broker.store import keys

LOAD = 4_000


def _start(cluster, group: ClusterGroup, queue: str, env: dict[str, str],  # type: ignore[no-untyped-def]
           *, message_ids: bool = False) -> ChaosRun:  # fmt: skip
    a = cluster.broker(group.url, replica_id=f'cl-a-{queue[-4:]}', env=env)
    b = cluster.broker(group.url, replica_id=f'cl-b-{queue[-4:]}', env=env)
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


@pytest.mark.timeout(150)
def test_with_duplicate_detection_a_primary_kill_stores_no_resend_twice(cluster) -> None:  # type: ignore[no-untyped-def]
    """The same kill, producers resending with the same message-id and the address checking
    it: nothing delivered again with delivery-count 0 (stored twice, or a delivery undone)."""
    group = ClusterGroup()
    try:
        queue = f'chaos-{uuid.uuid4().hex[:8]}'
        env = {**REPLICATED, 'SHOAL_DUPLICATE_DETECTION': 'true'}
        run = _start(cluster, group, queue, env, message_ids=True)
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=40), run.log
            killed_at = time.monotonic()
            victim, _, _ = group.kill_primary_of(keys.AddressKeys.of(queue).tag)
            group.restart(victim)
            finished = run.wait(ChaosRun.delivered_all, timeout=80)
            time.sleep(0.5)  # late duplicates
        finally:
            run.stop()
    finally:
        group.stop()
    lost, _, summary = _accounting(run, killed_at)
    seen: set[object] = set()
    unmarked = []
    for receipt in sorted(run.receipts, key=lambda r: r.at):
        if receipt.body in seen and receipt.delivery_count == 0:
            unmarked.append(receipt.body)
        seen.add(receipt.body)
    summary += f', {len(unmarked)} of them again with delivery-count 0'
    cluster.report(f'cluster primary killed (replicated, duplicate detection): {summary}')
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert finished, summary
    assert not unmarked, f'{summary}; e.g. {unmarked[:10]}'


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
