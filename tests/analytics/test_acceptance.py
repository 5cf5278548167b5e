"""
The analytics acceptance: two real brokers on one Redis, under traffic whose waits the test's own
clients measure, then ``shoal-analytics ingest``, ``analyze`` and ``report`` as a user runs them
(a local Spark JVM each). The traffic, about half a minute of it:

- ``slow``: each message held 1 to 1.6 s by a consumer attached the whole time, then accepted;
- ``fast``: each held 0.2 to 0.3 s;
- ``jobs``: every 5th message rejected, so it goes to the dead-letter queue;
- a shared durable subscription ``sub1`` with one consumer on each replica, two of every three
  messages given to the first (credit is granted to exactly one consumer at a time).

The report must give each queue's p50 and p99 within 10 % of the waits the clients measured, show
and flag the dead letters (and count them as enqueued on the dead-letter queue), show and flag
the 2:1 split, and call the slow queue slow, not unconsumed. Spark's own warnings stay quiet.
"""

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from amqpclient import Capabilities, connect, flush, receiver, sender, settle
from jmswire import JmsSource, jms_connect, subscriber
from processes import BrokerProcess, RedisServer
from proton import Delivery, Message, Timeout

from shoal_analytics.lake import Lake

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = Path(sys.executable).with_name('shoal-analytics')
ARTIFACTS = Path(os.environ.get('SHOAL_TEST_ARTIFACTS', Path(__file__).parents[2] / '.artifacts'))
SPARK_ENV = {'JAVA_TOOL_OPTIONS': '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC'}
BROKER_ENV = {'SHOAL_METRICS_INTERVAL_SECONDS': '1', 'SHOAL_METRICS_HEARTBEAT_SECONDS': '2'}
HELD = {'slow': (1.0, 1.6, 8.0), 'fast': (0.2, 0.3, 10.0)}
"""Queue -> (shortest hold, longest hold, messages per second): 30 s of each."""
SECONDS = 30
REJECTED_EVERY, JOBS = 5, 250
SHARED, SPLIT = 300, (2, 1)


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _held_queue(url: str, address: str, errors: list[BaseException]) -> list[float]:
    """Send at a steady rate and accept each message once its hold is over (in order: a message
    waits for the ones before it); the waits as the clients saw them, send to accept."""
    low, high, rate = HELD[address]
    waits: list[float] = []
    count = int(SECONDS * rate)

    def produce() -> None:
        conn = connect(url)
        try:
            snd = sender(conn, address)
            rng = random.Random(address)
            start = time.monotonic()
            for i in range(count):
                time.sleep(max(0.0, start + i / rate - time.monotonic()))
                snd.send(Message(body=i, properties={'sent': time.time(),
                                                     'hold': rng.uniform(low, high)}))  # fmt: skip
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            conn.close()

    conn = connect(url)
    rcv = receiver(conn, address, credit=int(rate * high) + 10)
    producer = threading.Thread(target=produce)
    producer.start()
    held: list[tuple[float, float]] = []  # (sent, due)
    deadline = time.monotonic() + SECONDS + 60
    while len(waits) < count and time.monotonic() < deadline and not errors:
        now = time.time()
        if held and held[0][1] <= now:
            sent, _ = held.pop(0)
            settle(rcv, Delivery.ACCEPTED)
            waits.append(time.time() - sent)
            flush(conn)
            continue
        try:
            message = rcv.receive(timeout=0.02)
        except Timeout:
            continue
        props = message.properties
        held.append((props['sent'], props['sent'] + props['hold']))
    producer.join(timeout=60)
    conn.close()
    assert len(waits) == count, f'{address}: {len(waits)} of {count} accepted'
    return waits


def _rejecting_queue(url: str) -> None:
    conn = connect(url)
    snd = sender(conn, 'jobs')
    rcv = receiver(conn, 'jobs', credit=50)
    for i in range(JOBS):
        snd.send(Message(body=i))
        rcv.receive(timeout=10)
        settle(rcv, Delivery.REJECTED if i % REJECTED_EVERY == REJECTED_EVERY - 1 else
               Delivery.ACCEPTED)  # fmt: skip
    flush(conn)
    conn.close()


def _shared_split(first: BrokerProcess, second: BrokerProcess) -> list[int]:
    """Publish to the topic with exactly one consumer holding one credit each time."""
    source = JmsSource('topic', 'shared', 'global', durable=True)
    consumers = [jms_connect(first.url), jms_connect(second.url)]
    links = [subscriber(c, 'prices', 'sub1|global', source, credit=0) for c in consumers]
    publisher = connect(first.url)
    snd = sender(publisher, 'prices', Capabilities('topic'))
    got = [0, 0]
    turns = [0] * SPLIT[0] + [1] * SPLIT[1]
    for i in range(SHARED):
        turn = turns[i % len(turns)]
        snd.send(Message(body=i))
        links[turn].receive(timeout=10)  # its one credit: the only consumer that has any
        settle(links[turn], Delivery.ACCEPTED)
        flush(consumers[turn])
        got[turn] += 1
    for conn in (*consumers, publisher):
        conn.close()
    return got


def shoal_analytics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, **SPARK_ENV},
    )  # fmt: skip


class _Cells(HTMLParser):
    """The rows of the page's tables, cell texts by header."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, str]]] = {}
        self._table = ''
        self._row: list[str] | None = None
        self._header: list[str] = []
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == 'table':
            self._table, self._header = str(dict(attrs).get('id')), []
            self.tables[self._table] = []
        elif tag == 'tr':
            self._row = []
        elif tag in ('td', 'th'):
            self._cell = ''

    def handle_endtag(self, tag: str) -> None:
        if tag in ('td', 'th') and self._row is not None and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == 'tr' and self._row is not None:
            if not self._header:
                self._header = self._row
            else:
                self.tables[self._table].append(dict(zip(self._header, self._row, strict=True)))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data


@pytest.fixture(scope='module')
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    server = RedisServer()
    brokers = [BrokerProcess(server.url, replica_id=name, env=BROKER_ENV)
               for name in ('replica-a', 'replica-b')]  # fmt: skip
    try:
        errors: list[BaseException] = []
        waits: dict[str, list[float]] = {}

        def held(address: str, url: str) -> None:
            try:
                waits[address] = _held_queue(url, address, errors)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=held, args=('slow', brokers[0].url)),
                   threading.Thread(target=held, args=('fast', brokers[1].url))]  # fmt: skip
        for thread in threads:
            thread.start()
        _rejecting_queue(brokers[1].url)
        split = _shared_split(*brokers)
        for thread in threads:
            thread.join(timeout=SECONDS + 120)
        assert not errors, errors
        time.sleep(3)  # one more metric interval of each replica (1 s) has ended
        lake = Lake(tmp_path_factory.mktemp('acceptance'))
        steps = {
            'ingest': shoal_analytics('ingest', '--redis-url', server.url, '--lake', str(lake.root),
                                      '--master', 'local[2]'),
            'analyze': shoal_analytics('analyze', '--lake', str(lake.root), '--master', 'local[2]',
                                       '--window-seconds', '5'),
            'report': shoal_analytics('report', '--lake', str(lake.root),
                                      '--out', str(lake.root / 'report.html')),
        }  # fmt: skip
        for name, done in steps.items():
            assert done.returncode == 0, f'{name}: {done.stderr}'
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # for a person to open
        shutil.copy(lake.root / 'report.html', ARTIFACTS / 'acceptance-report.html')
        yield {'lake': lake, 'waits': waits, 'split': split, 'steps': steps}
    finally:
        for b in brokers:
            b.stop()
        server.stop()


def _entities(lake: Lake) -> dict[str, dict[str, Any]]:
    table = pd.read_parquet(lake.analysis / 'entities.parquet')
    return {str(r['address']): r for r in table.to_dict('records')}


def _anomalies(lake: Lake) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(lake.summary.read_text())['anomalies']
    return found


def _page(lake: Lake) -> _Cells:
    page = _Cells()
    page.feed((lake.root / 'report.html').read_text(encoding='utf-8'))
    return page


def test_p50_and_p99_per_queue_are_within_10_percent_of_the_measured_waits(
    run: dict[str, Any],
) -> None:
    entities = _entities(run['lake'])
    for address, waits in run['waits'].items():
        for name, q in (('p50_ms', 0.5), ('p99_ms', 0.99)):
            truth = _nearest_rank(waits, q) * 1000
            assert entities[address][name] == pytest.approx(truth, rel=0.10), (address, name)
    rows = {r['queue or topic']: r for r in _page(run['lake']).tables['entities']}
    assert re.fullmatch(r'1\.\d\d? s', rows['slow']['p99'])  # human units, not 1600 ms
    assert rows['fast']['p50'].endswith(' ms')


def test_dead_letters_are_shown_flagged_with_their_reason_and_enqueued_on_the_dlq(
    run: dict[str, Any],
) -> None:
    lake = run['lake']
    dead = JOBS // REJECTED_EVERY
    entities = _entities(lake)
    assert entities['jobs']['dead_lettered'] == dead
    assert entities['DLQ']['enqueued'] == dead
    assert entities['DLQ']['backlog'] == dead
    [flag] = [a for a in _anomalies(lake) if a['flag'] == 'dead_letters']
    assert (flag['address'], flag['severity']) == ('jobs', 'warning')
    assert f'{dead} rejected' in flag['detail']
    rows = {r['queue or topic']: r for r in _page(lake).tables['entities']}
    assert rows['jobs']['dead-lettered'] == f'{dead} ({dead} rejected)'
    assert 'dead letters' in rows['jobs']['flags']
    assert rows['DLQ']['enqueued'] == str(dead)


def test_the_2_to_1_split_of_the_shared_subscription_is_shown_and_flagged(
    run: dict[str, Any],
) -> None:
    lake = run['lake']
    assert run['split'] == [SHARED * 2 // 3, SHARED // 3]
    [flag] = [a for a in _anomalies(lake) if a['flag'] == 'uneven_share']
    assert (flag['address'], flag['replica'], flag['severity']) == ('prices', 'replica-a', 'info')
    assert 'replica-a 67% / replica-b 33%' in flag['detail']
    rows = {r['queue or topic']: r for r in _page(lake).tables['entities']}
    assert rows['prices']['subscription'] == 'sub1'  # as the user named it
    assert rows['prices']['replica split'] == 'replica-a 67% / replica-b 33%'


def test_the_slow_queue_is_flagged_slow_not_unconsumed(run: dict[str, Any]) -> None:
    lake = run['lake']
    slow = [a for a in _anomalies(lake) if a['address'] == 'slow']
    assert [a['flag'] for a in slow if a['flag'] != 'growing_backlog'] == ['slow_consumer']
    assert all(a['severity'] != 'critical' for a in slow)
    [flag] = [a for a in slow if a['flag'] == 'slow_consumer']
    assert 'consumers attached all along' in flag['detail']
    assert not [a for a in _anomalies(lake) if a['address'] == 'fast']
    assert 'nobody' not in json.dumps(_anomalies(lake))
    assert _entities(lake)['slow']['consumer_presence'] == 1.0
    headline = json.loads(lake.summary.read_text())['headline']
    assert headline.startswith('Add consumers to slow'), headline


def test_spark_says_nothing_a_user_need_not_act_on(run: dict[str, Any]) -> None:
    for name in ('ingest', 'analyze'):
        stderr = run['steps'][name].stderr
        warnings = [line for line in stderr.splitlines() if re.search(r'\bWARN\b', line)]
        assert warnings == [], (name, stderr)
        assert "Using Spark's default log4j profile" not in stderr
