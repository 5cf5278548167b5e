"""kill -9 of the Redis Cluster primary holding a topic's slot, with producers on both broker
replicas and the consumers of one shared durable subscription on both: in ``replicated`` mode,
with the hold and duplicate detection, nothing accepted is lost and nothing is delivered twice
(counted by body with the same ledger as the queue's failovers)."""

import time
import uuid

import pytest
from failoverload import INVISIBLE, ledger, receipts_of, tally
from jmswire import JmsSource
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from redisclusters import ClusterGroup

from shoal_broker.store import keys

LOAD = 4_000
SUBSCRIPTION = 'chaos|global'
"""A global shared durable subscription's link name, as Qpid JMS names it."""


def _shared() -> list[JmsSource]:
    return [JmsSource('topic', 'shared', 'global', durable=True)]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_primary_kill_under_a_shared_durable_subscription_delivers_nothing_twice(
    cluster,
) -> None:  # type: ignore[no-untyped-def]
    group = ClusterGroup()
    try:
        topic = f'chaos-{uuid.uuid4().hex[:8]}'
        a = cluster.broker(group.url, replica_id=f'cl-sa-{topic[-4:]}', env=INVISIBLE)
        b = cluster.broker(group.url, replica_id=f'cl-sb-{topic[-4:]}', env=INVISIBLE)
        run = ChaosRun(
            [ChaosProducer([a.url, b.url], topic, range(0, LOAD, 2), message_ids=True),
             ChaosProducer([b.url, a.url], topic, range(1, LOAD, 2), message_ids=True)],
            [ChaosConsumer([a.url, b.url], topic, SUBSCRIPTION, _shared(), credit=50),
             ChaosConsumer([b.url, a.url], topic, SUBSCRIPTION, _shared(), credit=50)],
            timeout=100,
        ).start()  # fmt: skip
        try:
            assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=40), run.log
            killed_at = time.monotonic()
            accepted_at_kill, received_at_kill = len(run.accepted), len(run.received)
            victim, _, promoted_at = group.kill_primary_of(keys.AddressKeys.of(topic).tag)
            group.restart(victim)  # the promoted primary's replica again: WAIT 1 confirms
            restarted_at = time.monotonic()
            finished = run.wait(ChaosRun.delivered_all, timeout=80)
            time.sleep(0.5)  # late duplicates
        finally:
            run.stop()
    finally:
        group.stop()
    counted = tally(run, killed_at)
    went = ledger(run)
    summary = (
        f'cluster primary killed under a shared durable subscription (replicated, durable '
        f'acks, hold, duplicate detection): {went}; {run.released} releases seen by the '
        f'producers; {accepted_at_kill} accepted and {received_at_kill} received at the kill; '
        f'promoted {promoted_at - killed_at:.2f} s, its replica back '
        f'{restarted_at - killed_at:.2f} s after the kill'
    )
    cluster.report(summary)
    assert accepted_at_kill < LOAD, summary  # killed under load
    assert received_at_kill < LOAD, summary
    assert not counted.lost, summary
    assert not went.lost, summary
    assert finished, summary
    assert went.twice == 0, f'{summary}; {receipts_of(run, counted.duplicates, killed_at)}'
    assert run.released == 0, summary  # held through the promotion, never released
