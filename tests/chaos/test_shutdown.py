"""SIGTERM to a replica under load: a bounded, clean exit, and nothing accepted is lost."""

import collections
import time
import uuid

import pytest
import redis
from jmswire import JmsSource
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from proton import Message

from shoal_broker.store import keys

LOAD = 12_000
EXIT_BOUND_SECONDS = 15  # SHOAL_SHUTDOWN_GRACE_SECONDS defaults to 10
SHARED = 'shared-durable-subscription'


def _consumers(kind: str, address: str, stopping: str, other: str) -> list[ChaosConsumer]:
    """Two consumers on the replica that stops (they fail over to the other), one on the other."""
    if kind == 'queue':
        link, options = 'chaos-queue-consumer', []
    else:
        link, options = 'chaos|global', [JmsSource('topic', 'shared', 'global', durable=True)]
    return [
        ChaosConsumer(urls, address, link, list(options), credit=20)
        for urls in ([stopping, other], [stopping, other], [other])
    ]


def _stranded(redis_url: str, address: str, replica: str) -> set[int]:
    """Bodies of the entries still pending for ``replica`` in any group of ``address``."""
    client = redis.Redis.from_url(redis_url)
    try:
        stream = keys.AddressKeys.of(address).streams[5]
        bodies = set()
        for group in client.xinfo_groups(stream):
            for p in client.xpending_range(stream, group['name'], '-', '+', 10_000, replica):
                [(_, fields)] = client.xrange(stream, p['message_id'], p['message_id'])
                message = Message()
                message.decode(fields[b'h'] + fields[b'r'])
                bodies.add(message.body)
        return bodies
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_sigterm_under_load_exits_in_time_and_loses_no_accepted_message(
    cluster, record_property
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.redis()
    other = cluster.broker(server.url, replica_id='chaos-other')
    stopping = cluster.broker(server.url, replica_id='chaos-stopping')
    queue = f'chaos-{uuid.uuid4().hex[:8]}'
    half = LOAD // 2
    producers = [
        ChaosProducer([stopping.url, other.url], queue, range(half)),
        ChaosProducer([other.url], queue, range(half, LOAD)),
    ]
    run = ChaosRun(producers, _consumers('queue', queue, stopping.url, other.url), timeout=90)
    run.start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=60), run.log
        stopping.process.terminate()
        signalled_at = time.monotonic()
        code = stopping.process.wait(timeout=EXIT_BOUND_SECONDS + 5)
        took = time.monotonic() - signalled_at
        run.wait(ChaosRun.producers_done, timeout=30)
        finished = run.wait_while_progressing(ChaosRun.delivered_all, timeout=30)
        time.sleep(0.5)
    finally:
        run.stop()
    copies = collections.Counter(r.body for r in run.receipts)
    duplicates = sum(1 for n in copies.values() if n > 1)
    lost = run.accepted - run.received
    stranded = _stranded(server.url, queue, 'chaos-stopping') if lost else set()
    summary = (
        f'SIGTERM under load: exit code {code} after {took:.2f} s; accepted '
        f'{len(run.accepted)} of {LOAD}, {len(run.in_doubt)} in doubt '
        f'({len(run.in_doubt & run.received)} of them delivered), {len(run.receipts)} '
        f'deliveries, {duplicates} duplicates, {len(lost)} lost'
    )
    cluster.report(summary)
    record_property('exit_seconds', round(took, 2))
    record_property('duplicates', duplicates)
    assert code == 0, stopping.log()[-3000:]
    assert took < EXIT_BOUND_SECONDS, summary
    assert not lost, (
        f'{summary}; lost e.g. {sorted(lost)[:10]}, of which {len(lost & stranded)} still pending '
        f'for the stopped replica; its log:\n{stopping.log()[-3000:]}'
    )
    assert finished, summary


@pytest.mark.timeout(90)
@pytest.mark.parametrize('kind', ['queue', SHARED])
def test_sigterm_with_slow_redis_replies_loses_no_accepted_message(
    cluster, kind: str, record_property
) -> None:  # type: ignore[no-untyped-def]
    """Consumers on two replicas drain a backlog; Redis's replies to the replica about to stop
    take 0.2 s (a slow network or a busy Redis), so a fetch is in flight when SIGTERM comes."""
    server = cluster.redis()
    proxy = cluster.proxy(server)
    other = cluster.broker(server.url, replica_id='chaos-other')
    stopping = cluster.broker(proxy.url, replica_id='chaos-stopping')
    address = f'chaos-{uuid.uuid4().hex[:8]}'
    consumers = _consumers(kind, address, stopping.url, other.url)
    if kind == SHARED:  # the subscription must exist before the backlog is published
        first = ChaosRun([], consumers[2:], timeout=20).start()
        try:
            assert first.wait(lambda r: any('attached' in w for _, w in r.log), timeout=10)
        finally:
            first.stop()
    backlog = ChaosRun([ChaosProducer([other.url], address, range(8000))], [], timeout=60)
    backlog.start()
    try:
        assert backlog.wait(ChaosRun.producers_done, timeout=45), backlog.log
    finally:
        backlog.stop()
    run = ChaosRun([], consumers, timeout=60).start()
    try:
        assert run.wait(lambda r: len(r.received) >= 2000, timeout=30), run.log
        proxy.reply_delay = 0.2
        time.sleep(0.2)
        stopping.process.terminate()
        code = stopping.process.wait(timeout=EXIT_BOUND_SECONDS + 5)
        run.wait_while_progressing(lambda r: backlog.accepted <= r.received, quiet=5, timeout=30)
    finally:
        run.stop()
    lost = backlog.accepted - run.received
    stranded = _stranded(server.url, address, 'chaos-stopping')
    summary = (
        f'SIGTERM with slow replies ({kind}): exit code {code}; {len(lost)} of '
        f'{len(backlog.accepted)} accepted messages never delivered (e.g. {sorted(lost)[:5]}), '
        f'{len(stranded)} left pending for the replica that stopped'
    )
    cluster.report(summary)
    record_property('lost', len(lost))
    assert code == 0
    assert len(backlog.accepted) == 8000
    assert not lost, summary
