"""
bench/analytics.py - analysis throughput of shoal-analytics on synthetic metric records.

usage: .venv/bin/python bench/analytics.py [--records 1000000] [--master local[2]] [--reps 3]
                                           [--ingest-records 200000]

Writes about ``--records`` synthetic raw records (all plants, 200 queues, 3 replicas) into a
temporary lake, then times:
  cold   ``python -m shoal_analytics analyze`` as its own process (JVM start included), once;
  warm   ``analyze`` again and again in one session (``--reps`` times; median reported);
  report ``shoal-analytics report`` (pandas, no Spark);
  ingest ``--ingest-records`` records XADDed to a private redis-server on a free loopback port,
         read by the Redis stream data source into a new lake (warm session).
Also checks that the analysis found exactly the planted problems, so a fast wrong answer does
not pass as a result. Results go to docs/performance.md by hand.
"""

import argparse
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from pyspark.sql import SparkSession

from shoal_analytics.analyze import analyze
from shoal_analytics.ingest import ingest
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.session import spark_session
from shoal_analytics.synthetic import Synthetic, write_raw
from shoal_broker.metrics.records import MetricRecord
from shoal_broker.store.keys import METRICS

ENTITIES = 200
REPLICAS = 3


def _seconds(command: list[str]) -> float:
    start = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


def _bench_ingest(spark: SparkSession, count: int, root: Path) -> None:
    """XADD ``count`` records to a private redis-server, then time one ingest of them."""
    port = _free_port()
    server = subprocess.Popen(
        ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '',
         '--appendonly', 'no', '--dir', str(root)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f'redis://127.0.0.1:{port}/0'
        client = redis.Redis.from_url(url, decode_responses=True)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        record = MetricRecord(
            ts_ms=int(time.time() * 1000), interval_ms=10_000, replica='shoal-0',
            address='orders.1', subscription='queue', enqueued=120, delivered=118, accepted=118,
            consumers=2, backlog=17, latency_buckets=(40, 30, 20, 20, 5, 2, 1, 0, 0, 0),
        ).to_fields()  # fmt: skip
        start = time.monotonic()
        with client.pipeline(transaction=False) as pipe:
            for index in range(count):
                pipe.xadd(METRICS, record)
                if index % 5000 == 4999:
                    pipe.execute()
            pipe.execute()
        added = time.monotonic() - start
        print(f'XADD {count} records: {added:.1f} s, {count / added:,.0f}/s')
        client.close()
        start = time.monotonic()
        result = ingest(spark, Lake(root / 'ingest'), url)
        took = time.monotonic() - start
        assert result.rows == count, result
        print(f'ingest {count} records from Redis: {took:.1f} s, {count / took:,.0f} records/s '
              f'({result.batches} batch)')  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--records', type=int, default=1_000_000)
    parser.add_argument('--master', default='local[2]')
    parser.add_argument('--reps', type=int, default=3)
    parser.add_argument('--ingest-records', type=int, default=200_000)
    args = parser.parse_args()
    os.environ.setdefault('SPARK_LOCAL_IP', '127.0.0.1')
    intervals = math.ceil(args.records / (ENTITIES * REPLICAS))
    spec = Synthetic(entities=ENTITIES, replicas=REPLICAS, intervals=intervals)
    lookback = math.ceil(intervals * spec.interval_ms / 60_000) + 1
    root = Path(tempfile.mkdtemp(prefix='shoal-bench-analytics-'))
    lake = Lake(root)
    try:
        start = time.monotonic()
        records = write_raw(spec, lake.raw)
        generated = time.monotonic() - start
        raw_mb = sum(p.stat().st_size for p in lake.raw.iterdir()) / 1e6
        print(f'{records} records ({raw_mb:.0f} MB Parquet) generated in {generated:.1f} s')
        print(f'cpus {os.cpu_count()}, load {os.getloadavg()}, {platform.platform()}')

        cold = _seconds([
            sys.executable, '-m', 'shoal_analytics', 'analyze', '--lake', str(root),
            '--lookback-minutes', str(lookback), '--master', args.master,
        ])  # fmt: skip
        print(f'cold analyze (own process, JVM start included): {cold:.1f} s, '
              f'{records / cold:,.0f} records/s')  # fmt: skip

        spark = spark_session(args.master)
        params = AnalysisParams(lookback_minutes=lookback)
        warm: list[float] = []
        for _ in range(args.reps + 1):  # the first run warms the JIT and is not counted
            start = time.monotonic()
            result = analyze(spark, lake, params)
            warm.append(time.monotonic() - start)
        if args.ingest_records:
            _bench_ingest(spark, args.ingest_records, root)
        spark.stop()
        found = {(a.flag, a.address or a.replica) for a in result.summary.anomalies}
        assert found == set(spec.planted.items()), f'wrong anomalies: {sorted(found)}'
        median = statistics.median(warm[1:])
        print(f'warm analyze: {", ".join(f"{s:.1f}" for s in warm[1:])} s; median {median:.1f} s, '
              f'{records / median:,.0f} records/s')  # fmt: skip

        out = root / 'report.html'
        report = _seconds([sys.executable, '-m', 'shoal_analytics', 'report', '--lake', str(root),
                           '--out', str(out)])  # fmt: skip
        print(f'report: {report:.1f} s, {out.stat().st_size / 1e3:.0f} kB')
        print(f'load after: {os.getloadavg()}')
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
