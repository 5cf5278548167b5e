"""
The scheduled analytics run: `shoal-analytics ingest`, then `analyze`, in one process.

Both runners of the chart start this file: the CronJob with `python` (Spark in local mode, in the
pod), the Kubeflow Spark Operator as the application's main file (this process is then the Spark
driver in the driver pod). One process means one Python interpreter and one JVM gateway for both
steps; analyze runs only when ingest succeeded, and only once the lake holds records (a fresh
install whose brokers have written none yet is not a failed run). Settings come from the
environment the chart sets:

    SHOAL_REDIS_URL                        the Redis holding the metric stream (required)
    SHOAL_ANALYTICS_LAKE                   the lake directory (required)
    SHOAL_ANALYTICS_MAX_RECORDS_PER_BATCH  ingest micro-batch bound (optional)
    SHOAL_ANALYTICS_CAPACITY_PER_REPLICA   messages/s per replica for the recommendation (optional)
    SPARK_MASTER                           read by shoal-analytics itself (default local[*])
"""

import os
import runpy
import sys
from collections.abc import Mapping
from pathlib import Path


class JobError(Exception):
    """A step failed or the environment is incomplete; the message says which."""


def steps(env: Mapping[str, str]) -> list[list[str]]:
    """The two command lines (without the program name), in order."""
    missing = [name for name in ('SHOAL_REDIS_URL', 'SHOAL_ANALYTICS_LAKE') if not env.get(name)]
    if missing:
        raise JobError(f'missing environment: {", ".join(missing)}')
    redis_url, lake = env['SHOAL_REDIS_URL'], env['SHOAL_ANALYTICS_LAKE']
    ingest = ['ingest', '--redis-url', redis_url, '--lake', lake]
    if env.get('SHOAL_ANALYTICS_MAX_RECORDS_PER_BATCH'):
        ingest += ['--max-records-per-batch', env['SHOAL_ANALYTICS_MAX_RECORDS_PER_BATCH']]
    analyze = ['analyze', '--lake', lake, '--redis-url', redis_url]
    if env.get('SHOAL_ANALYTICS_CAPACITY_PER_REPLICA'):
        analyze += ['--capacity-per-replica', env['SHOAL_ANALYTICS_CAPACITY_PER_REPLICA']]
    return [ingest, analyze]


def has_raw_records(lake: str) -> bool:
    """Whether ingest has landed any Parquet under LAKE/raw (the CLI contract's layout)."""
    return any((Path(lake) / 'raw').rglob('*.parquet'))


def run(arguments: list[str]) -> None:
    """Run `python -m shoal_analytics ARGUMENTS` in this process; raise unless it succeeded."""
    sys.argv = ['shoal-analytics', *arguments]
    try:
        runpy.run_module('shoal_analytics', run_name='__main__', alter_sys=True)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise JobError(f'shoal-analytics {arguments[0]} exited with {exit_.code}') from None


def main() -> int:
    try:
        ingest, analyze = steps(os.environ)
        run(ingest)
        if not has_raw_records(os.environ['SHOAL_ANALYTICS_LAKE']):
            sys.stdout.write('no metric records in the lake yet: nothing to analyze\n')
            return 0
        run(analyze)
    except JobError as error:
        sys.stderr.write(f'analytics job failed: {error}\n')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
