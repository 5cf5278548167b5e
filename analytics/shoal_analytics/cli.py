"""
``shoal-analytics ingest|analyze|report`` (docs/analytics.md).

Spark is imported only by the commands that need it, so ``report`` starts no JVM. Errors a user
can act on (data loss, nothing ingested yet, bad arguments, a lake that cannot be created, an
unreachable Redis) end with one line and exit status 2; what can be checked before Spark starts
is (``preflight.py``).
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from shoal_analytics import preflight
from shoal_analytics.errors import AnalyticsError
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_broker.store.keys import METRICS

USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='shoal-analytics', description=__doc__.split('\n\n')[0])
    commands = parser.add_subparsers(dest='command', required=True)
    defaults = AnalysisParams()

    def spark_options(command: argparse.ArgumentParser) -> None:
        command.add_argument('--master', help='Spark master (default $SPARK_MASTER or local[*])')

    ingest = commands.add_parser('ingest', help='land the metrics stream as raw Parquet')
    ingest.add_argument('--redis-url', required=True)
    ingest.add_argument('--lake', type=Path, required=True)
    ingest.add_argument('--max-records-per-batch', type=int, default=None)
    ingest.add_argument('--stream', default=METRICS)
    spark_options(ingest)

    analyze = commands.add_parser('analyze', help='indicators, anomalies, replica recommendation')
    analyze.add_argument('--lake', type=Path, required=True)
    analyze.add_argument('--redis-url', help='publish the summary for the operator')
    analyze.add_argument('--current-replicas', type=int)
    analyze.add_argument(
        '--capacity-per-replica', type=float, default=defaults.capacity_per_replica,
        metavar='MSGS_PER_S', help='transfers/s (enqueued + delivered) one replica sustains',
    )  # fmt: skip
    analyze.add_argument('--window-seconds', type=int, default=defaults.window_seconds)
    analyze.add_argument('--lookback-minutes', type=int, default=defaults.lookback_minutes)
    spark_options(analyze)

    report = commands.add_parser('report', help='render the latest analysis as one HTML file')
    report.add_argument('--lake', type=Path, required=True)
    report.add_argument('--out', type=Path, required=True)
    return parser


def _run_ingest(args: argparse.Namespace) -> str:
    from shoal_analytics.ingest import ingest
    from shoal_analytics.session import spark_session
    from shoal_analytics.source import DEFAULT_PASSWORD_ENV

    url, password = preflight.split_password(args.redis_url)
    lake = Lake(args.lake)
    preflight.reachable_redis(args.redis_url)  # first: a failed run creates no lake
    preflight.writable_lake(lake)
    if password is not None:
        # Before the JVM starts, so the Python workers inherit it; never in a data source option.
        os.environ[DEFAULT_PASSWORD_ENV] = password
    spark = spark_session(args.master)
    try:
        result = ingest(
            spark, lake, url, stream=args.stream,
            max_records_per_batch=args.max_records_per_batch,
        )  # fmt: skip
    finally:
        spark.stop()
    return f'ingested {result.rows} records in {result.batches} batch(es)'


def _run_analyze(args: argparse.Namespace) -> str:
    from shoal_analytics.analyze import analyze
    from shoal_analytics.session import spark_session

    params = AnalysisParams(
        window_seconds=args.window_seconds, lookback_minutes=args.lookback_minutes,
        capacity_per_replica=args.capacity_per_replica, current_replicas=args.current_replicas,
    )  # fmt: skip
    lake = Lake(args.lake)
    preflight.ingested_lake(lake)
    if args.redis_url:
        preflight.reachable_redis(args.redis_url)
    spark = spark_session(args.master)
    try:
        result = analyze(spark, lake, params)
    finally:
        spark.stop()
    if args.redis_url:
        from shoal_analytics.publish import publish_to

        publish_to(args.redis_url, result.summary)
    summary = result.summary
    flags = json.dumps(sorted({a.flag for a in summary.anomalies}))
    return (
        f'analysed {summary.records} records: {len(summary.anomalies)} anomalies {flags}; '
        f'{summary.recommended_replicas} replica(s) recommended ({summary.reason})'
    )


def _run_report(args: argparse.Namespace) -> str:
    from shoal_analytics.report import write_report

    write_report(Lake(args.lake), args.out)
    return f'wrote {args.out}'


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    run = {'ingest': _run_ingest, 'analyze': _run_analyze, 'report': _run_report}[args.command]
    try:
        message = run(args)
    except (AnalyticsError, ValueError) as exc:
        parser.exit(USAGE_ERROR, f'shoal-analytics {args.command}: error: {exc}\n')
    sys.stdout.write(message + '\n')
    return 0
