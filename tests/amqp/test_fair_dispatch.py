"""
The consumers of one queue or shared subscription share its messages cluster-wide, wherever the
producer and they sit (docs/architecture.md, "Sharing between replicas"): in proportion to their
free credit, in bursts, at a trickle and when one of them is slow. Two real replicas on one
Redis; the producer is on the first. These are share assertions, never timing ones: every run
also counts where each message went (none lost, none twice).
"""

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from amqpclient import Capabilities, connect, receive_all, receiver, send_all
from jmswire import JmsSource
from loadclient import ConsumerSpec, ProducerSpec
from processes import BrokerProcess, wait_for
from proton.reactor import LinkOption
from shareclient import ShareRun

TOPIC = Capabilities('topic')
SHARED_DURABLE = JmsSource('topic', 'shared', 'global', durable=True)


def _consumers(address: str, kind: str, urls: list[str], credit: int) -> list[ConsumerSpec]:
    """One consumer per url: of the queue ``address``, or of the shared durable subscription
    on the topic ``address`` (each on a connection without a ClientID, as Qpid JMS
    has for a global shared subscription)."""
    if kind == 'queue':
        return [ConsumerSpec(url, address, f'c{i}', credit=credit) for i, url in enumerate(urls)]
    options: list[LinkOption] = [SHARED_DURABLE]
    return [
        ConsumerSpec(url, address, f'{address}|global', options, credit=credit)
        for url in urls
    ]  # fmt: skip


def _producer(url: str, address: str, kind: str, count: int) -> ProducerSpec:
    return ProducerSpec(url, address, count, [TOPIC] if kind == 'topic' else [])


def _run(
    producer: ProducerSpec,
    consumers: list[ConsumerSpec],
    *,
    rate: float | None = None,
    settle_rates: dict[int, float] | None = None,
) -> ShareRun:
    expected = producer.count / rate if rate else 0.0
    run = ShareRun(producer, consumers, timeout=expected + 60, rate=rate, settle_rates=settle_rates)
    run.run()
    assert not run.errors
    assert not run.timed_out, f'sent {run.sent}, confirmed {run.confirmed}'
    everything = [body for got in run.received for body in got]
    # a message a slow consumer held unsettled at the close may come back to a closing consumer:
    # a redelivery of a message nobody accepted, which ShareRun keeps apart (returned_after_close)
    twice = [body for body, n in collections.Counter(everything).items() if n > 1]
    assert twice == []
    assert sorted(everything) == list(range(producer.count))  # none lost
    return run


def _between(share: float, low: float, high: float, run: Any) -> None:
    counts = [len(got) for got in run.received]
    assert low <= share <= high, f'received {counts}'


KINDS = ['queue', 'topic']
LOADS = [
    pytest.param(20, None, id='burst-of-20'),
    pytest.param(50, None, id='burst-of-50'),
    pytest.param(300, 60.0, id='60-per-second-for-5s'),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize(('count', 'rate'), LOADS)
def test_one_consumer_on_each_replica_each_gets_about_half(
    broker: BrokerProcess,
    second_broker: BrokerProcess,
    address: str,
    kind: str,
    count: int,
    rate: float | None,
) -> None:
    consumers = _consumers(address, kind, [broker.url, second_broker.url], credit=1000)
    run = _run(_producer(broker.url, address, kind, count), consumers, rate=rate)
    for share in run.shares():
        _between(share, 0.35, 0.65, run)


@pytest.mark.timeout(120)
@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize(
    ('count', 'rate'),
    [pytest.param(200, None, id='burst-of-200'), pytest.param(240, 60.0, id='60-per-second')],
)
def test_three_consumers_on_one_replica_and_one_on_the_other_share_by_number(
    broker: BrokerProcess,
    second_broker: BrokerProcess,
    address: str,
    kind: str,
    count: int,
    rate: float | None,
) -> None:
    urls = [broker.url, broker.url, broker.url, second_broker.url]
    consumers = _consumers(address, kind, urls, credit=1000)
    run = _run(_producer(broker.url, address, kind, count), consumers, rate=rate)
    _between(run.shares()[3], 0.15, 0.35, run)


@pytest.mark.timeout(120)
@pytest.mark.parametrize('kind', KINDS)
def test_a_slow_consumer_gets_little_and_the_fast_one_the_rest(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str, kind: str
) -> None:
    # the slow consumer sits on the producer's replica: the harder case, where hand-over and
    # sending ahead would otherwise give it whatever it has credit for
    consumers = _consumers(address, kind, [broker.url, second_broker.url], credit=10)
    run = _run(
        _producer(broker.url, address, kind, 600), consumers, rate=200.0, settle_rates={0: 10.0}
    )
    assert run.shares()[1] >= 0.80, f'received {[len(got) for got in run.received]}'


def _listed(redis_url: str, command: str) -> list[dict[str, Any]]:
    """``shoal <command> --json``, run as the real command."""
    env = {k: v for k, v in os.environ.items() if k != 'SHOAL_REDIS_URL'}
    done = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', redis_url, command, '--json'],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize(('kind', 'command'), [('queue', 'queues'), ('topic', 'subscriptions')])
def test_shoal_shows_each_replicas_consumers_and_share_of_the_deliveries(
    start_broker: Callable[..., BrokerProcess],
    store_url: str,
    address: str,
    kind: str,
    command: str,
) -> None:
    fast_records = {'SHOAL_METRICS_INTERVAL_SECONDS': '0.2'}
    one, two = start_broker(env=fast_records), start_broker(env=fast_records)
    consumers = _consumers(address, kind, [one.url, two.url], credit=1000)
    _run(_producer(one.url, address, kind, 50), consumers)
    connections = [connect(url) for url in (one.url, two.url)]  # attached again, and kept
    for conn, spec in zip(connections, consumers, strict=True):
        conn.create_receiver(address, credit=10, name=spec.link_name, options=spec.options or None)
    try:
        row = _row_when(store_url, command, address, lambda r: len(r['consumers']) == 2
                        and sum(r['delivered'].values()) >= 50)  # fmt: skip
    finally:
        for conn in connections:
            conn.close()
    assert row['consumers'] == {one.replica_id: 1, two.replica_id: 1}
    delivered = row['delivered']
    assert sum(delivered.values()) == 50
    assert set(delivered) == {one.replica_id, two.replica_id}
    assert all(0.35 <= n / 50 <= 0.65 for n in delivered.values()), delivered
    gone = _row_when(store_url, command, address, lambda r: not r['consumers'])
    assert gone['consumers'] == {}  # each replica left the sharing with its last consumer


def _row_when(
    store_url: str, command: str, address: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The CLI's row for ``address`` once ``done`` holds for it (or after 20 s, as it is)."""
    deadline = time.monotonic() + 20
    while True:
        rows = _listed(store_url, command)
        [row] = [r for r in rows if address in (r['name'], r.get('topic'))]
        if done(row) or time.monotonic() > deadline:
            return row
        time.sleep(0.2)


@pytest.mark.timeout(120)
def test_a_replica_that_stops_answering_holds_back_nothing(
    start_broker: Callable[..., BrokerProcess], store_client: Any, address: str
) -> None:
    long_lease = {'SHOAL_LEASE_SECONDS': '60'}  # not reaped: only the lapse lets go of it
    producing, hung = start_broker(env=long_lease), start_broker(env=long_lease)
    there = connect(hung.url)
    receiver(there, address, credit=100)  # a consumer on the replica about to hang
    here = connect(producing.url)
    rcv = receiver(here, address, credit=100)
    shares = f'shoal:{{a:{address}}}:share:queue'
    wait_for(lambda: store_client.hexists(shares, hung.replica_id), 10, 'its sharing record')
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        send_all(here, address, range(20))
        # what was set aside for the hung replica lapses, and it gets nothing more meanwhile
        got = receive_all(rcv, 20, timeout=15)
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert sorted(m.body for m in got) == list(range(20))
    here.close()
    there.close()
