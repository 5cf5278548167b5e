"""Sends held through a Redis outage (amqp/holding.py): a producer waiting for each outcome, as
Qpid JMS does, sees its sends wait and then accepted, never released; past the hold's bound it
gets a clear rejection, and nothing accepted is lost. Consumers keep their links meanwhile."""

import collections
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from proton.utils import BlockingConnection
from txnclient import ACCEPTED, Controller, send_in

OUTAGE_SECONDS = 10.0
SENDS = 3_000


def _aof_args(data: Path) -> tuple[str, ...]:
    return ('--appendonly', 'yes', '--dir', str(data))  # a clean stop keeps what was written


def _held(b: Any) -> dict[str, Any]:
    status, body = b.http_get('/readyz')
    return dict(json.loads(body))


def _copies(run: ChaosRun) -> collections.Counter[Any]:
    return collections.Counter(receipt.body for receipt in run.receipts)


@pytest.mark.timeout(150)
def test_a_synchronous_producer_waits_through_a_10_s_redis_stop_and_no_send_fails(
    cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    args = _aof_args(tmp_path)
    server = cluster.redis(*args)
    b = cluster.broker(server.url)
    queue = f'hold-{uuid.uuid4().hex[:8]}'
    run = ChaosRun(
        [ChaosProducer([b.url], queue, range(SENDS), window=1)],
        [ChaosConsumer([b.url], queue, 'c0', credit=20)],
        timeout=120,
    ).start()
    try:
        assert run.wait(lambda r: len(r.accepted) >= 200, timeout=60), run.log
        stopped_at = time.monotonic()
        server.stop()  # SIGTERM: Redis writes its AOF out and exits
        accepted_at_stop = len(run.accepted)
        # the send in flight is held: /readyz and the gauge say so, and nothing is answered
        assert run.wait(lambda r: _held(b).get('held_sends', 0) >= 1, timeout=10), _held(b)
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))
        during = _held(b)
        accepted_during = len(run.accepted) - accepted_at_stop
        cluster.redis(*args, port=server.port)
        restarted_at = time.monotonic()
        assert run.wait(ChaosRun.delivered_all, timeout=90), (run.log[-10:], _held(b))
        time.sleep(0.5)  # anything delivered twice would come now
    finally:
        run.stop()
    copies = _copies(run)
    twice = sorted(body for body, n in copies.items() if n > 1)
    slowest = max(run.answer_seconds)
    cluster.report(
        f'redis stopped {restarted_at - stopped_at:.1f} s under a synchronous producer: '
        f'{len(run.accepted)} of {SENDS} accepted, {run.released} released, '
        f'{len(run.rejected)} rejected, {len(run.in_doubt)} in doubt, {len(twice)} delivered '
        f'twice; slowest send {slowest:.2f} s; during the outage {during}'
    )
    assert accepted_during == 0  # nothing is accepted that Redis does not have
    assert during['held_sends'] >= 1
    assert during['held_sends_oldest_seconds'] >= OUTAGE_SECONDS / 2
    assert run.released == 0
    assert not run.rejected
    assert not run.in_doubt
    assert run.accepted == set(range(SENDS))
    assert set(copies) == set(range(SENDS))
    assert not twice, twice[:10]
    assert slowest < OUTAGE_SECONDS + 5  # the held send completes soon after the store is back
    # the consumer kept its link and connection through the outage and received after it
    assert not [what for _, what in run.log if 'lost' in what or 'refused' in what], run.log
    assert any(receipt.at > restarted_at for receipt in run.receipts)
    assert _held(b)['held_sends'] == 0
    assert b.process.poll() is None
