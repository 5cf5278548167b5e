"""Redis killed, frozen or restarted under load: nothing accepted is lost, the broker recovers."""

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun, Receipt

from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.store import keys

LOAD = 15_000
OUTAGE_SECONDS = 5.0
CUTS = 10


def _queue() -> str:
    return f'chaos-{uuid.uuid4().hex[:8]}'


def _config_dir(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        return str(client.config_get('dir')['dir'])
    finally:
        client.close()


def _unmarked_redeliveries(receipts: list[Receipt]) -> list[Any]:
    """Messages delivered again with delivery-count 0 (JMSRedelivered false) although they
    were delivered before: the application may already have processed them."""
    seen: set[Any] = set()
    unmarked = []
    for receipt in sorted(receipts, key=lambda r: r.at):
        if receipt.body in seen and receipt.delivery_count == 0:
            unmarked.append(receipt.body)
        seen.add(receipt.body)
    return unmarked


def _publish_one(url: str, address: str) -> None:
    one = ChaosRun([ChaosProducer([url], address, ['one more'])], [], timeout=20).start()
    try:
        one.wait(ChaosRun.producers_done, timeout=15)
    finally:
        one.stop()


def _drain(url: str, queue: str, expected: set[int]) -> ChaosRun:
    """Consume ``queue`` until everything expected came and nothing more for a second."""
    run = ChaosRun([], [ChaosConsumer([url], queue, 'drain', credit=200)], timeout=60).start()
    try:
        run.wait(lambda r: expected <= r.received, timeout=45)
        seen = -1
        while seen != len(run.receipts):  # whatever else is there (stored, answer lost)
            seen = len(run.receipts)
            time.sleep(1.0)
    finally:
        run.stop()
    return run


@pytest.mark.timeout(120)
def test_fsync_kill_9_of_redis_under_load_loses_no_accepted_message(
    cluster, tmp_path: Path, record_property
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path, fsync_always=True)
    assert _config_dir(server.url) == str(tmp_path)  # the same dir survives the restart
    b = cluster.broker(server.url, env={'SHOAL_DURABILITY': 'fsync'})
    queue = _queue()
    run = ChaosRun([ChaosProducer([b.url], queue, range(LOAD))], [], timeout=90).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=60), run.log
        killed_at = cluster.kill_9(server.process)
        accepted_at_kill = len(run.accepted)
        time.sleep(1.0)
        restarted = cluster.restart(server)
        assert _config_dir(restarted.url) == str(tmp_path)
        ready_after = cluster.wait_ready(b, timeout=30)
        assert run.wait(ChaosRun.producers_done, timeout=60), run.log[-10:]
        recovered = time.monotonic() - killed_at
    finally:
        run.stop()
    assert ready_after is not None, b.log()[-3000:]
    drained = _drain(b.url, queue, run.accepted)
    lost = run.accepted - drained.received
    summary = (
        f'fsync, redis kill -9: accepted {len(run.accepted)} of {LOAD} ({accepted_at_kill} '
        f'before the kill), {run.released} released and sent again, {len(run.in_doubt)} in '
        f'doubt, {len(drained.received)} drained, {len(lost)} lost; ready again '
        f'{ready_after:.2f} s after the restart, every send answered {recovered:.2f} s after '
        f'the kill'
    )
    cluster.report(summary)
    record_property('recovery_seconds', round(recovered, 2))
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert len(run.accepted) + len(run.in_doubt) == LOAD, summary
    assert b.process.poll() is None  # the broker itself was never restarted


@pytest.mark.timeout(120)
def test_redis_frozen_for_5_s_under_load_loses_nothing_and_the_service_resumes(
    cluster, record_property
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.redis()
    b = cluster.broker(server.url)
    queue = _queue()
    run = ChaosRun(
        [ChaosProducer([b.url], queue, range(LOAD))],
        [ChaosConsumer([b.url], queue, f'c{i}', credit=50) for i in range(2)],
        timeout=90,
    ).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=60), run.log
        server.process.send_signal(signal.SIGSTOP)
        try:
            frozen_at = time.monotonic()
            time.sleep(1.5)
            during = (len(run.accepted), cluster.ready(b))  # takes up to 2 s
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - frozen_at)))
        finally:
            server.process.send_signal(signal.SIGCONT)
        thawed_at = time.monotonic()
        ready_after = cluster.wait_ready(b, timeout=30)
        accepted_at_thaw = len(run.accepted)
        assert run.wait(lambda r: len(r.accepted) > accepted_at_thaw, timeout=30), run.log[-10:]
        first_accept_after = time.monotonic() - thawed_at
        finished = run.wait(ChaosRun.delivered_all, timeout=60)
        time.sleep(0.5)
    finally:
        run.stop()
    lost = run.accepted - run.received
    summary = (
        f'redis frozen {thawed_at - frozen_at:.1f} s: accepted {len(run.accepted)} of {LOAD} '
        f'({during[0]} during the freeze, ready then: {during[1]}), {run.released} '
        f'released, {len(run.in_doubt)} in doubt ({len(run.in_doubt & run.received)} of them '
        f'delivered), {len(lost)} lost; ready again {ready_after and round(ready_after, 2)} s '
        f'and a new accept {first_accept_after:.2f} s after the thaw; '
        f'log {[what for _, what in run.log if "attached" not in what][:6]}'
    )
    cluster.report(summary)
    record_property('recovery_seconds', round(first_accept_after, 2))
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert finished, summary
    assert ready_after is not None, summary
    assert not during[1], 'a frozen Redis must not look ready'
    assert b.process.poll() is None


@pytest.mark.timeout(120)
def test_redis_stopped_and_restarted_under_load_loses_nothing_and_the_service_resumes(
    cluster, tmp_path: Path, record_property
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path)  # memory durability; the AOF keeps a clean stop
    b = cluster.broker(server.url)
    queue = _queue()
    run = ChaosRun(
        [ChaosProducer([b.url], queue, range(LOAD))],
        [ChaosConsumer([b.url], queue, f'c{i}', credit=50) for i in range(2)],
        timeout=90,
    ).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= LOAD // 3, timeout=60), run.log
        stopped_at = time.monotonic()
        server.stop()  # SIGTERM: Redis writes its AOF out and exits
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))
        during = cluster.ready(b)
        restarted = cluster.restart(server)
        restarted_at = time.monotonic()
        ready_after = cluster.wait_ready(b, timeout=30)
        accepted_at_restart = len(run.accepted)
        assert run.wait(lambda r: len(r.accepted) > accepted_at_restart, timeout=30), run.log[-10:]
        first_accept_after = time.monotonic() - restarted_at
        finished = run.wait(ChaosRun.delivered_all, timeout=60)
        time.sleep(0.5)
    finally:
        run.stop()
    assert _config_dir(restarted.url) == str(tmp_path)
    lost = run.accepted - run.received
    summary = (
        f'redis stopped {restarted_at - stopped_at:.1f} s: accepted {len(run.accepted)} of '
        f'{LOAD}, {run.released} released, {len(run.in_doubt)} in doubt '
        f'({len(run.in_doubt & run.received)} of them delivered), {len(lost)} lost; ready '
        f'during the outage: {during}; ready again {ready_after and round(ready_after, 2)} s and '
        f'a new accept {first_accept_after:.2f} s after the restart; '
        f'log {[what for _, what in run.log if "attached" not in what][:6]}'
    )
    cluster.report(summary)
    record_property('recovery_seconds', round(first_accept_after, 2))
    assert not lost, f'{summary}; lost e.g. {sorted(lost)[:10]}'
    assert finished, summary
    assert ready_after is not None, summary
    assert not during
    assert b.process.poll() is None


@pytest.mark.timeout(120)
def test_replies_lost_on_the_way_from_redis_strand_no_accepted_message(
    cluster, record_property
) -> None:  # type: ignore[no-untyped-def]
    """The network between broker and Redis loses Redis's replies for 0.1 s, then resets the
    connections (Redis itself is fine), ten times while consumers drain a backlog. Not every
    cut catches a fetch in the pipeline then in flight; ten make missing all of them unlikely."""
    server = cluster.redis()
    proxy = cluster.proxy(server)
    b = cluster.broker(proxy.url, replica_id='chaos-cut')
    queue = _queue()
    backlog = ChaosRun([ChaosProducer([b.url], queue, range(LOAD))], [], timeout=60).start()
    try:
        assert backlog.wait(ChaosRun.producers_done, timeout=45), backlog.log
    finally:
        backlog.stop()
    run = ChaosRun(
        [], [ChaosConsumer([b.url], queue, f'c{i}', credit=50) for i in range(4)], timeout=60
    ).start()
    try:
        assert run.wait(lambda r: len(r.received) >= LOAD // 5, timeout=30), run.log
        for _ in range(CUTS):
            proxy.lose_replies_then_cut(0.1)
            time.sleep(0.15)
        # a publish wakes a subscription the cuts may have left idle (that is the next test)
        _publish_one(b.url, queue)
        run.wait_while_progressing(lambda r: backlog.accepted <= r.received, quiet=8)
    finally:
        run.stop()
    lost = backlog.accepted - run.received
    client = redis.Redis.from_url(server.url)
    try:
        pending = client.xpending(keys.AddressKeys.of(queue).streams[5], QUEUE_GROUP)
    finally:
        client.close()
    summary = (
        f'{proxy.cuts} cuts between broker and Redis while draining {len(backlog.accepted)} '
        f'accepted messages: {len(lost)} never delivered (e.g. {sorted(lost)[:5]}); Redis then '
        f'had {pending["pending"]} entries pending for {pending["consumers"]}; '
        f'{len(unmarked := _unmarked_redeliveries(run.receipts))} delivered again with '
        f'delivery-count 0 (e.g. {unmarked[:5]})'
    )
    cluster.report(summary)
    record_property('stranded', len(lost))
    assert len(backlog.accepted) == LOAD
    assert not lost, summary
    assert not unmarked, summary


@pytest.mark.timeout(90)
def test_consumers_of_a_backlog_resume_after_the_store_connection_failed(
    cluster, record_property
) -> None:  # type: ignore[no-untyped-def]
    """Redis drops the broker's command connections and refuses new ones for 3 s (maxclients);
    its pub/sub connection stays. The long lease keeps the replica from closing its clients'
    connections (their re-attaches would fetch again and hide the stall)."""
    server = cluster.redis()
    b = cluster.broker(server.url, env={'SHOAL_LEASE_SECONDS': '30'})
    queue = _queue()
    backlog = ChaosRun([ChaosProducer([b.url], queue, range(LOAD))], [], timeout=60).start()
    try:
        assert backlog.wait(ChaosRun.producers_done, timeout=45), backlog.log
    finally:
        backlog.stop()
    run = ChaosRun(
        [], [ChaosConsumer([b.url], queue, f'c{i}', credit=50) for i in range(2)], timeout=60
    ).start()
    admin = redis.Redis.from_url(server.url)
    try:
        assert run.wait(lambda r: len(r.received) >= LOAD // 5, timeout=30), run.log
        admin.config_set('maxclients', 1)
        killed = admin.client_kill_filter(_type='normal', skipme=True)
        time.sleep(3)
        admin.config_set('maxclients', 10000)
        resumed_at = time.monotonic()
        finished = run.wait(lambda r: backlog.accepted <= r.received, timeout=12)
        group = admin.xinfo_groups(keys.AddressKeys.of(queue).streams[5])[0]
    finally:
        run.stop()
        admin.close()
    summary = (
        f'{killed} command connections dropped, new ones refused for 3 s: '
        f'{len(backlog.accepted - run.received)} of {len(backlog.accepted)} accepted messages '
        f'not delivered {time.monotonic() - resumed_at:.1f} s after Redis took connections '
        f'again; the queue still had {group["lag"]} entries never read; fetch failures logged: '
        f'{b.log().count("failed: Redis unreachable")}; '
        f'{len(unmarked := _unmarked_redeliveries(run.receipts))} delivered again with '
        f'delivery-count 0 (e.g. {unmarked[:5]})'
    )
    cluster.report(summary)
    assert finished, summary
    assert not unmarked, summary
