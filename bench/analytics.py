"""
bench/analytics.py - analysis throughput of shoal-analytics on synthetic metric records.

usage: .venv/bin/python bench/analytics.py [--records 1000000] [--master local[2]] [--reps 3]

Writes about ``--records`` synthetic raw records (all plants, 200 queues, 3 replicas) into a
temporary lake, then times:
  cold   ``python -m shoal_analytics analyze`` as its own process (JVM start included), once;
  warm   ``analyze`` again and again in one session (``--reps`` times; median reported);
  report ``shoal-analytics report`` (pandas + matplotlib, no Spark).
Also checks that the analysis found exactly the planted problems, so a fast wrong answer does
not pass as a result. Results go to docs/benchmarks.md by hand.
"""

import argparse
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shoal_analytics.analyze import analyze
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.session import spark_session
from shoal_analytics.synthetic import Synthetic, write_raw

ENTITIES = 200
REPLICAS = 3


def _seconds(command: list[str]) -> float:
    start = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--records', type=int, default=1_000_000)
    parser.add_argument('--master', default='local[2]')
    parser.add_argument('--reps', type=int, default=3)
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
