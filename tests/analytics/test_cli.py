"""
The installed ``shoal-analytics`` console script end to end, as the README and the chart's CronJob
run it: a real broker records its own metrics in a real Redis, then ``ingest``, ``analyze`` and
``report`` run as subprocesses (one module-scoped run; each Spark command is a JVM of its own).
Bad arguments end with exit status 2 and one line, before any JVM starts.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from amqpclient import connect, receive_all, receiver, send_all, settle
from processes import RedisServer, broker, free_port
from proton import Delivery

from shoal_analytics.lake import Lake
from shoal_broker.metrics.records import AnalyticsSummary, MetricRecord
from shoal_broker.store import keys
from shoal_broker.store.keys import METRICS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # two JVMs start in the first test

SCRIPT = Path(sys.executable).with_name('shoal-analytics')
ROUNDS, SENT, ROUND_ACCEPTED = 3, 30, 6
ACCEPTED = ROUNDS * ROUND_ACCEPTED
IDLE, DLQ, IDLE_HELD = 'cli-idle', 'cli-dlq', 7
"""A queue holding IDLE_HELD messages nobody consumes, and the dead-letter queue (one message,
no consumer): idle entities the broker must record anyway."""
WINDOW_SECONDS = 1
SPARK_ENV = {
    'SPARK_LOCAL_IP': '127.0.0.1',
    # reference/spark.md §7: a JVM that lives a few seconds is faster without the C2 compiler
    'JAVA_TOOL_OPTIONS': '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC',
}
ANALYSED = re.compile(
    r'analysed (?P<records>\d+) records: (?P<anomalies>\d+) anomalies (?P<flags>\[.*\]); '
    r'(?P<replicas>\d+) replica\(s\) recommended \((?P<reason>.+)\)'
)


def shoal_analytics(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **SPARK_ENV},
    )  # fmt: skip


def recorded(client: redis.Redis, address: str) -> tuple[int, int]:
    """(enqueued, accepted) the broker's metric records for ``address`` add up to."""
    records = [MetricRecord.from_fields(fields) for _, fields in client.xrange(METRICS)]
    mine = [r for r in records if r.address == address]
    return sum(r.enqueued for r in mine), sum(r.accepted for r in mine)


@dataclasses.dataclass(frozen=True)
class Run:
    redis_url: str
    address: str
    stream_ids: list[str]
    lake: Lake
    ingest: subprocess.CompletedProcess[str]
    analyze: subprocess.CompletedProcess[str]
    report: subprocess.CompletedProcess[str]
    report_path: Path


@pytest.fixture(scope='module')
def run(own_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A broker's traffic recorded, then the three commands once, as the README runs them."""
    address = 'cli-orders'
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    env = {'SHOAL_METRICS_INTERVAL_SECONDS': '0.2', 'SHOAL_DEAD_LETTER_ADDRESS': DLQ}
    with broker(own_redis.url, env=env, replica_id='cli-replica') as b:
        conn = connect(b.url)
        try:
            send_all(conn, IDLE, range(IDLE_HELD))
            send_all(conn, 'cli-rejected', range(1))
            rejecting = receiver(conn, 'cli-rejected', credit=1)
            rejecting.receive(timeout=5)
            settle(rejecting, Delivery.REJECTED)
            rejecting.close()
            # Rounds a window apart, a consumer attached throughout (the broker records an entity
            # every interval while it has consumers), so the analysis sees complete windows.
            rcv = receiver(conn, address, credit=ROUND_ACCEPTED)
            for _ in range(ROUNDS):
                send_all(conn, address, range(SENT // ROUNDS))
                receive_all(rcv, ROUND_ACCEPTED)
                time.sleep(WINDOW_SECONDS * 1.2)
        finally:
            conn.close()
        deadline = time.monotonic() + 20
        while recorded(client, address) != (SENT, ACCEPTED):
            assert time.monotonic() < deadline, f'records of {SENT} sent, {ACCEPTED} accepted'
            time.sleep(0.2)
        time.sleep(WINDOW_SECONDS * 1.2)  # a window of idle records after the traffic
    stream_ids = [entry_id for entry_id, _ in client.xrange(METRICS)]  # the broker has stopped
    client.close()

    root = tmp_path_factory.mktemp('cli')
    lake = Lake(root / 'lake')
    report_path = root / 'out' / 'report.html'
    ingest = shoal_analytics('ingest', '--redis-url', own_redis.url, '--lake', str(lake.root),
                             '--master', 'local[2]')  # fmt: skip
    analyze = shoal_analytics(
        'analyze', '--lake', str(lake.root), '--redis-url', own_redis.url,
        '--window-seconds', str(WINDOW_SECONDS), '--master', 'local[2]',
    )  # fmt: skip
    report = shoal_analytics('report', '--lake', str(lake.root), '--out', str(report_path))
    return Run(own_redis.url, address, stream_ids, lake, ingest, analyze, report, report_path)


def test_ingest_lands_every_record_the_broker_wrote_and_says_how_many(run: Run) -> None:
    assert run.ingest.returncode == 0, run.ingest.stderr[-3000:]
    assert re.fullmatch(
        rf'ingested {len(run.stream_ids)} records in [1-9]\d* batch\(es\)\n', run.ingest.stdout
    )
    raw = pq.read_table(run.lake.raw).to_pylist()  # the partitions, not _spark_metadata
    assert sorted(row['stream_id'] for row in raw) == sorted(run.stream_ids)
    mine = [row for row in raw if row['address'] == run.address]
    assert sum(row['enqueued'] for row in mine) == SENT
    assert sum(row['accepted'] for row in mine) == ACCEPTED
    assert {row['replica'] for row in mine} == {'cli-replica'}


def test_analyze_prints_the_recommendation_and_publishes_it_for_the_operator(run: Run) -> None:
    assert run.analyze.returncode == 0, run.analyze.stderr[-3000:]
    printed = ANALYSED.fullmatch(run.analyze.stdout.strip())
    assert printed, run.analyze.stdout
    assert int(printed['records']) == len(run.stream_ids)
    assert printed['replicas'] == '1'  # one replica, a few transfers/s: one is plenty

    client = redis.Redis.from_url(run.redis_url, decode_responses=True)
    try:
        published = AnalyticsSummary.from_fields(client.hgetall(keys.ANALYTICS_SUMMARY))
    finally:
        client.close()
    assert published.records == len(run.stream_ids)
    assert published.current_replicas == 1
    assert published.recommended_replicas == 1
    assert published.reason == printed['reason']
    assert len(published.anomalies) == int(printed['anomalies'])
    assert json.loads(printed['flags']) == sorted({a.flag for a in published.anomalies})

    written = json.loads(run.lake.summary.read_text())
    assert (written['records'], written['recommended_replicas']) == (published.records, 1)
    entities = pq.read_table(run.lake.analysis / 'entities.parquet').to_pylist()
    [mine] = [row for row in entities if row['address'] == run.address]
    assert (mine['subscription'], mine['enqueued'], mine['accepted']) == ('queue', SENT, ACCEPTED)


def test_report_writes_one_page_naming_the_queue_and_the_recommendation(run: Run) -> None:
    assert run.report.returncode == 0, run.report.stderr[-3000:]
    assert run.report.stdout == f'wrote {run.report_path}\n'
    page = run.report_path.read_text()
    assert page.startswith('<!DOCTYPE html>')
    assert run.address in page
    assert 'Brokers: 1 running; the load needs 1.' in page
    assert 'http://' not in page  # self-contained
    assert 'https://' not in page


def test_idle_queues_and_the_dead_letter_queue_reach_the_report_as_shoal_queues_counts_them(
    run: Run,
) -> None:
    listed = subprocess.run(
        [str(SCRIPT.with_name('shoal')), '--redis-url', run.redis_url, 'queues', '--json'],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    backlog = {q['name']: q['backlog'] for q in json.loads(listed.stdout)}
    assert (backlog[IDLE], backlog[DLQ]) == (IDLE_HELD, 1)
    entities = pq.read_table(run.lake.analysis / 'entities.parquet').to_pylist()
    analysed = {r['address']: r['backlog'] for r in entities if r['subscription'] == 'queue'}
    assert (analysed[IDLE], analysed[DLQ]) == (IDLE_HELD, 1)
    assert analysed[run.address] == backlog[run.address]
    page = run.report_path.read_text()
    cells = re.findall(r'<td[^>]*>([^<]*)</td>', page)
    for name in (IDLE, DLQ, run.address):
        row = cells[cells.index(name) : cells.index(name) + 10]
        assert row[9] == f'{backlog[name]:,}', row  # the report's backlog column
    assert not re.search(r'\bnan\b', re.sub(r'src="data:[^"]*"', '', page))


def one_line_error(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The single stderr line of a refused command (no traceback, no JVM output)."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == ''
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    prefix = f'shoal-analytics {command}: error: '
    assert lines[0].startswith(prefix), lines[0]
    return lines[0].removeprefix(prefix)


def test_ingest_into_a_lake_that_cannot_be_created_fails_in_one_line(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    blocker = tmp_path / 'a-file'
    blocker.write_text('not a directory')
    lake = blocker / 'lake'
    result = shoal_analytics('ingest', '--redis-url', own_redis.url, '--lake', str(lake))
    assert one_line_error(result, 'ingest') == f'cannot create the lake {lake}: Not a directory'
    assert blocker.read_text() == 'not a directory'


def test_ingest_from_a_redis_nobody_listens_on_fails_in_one_line_and_creates_nothing(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f'redis://127.0.0.1:{port}/0'
    result = shoal_analytics('ingest', '--redis-url', url, '--lake', str(tmp_path / 'lake'))
    message = one_line_error(result, 'ingest')
    assert message.startswith(f'cannot reach Redis at {url}: ')
    assert 'refused' in message.lower()
    assert not (tmp_path / 'lake').exists()


def test_a_password_in_an_unreachable_redis_url_is_not_shown(tmp_path: Path) -> None:
    port = free_port()
    secret = 'hunter2-s3cret'
    url = f'redis://:{secret}@127.0.0.1:{port}/0'
    result = shoal_analytics('ingest', '--redis-url', url, '--lake', str(tmp_path / 'lake'))
    message = one_line_error(result, 'ingest')
    assert message.startswith(f'cannot reach Redis at redis://127.0.0.1:{port}/0: ')
    assert secret not in result.stderr


def test_a_url_that_is_not_redis_fails_in_one_line(tmp_path: Path) -> None:
    result = shoal_analytics('ingest', '--redis-url', 'http://127.0.0.1/0',
                             '--lake', str(tmp_path / 'lake'))  # fmt: skip
    assert 'redis://' in one_line_error(result, 'ingest')


def test_analyze_without_an_ingest_fails_in_one_line(tmp_path: Path) -> None:
    lake = Lake(tmp_path / 'lake')
    result = shoal_analytics('analyze', '--lake', str(lake.root))
    assert one_line_error(result, 'analyze') == (
        f'no raw metric records under {lake.raw}: run ingest first'
    )


def test_analyze_publishing_to_a_redis_nobody_listens_on_fails_before_touching_the_lake(
    run: Run,
) -> None:
    before = run.lake.summary.read_text()
    url = f'redis://127.0.0.1:{free_port()}/0'
    result = shoal_analytics('analyze', '--lake', str(run.lake.root), '--redis-url', url)
    assert one_line_error(result, 'analyze').startswith(f'cannot reach Redis at {url}: ')
    assert run.lake.summary.read_text() == before
