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


LOOPBACK = '127.0.0.1'


def loopback_conf(master: str, env: Mapping[str, str], conf: Mapping[str, str]) -> dict[str, str]:
    """In local mode the driver listens on loopback unless ``SPARK_LOCAL_IP``,
    ``spark.driver.host`` or ``spark.driver.bindAddress`` say otherwise: Spark would otherwise
    bind to the machine's outward address, where nothing needs to reach a one-process job."""
    driver = {'spark.driver.host', 'spark.driver.bindAddress'} & set(conf)
    if not master.startswith('local') or env.get('SPARK_LOCAL_IP') or driver:
        return {}
    return {'spark.driver.host': LOOPBACK, 'spark.driver.bindAddress': LOOPBACK}


def spark_session(
    master: str | None = None, app_name: str = 'shoal-analytics', conf: Mapping[str, str] = {}
) -> SparkSession:
    """The (one per process) session with the ``redis_stream`` data source registered."""
    # Python workers must run this interpreter, where shoal_analytics is importable: Spark
    # pickles the data source by reference.
    os.environ.setdefault('PYSPARK_PYTHON', sys.executable)
    master = master or os.environ.get('SPARK_MASTER') or DEFAULT_MASTER
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**DEFAULT_CONF, **conf}
    for key, value in {**settings, **loopback_conf(master, os.environ, settings)}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel('WARN')
    spark.dataSource.register(RedisStreamDataSource)
    return spark
