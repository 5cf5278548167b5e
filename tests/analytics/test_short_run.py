"""
A short, uneven run analysed and reported as a person would read it: two and a half minutes of
records that start mid-window, a backlog growing 0 -> 1 500 in two minutes, a dead-letter queue
nobody reads, a topic whose subscription receives what the topic is sent, consumers that come and
go, waits of about a minute, and a replica whose schema 1 records counted waits only as beyond
30 s. The report says what the data covers, has no ``nan``, one backlog figure per entity (the
newest sample, where the plot ends), the minute-long waits in their bucket and ``≥ 30 s`` for the
capped ones; headless Chromium screenshots it.
"""

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from shoal_analytics.analyze import Analysis, analyze
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.report import write_report
from shoal_analytics.rows import RAW_DDL, raw_row
from shoal_analytics.session import loopback_conf
from shoal_broker.metrics.records import LATENCY_BOUNDS, LATENCY_BOUNDS_V1, MetricRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

INTERVAL_MS = 10_000
START_MS = 1_800_000_000_000 + 20_000  # 20 s into a minute: the first window is partial
INTERVALS = 15  # 2 min 30 s of records
GROWING = 12  # the backlog grows 0 -> 1 500 over the first 12 intervals (two minutes)
MINUTE_WAITS = [0] * 9 + [25, 0, 0, 0, 0]  # every accepted delivery waited 30 to 60 s (54.8 s)
BEYOND_30_S_V1 = [0] * len(LATENCY_BOUNDS_V1) + [10]  # schema 1: the waits were beyond 30 s


def _record(
    t: int, replica: str, address: str, subscription: str = 'queue', **fields: object
) -> MetricRecord:
    offset = 37 if replica == 'r-b' else 0  # replicas tick out of phase
    return MetricRecord(
        ts_ms=START_MS + (t + 1) * INTERVAL_MS + offset, interval_ms=INTERVAL_MS,
        replica=replica, address=address, subscription=subscription, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def records() -> list[MetricRecord]:
    found = []
    for t in range(INTERVALS):
        backlog = 1500 * min(t, GROWING) // GROWING
        found += [
            # jobs: 150 in, 25 out per interval, one consumer on r-a, waits under a minute
            _record(t, 'r-b', 'jobs', enqueued=150, backlog=backlog),
            _record(t, 'r-a', 'jobs', delivered=25, accepted=25, consumers=1, backlog=backlog,
                    latency_buckets=tuple(MINUTE_WAITS)),
            # the dead-letter queue: only the idle record of the first live replica
            _record(t, 'r-a', 'DLQ', backlog=468),
            # a topic: its publishes under subscription '', its subscription's deliveries
            _record(t, 'r-b', 'prices', '', enqueued=100),
            _record(t, 'r-a', 'prices', 'audit', delivered=90, accepted=90, filtered=10,
                    consumers=1, backlog=0, latency_buckets=(90,) + (0,) * len(LATENCY_BOUNDS)),
            # work: a consumer on r-a in every third interval only; r-a writes schema 1 records
            _record(t, 'r-a', 'work', delivered=10 if t % 3 == 0 else 0,
                    accepted=10 if t % 3 == 0 else 0, consumers=1 if t % 3 == 0 else 0,
                    backlog=0, latency_buckets=tuple(BEYOND_30_S_V1 if t % 3 == 0 else
                                                     [0] * len(BEYOND_30_S_V1))),
        ]  # fmt: skip
    return found


@pytest.fixture(scope='module')
def short_run(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Lake, Analysis]:
    lake = Lake(tmp_path_factory.mktemp('short'))
    rows = [raw_row(f'{r.ts_ms}-{i}', r.to_fields()) for i, r in enumerate(records())]
    spark.createDataFrame(rows, RAW_DDL).coalesce(1).write.parquet(str(lake.raw))
    return lake, analyze(spark, lake, AnalysisParams())


def _entities(lake: Lake) -> dict[tuple[str, str], dict[str, object]]:
    table = pd.read_parquet(lake.analysis / 'entities.parquet')
    return {(r['address'], r['subscription']): r for r in table.to_dict('records')}


def test_a_backlog_growing_to_1500_in_two_minutes_is_flagged(
    short_run: tuple[Lake, Analysis],
) -> None:
    lake, analysis = short_run
    growing = [a for a in analysis.summary.anomalies if a.flag == 'growing_backlog']
    assert [(a.address, a.subscription) for a in growing] == [('jobs', 'queue')]
    jobs = _entities(lake)[('jobs', 'queue')]
    assert jobs['backlog'] == 1500  # the newest sample
    assert jobs['backlog_samples'] == INTERVALS
    assert not _entities(lake)[('DLQ', 'queue')]['backlog_growing']  # large, but steady


def test_a_topic_subscription_receives_what_the_topic_is_sent_and_the_topic_is_no_row(
    short_run: tuple[Lake, Analysis],
) -> None:
    lake, _ = short_run
    entities = _entities(lake)
    assert ('prices', '') not in entities
    audit = entities[('prices', 'audit')]
    assert audit['enqueued'] == (100 - 10) * INTERVALS  # published less filtered
    assert audit['in_rate'] == pytest.approx(audit['out_rate'])  # keeps up: 90 in, 90 out
    windows = pd.read_parquet(lake.analysis / 'entity_windows.parquet')
    assert '' not in set(windows['subscription'])


def test_fairness_never_counts_more_per_consumer_than_was_delivered(
    short_run: tuple[Lake, Analysis],
) -> None:
    lake, _ = short_run
    fairness = pd.read_parquet(lake.analysis / 'fairness.parquet')
    work = fairness[fairness['address'] == 'work'].iloc[0]
    assert work['delivered'] == 50
    assert work['max_per_consumer'] == 50  # one consumer whenever there was one


def test_only_windows_the_records_cover_whole_are_complete(
    short_run: tuple[Lake, Analysis],
) -> None:
    lake, _ = short_run
    load = pd.read_parquet(lake.analysis / 'replica_windows.parquet')
    complete = sorted(set(load[load['complete']]['window_start_ms']))
    assert complete == [1_800_000_060_000]  # [20 s, 60 s) and [120 s, 170 s] are partial
    summary = pd.read_json(lake.summary, typ='series')
    assert summary['data_start_ms'] == START_MS
    assert summary['data_end_ms'] == START_MS + INTERVALS * INTERVAL_MS + 37


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._row: list[str] | None = None
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == 'tr':
            self._row = []
        elif tag in ('td', 'th'):
            self._cell = ''

    def handle_endtag(self, tag: str) -> None:
        if tag in ('td', 'th') and self._row is not None and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == 'tr' and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data


def test_the_report_tells_what_the_data_covers_in_human_units_and_is_screenshot(
    short_run: tuple[Lake, Analysis], tmp_path: Path
) -> None:
    lake, _ = short_run
    out = tmp_path / 'report.html'
    write_report(lake, out)
    page = out.read_text(encoding='utf-8')
    text = re.sub(r'src="data:[^"]*"', '', page)  # the plots' base64 may spell anything
    assert not re.search(r'\bnan\b', text, re.IGNORECASE)
    assert (
        '90 metric records covering 2027-01-15 08:00:20 UTC to 2027-01-15 08:02:50 UTC '
        '(2 min 30 s), read from a 60-minute lookback; 0 malformed.'
    ) in page
    parser = _Cells()
    parser.feed(page)
    tables = [row for row in parser.rows if row]
    header = next(row for row in tables if row[:2] == ['queue or topic', 'subscription'])
    entities = {(row[0], row[1]): dict(zip(header, row, strict=True)) for row in tables
                if len(row) == len(header) and row != header}  # fmt: skip
    jobs = entities[('jobs', '')]  # a queue has no subscription
    assert jobs['backlog'] == '1,500'  # the newest sample: where the backlog plot ends
    # schema 2 records: the waits were at most their bucket's upper bound, not "≥ 30 s"
    assert (jobs['p50'], jobs['p99']) == ('1 min', '1 min')
    assert jobs['time to drain'] == 'not draining'
    assert jobs['enqueued'] == '2,250'
    work = entities[('work', '')]  # schema 1 records know no more than "beyond 30 s"
    assert work['p50'] == work['p99'] == '≥ 30 s'
    dlq = entities[('DLQ', '')]
    assert (dlq['backlog'], dlq['redelivered'], dlq['p99']) == ('468', '—', '—')
    audit = entities[('prices', 'audit')]
    assert (audit['redelivered'], audit['time to drain'], audit['p99']) == (
        '0.0%',
        'empty',
        '1.01 ms',
    )
    assert not [row for row in tables if row[:2] == ['prices', '']]

    chromium = shutil.which('chromium')
    assert chromium, 'chromium is not installed (make test installs it)'
    shot = tmp_path / 'report.png'
    subprocess.run(
        [chromium, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
         f'--screenshot={shot}', '--window-size=1280,2400', out.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert shot.read_bytes().startswith(b'\x89PNG\r\n\x1a\n')
    assert shot.stat().st_size > 50_000  # a rendered page with its plots, not a blank one
    # (kept with the test's tmp_path, as pytest keeps the last runs' directories)


def test_spark_in_local_mode_listens_on_loopback_unless_told() -> None:
    off = {'spark.ui.enabled': 'false'}
    loopback = {'spark.driver.host': '127.0.0.1', 'spark.driver.bindAddress': '127.0.0.1', **off}
    assert loopback_conf('local[*]', {}, {}) == loopback
    assert loopback_conf('local[2]', {'SPARK_LOCAL_IP': '10.0.0.5'}, {}) == off
    assert loopback_conf('local[*]', {}, {'spark.driver.host': 'driver.svc'}) == off
    assert 'spark.ui.enabled' not in loopback_conf('local', {}, {'spark.ui.enabled': 'true'})
    assert loopback_conf('spark://127.0.0.1:7077', {}, {}) == {}
    assert loopback_conf('k8s://https://kubernetes.default.svc', {}, {}) == {}
