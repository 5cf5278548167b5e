"""kill -9 of one of two replicas in the middle of a load on a shared durable subscription."""

import collections
import time
import uuid

import pytest
import redis as redis_client
from jmswire import JmsSource
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun

TOTAL = 20_000
BOUND_SECONDS = 120


@pytest.mark.timeout(200)
def test_kill_9_of_a_replica_under_load_loses_no_accepted_message(cluster, record_property) -> None:  # type: ignore[no-untyped-def]
    redis = cluster.redis()
    survivor = cluster.broker(redis.url, env=cluster.FAST_LEASE, replica_id='chaos-survivor')
    doomed = cluster.broker(redis.url, env=cluster.FAST_LEASE, replica_id='chaos-doomed')
    topic = f'chaos-{uuid.uuid4().hex[:8]}'
    source = JmsSource('topic', 'shared', 'global', durable=True)
    consumers = [
        ChaosConsumer(urls, topic, 'chaos|global', [source], credit=20)
        for urls in ([survivor.url], [survivor.url], [doomed.url, survivor.url],
                     [doomed.url, survivor.url])
    ]  # fmt: skip
    half = TOTAL // 2
    producers = [
        ChaosProducer([survivor.url], topic, range(half)),
        ChaosProducer([doomed.url, survivor.url], topic, range(half, TOTAL)),
    ]
    admin = redis_client.Redis.from_url(redis.url)
    watchers_key = f'shoal:{{a:{topic}}}:watchers'
    run = ChaosRun(producers, consumers, timeout=BOUND_SECONDS).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= TOTAL // 3, timeout=60), run.log
        watched_at_kill = admin.hkeys(watchers_key)
        assert b'chaos-doomed' in watched_at_kill, watched_at_kill
        killed_at = cluster.kill_9(doomed.process)
        accepted_at_kill = len(run.accepted)
        finished = run.wait(ChaosRun.delivered_all, timeout=BOUND_SECONDS - 10)
        done_at = time.monotonic()
        time.sleep(1.0)  # late duplicates
    finally:
        run.stop()

    lost = run.accepted - run.received
    assert not lost, (
        f'{len(lost)} accepted messages never delivered (e.g. {sorted(lost)[:10]}); '
        f'accepted {len(run.accepted)}, in doubt {len(run.in_doubt)}, log {run.log[-10:]}'
    )
    assert finished, run.log[-10:]
    by_body: dict[int, list] = collections.defaultdict(list)  # type: ignore[type-arg]
    for receipt in run.receipts:
        by_body[receipt.body].append(receipt)
    duplicates = {body: got for body, got in by_body.items() if len(got) > 1}
    returned = cluster.reaped_entries(survivor.log(), 'chaos-doomed')
    redelivered = [r for r in run.receipts if r.delivery_count > 0]
    recovery = min(r.at for r in redelivered) - killed_at if redelivered else None
    summary = (
        f'kill -9 under load: accepted {len(run.accepted)} of {TOTAL} ({accepted_at_kill} before '
        f'the kill, {len(run.in_doubt)} in doubt of which {len(run.in_doubt & run.received)} '
        f'delivered, {run.released} released), '
        f'{len(run.receipts)} deliveries, {len(duplicates)} duplicates, {returned} entries '
        f'returned by the reaper, {len(redelivered)} redeliveries, first redelivery '
        f'{recovery and round(recovery, 2)} s after the kill, everything delivered '
        f'{round(done_at - killed_at, 2)} s after the kill'
    )
    cluster.report(summary)
    record_property('duplicates', len(duplicates))
    record_property('recovery_seconds', recovery)
    # duplicates only of deliveries the killed replica had out, unacknowledged, at the kill: the
    # first copy came from it before the kill, the second from the survivor, counted as redelivery
    for body, got in duplicates.items():
        first, *again = got
        # Only the killed replica's in-flight deliveries may come twice: first from it (a dead
        # process sends nothing, so no clock comparison is needed), then again from the survivor.
        assert first.url == doomed.url, (body, got, summary)
        assert all(r.url == survivor.url and r.delivery_count >= 1 for r in again), (body, got)
        assert len(got) == 2, (body, got)
    assert len(duplicates) <= returned, summary
    assert recovery is not None, summary
    assert recovery < 10, summary
    assert not run.rejected, run.rejected[:5]
    # the reaper took the dead replica off the topic's watchers: publishes stop waking it
    assert b'chaos-doomed' not in admin.hkeys(watchers_key), watched_at_kill
