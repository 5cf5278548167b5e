"""
``ingest`` and ``analyze`` on a real Spark standalone cluster, not only ``local[*]``: a master and
one worker (1 core, small memory: the machine has two) started from the pyspark wheel's
``spark-class`` on loopback, the commands run as the chart's job runs them with ``--master
spark://...``, and the work done by the worker's executors (their directories under the worker's
work dir), then the daemons stopped by PID.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pyspark
import pytest
import redis
from processes import LOOPBACK, RedisServer, free_port, stop

from shoal_analytics.lake import Lake
from shoal_broker.metrics.records import MetricRecord
from shoal_broker.store.keys import METRICS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPARK_CLASS = Path(pyspark.__file__).parent / 'bin' / 'spark-class'
SCRIPT = Path(sys.executable).with_name('shoal-analytics')
DAEMON_ENV = {
    'SPARK_LOCAL_IP': LOOPBACK,
    'SPARK_DAEMON_MEMORY': '256m',
    'JAVA_TOOL_OPTIONS': '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC',
}
INTERVALS, INTERVAL_MS, START_MS = 30, 10_000, 1_800_000_000_000


class Standalone:
    """A master and one worker on loopback, each a ``spark-class`` process of its own."""

    def __init__(self, root: Path) -> None:
        self.port, self.ui_port = free_port(), free_port()
        self.work_dir = root / 'work'
        env = {
            **os.environ,
            **DAEMON_ENV,
            'SPARK_LOG_DIR': str(root),
            'SPARK_HOME': str(SPARK_CLASS.parents[1]),
        }
        self.logs = [(root / 'master.log').open('wb'), (root / 'worker.log').open('wb')]
        self.processes = [
            subprocess.Popen(
                [str(SPARK_CLASS), 'org.apache.spark.deploy.master.Master', '--host', LOOPBACK,
                 '--port', str(self.port), '--webui-port', str(self.ui_port)],
                stdout=self.logs[0], stderr=subprocess.STDOUT, env=env,
            ),
        ]  # fmt: skip
        self._wait_for(lambda state: state.get('status') == 'ALIVE', 'the master')
        self.processes.append(
            subprocess.Popen(
                [str(SPARK_CLASS), 'org.apache.spark.deploy.worker.Worker', '--host', LOOPBACK,
                 '--cores', '1', '--memory', '1g', '--webui-port', str(free_port()),
                 '--work-dir', str(self.work_dir), self.url],
                stdout=self.logs[1], stderr=subprocess.STDOUT, env=env,
            )
        )  # fmt: skip
        self._wait_for(lambda state: state.get('aliveworkers') == 1, 'a worker')

    @property
    def url(self) -> str:
        return f'spark://{LOOPBACK}:{self.port}'

    def state(self) -> dict[str, object]:
        """The master's own JSON status page."""
        try:
            with urllib.request.urlopen(f'http://{LOOPBACK}:{self.ui_port}/json', timeout=2) as r:
                state: dict[str, object] = json.load(r)
                return state
        except OSError:
            return {}

    def _wait_for(self, ready, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 90
        while not ready(self.state()):
            for process in self.processes:
                assert process.poll() is None, f'{what}: a Spark daemon exited {process.returncode}'
            assert time.monotonic() < deadline, f'{what} did not come up within 90 s'
            time.sleep(0.5)

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop(process, timeout=30)
        for log in self.logs:
            log.close()


@pytest.fixture(scope='module')
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    standalone = Standalone(tmp_path_factory.mktemp('spark-standalone'))
    yield standalone
    standalone.stop()


def _records() -> list[MetricRecord]:
    """Five minutes of two replicas' records: one queue in steady traffic, one whose backlog
    grows, one idle dead-letter queue."""
    found = []
    for t in range(INTERVALS):
        ts = START_MS + (t + 1) * INTERVAL_MS
        for replica in ('r-a', 'r-b'):
            found.append(MetricRecord(
                ts_ms=ts, interval_ms=INTERVAL_MS, replica=replica, address='orders',
                subscription='queue', enqueued=100, delivered=100, accepted=100, consumers=1,
                backlog=5,
            ))  # fmt: skip
        found.append(MetricRecord(
            ts_ms=ts, interval_ms=INTERVAL_MS, replica='r-a', address='jobs', subscription='queue',
            enqueued=50, delivered=10, accepted=10, consumers=1, backlog=40 * t,
        ))  # fmt: skip
        found.append(MetricRecord(
            ts_ms=ts, interval_ms=INTERVAL_MS, replica='r-a', address='DLQ', subscription='queue',
            backlog=12,
        ))  # fmt: skip
    return found


def shoal_analytics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=400,
        env={**os.environ, **DAEMON_ENV, 'SPARK_EXECUTOR_MEMORY': '512m'},
    )  # fmt: skip


def test_ingest_and_analyze_run_on_a_standalone_master_and_worker(
    cluster: Standalone, own_redis: RedisServer, tmp_path: Path
) -> None:
    records = _records()
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    try:
        for record in records:
            client.xadd(METRICS, record.to_fields())  # type: ignore[arg-type]
    finally:
        client.close()
    lake = Lake(tmp_path / 'lake')
    ingest = shoal_analytics('ingest', '--redis-url', own_redis.url, '--lake', str(lake.root),
                             '--master', cluster.url)  # fmt: skip
    assert ingest.returncode == 0, ingest.stderr[-3000:]
    assert ingest.stdout.startswith(f'ingested {len(records)} records in ')
    assert len(pq.read_table(lake.raw)) == len(records)
    analyze = shoal_analytics('analyze', '--lake', str(lake.root), '--master', cluster.url)
    assert analyze.returncode == 0, analyze.stderr[-3000:]
    assert analyze.stdout.startswith(f'analysed {len(records)} records: ')
    summary = json.loads(lake.summary.read_text())
    assert [(a['flag'], a['address']) for a in summary['anomalies']] == [
        ('growing_backlog', 'jobs')
    ]
    entities = {
        r['address']: r for r in pq.read_table(lake.analysis / 'entities.parquet').to_pylist()
    }
    assert (entities['orders']['accepted'], entities['DLQ']['backlog']) == (100 * 2 * INTERVALS, 12)
    # Both ran on the worker: an application directory each, with an executor that logged
    applications = sorted(p for p in cluster.work_dir.iterdir() if p.name.startswith('app-'))
    assert len(applications) == 2, applications
    for application in applications:
        assert [(e / 'stderr').stat().st_size > 0 for e in application.iterdir()] == [True]
    state = cluster.state()
    completed = state.get('completedapps')
    assert isinstance(completed, list)
    assert sorted(app['name'] for app in completed) == ['shoal-analytics', 'shoal-analytics']
