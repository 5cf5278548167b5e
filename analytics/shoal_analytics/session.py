"""
The Spark session every command runs in, sized for small data (reference/spark.md §8).

Metric tables are megabytes, not terabytes: a few shuffle partitions and 8 MB splits keep both
cores busy without scheduling hundreds of empty tasks. Timestamps are UTC everywhere.
"""

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from shoal_analytics.source import RedisStreamDataSource

DEFAULT_MASTER = 'local[*]'
DEFAULT_CONF: Mapping[str, str] = {
    'spark.sql.shuffle.partitions': '8',
    'spark.sql.files.maxPartitionBytes': '8m',
    'spark.sql.session.timeZone': 'UTC',
    'spark.sql.sources.partitionOverwriteMode': 'dynamic',
    'spark.ui.showConsoleProgress': 'false',
    # The record schema has ~20 columns and 10 latency buckets: plans are wide, not suspicious.
    'spark.sql.debug.maxToStringFields': '200',
}


def spark_session(
    master: str | None = None, app_name: str = 'shoal-analytics', conf: Mapping[str, str] = {}
) -> SparkSession:
    """The (one per process) session with the ``redis_stream`` data source registered."""
    # Python workers must run this interpreter, where shoal_analytics is importable: Spark
    # pickles the data source by reference.
    os.environ.setdefault('PYSPARK_PYTHON', sys.executable)
    builder = SparkSession.builder.master(
        master or os.environ.get('SPARK_MASTER') or DEFAULT_MASTER
    ).appName(app_name)
    for key, value in {**DEFAULT_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel('WARN')
    spark.dataSource.register(RedisStreamDataSource)
    return spark
