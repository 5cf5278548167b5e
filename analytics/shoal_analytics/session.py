"""
The Spark session every command runs in, sized for small data (reference/spark.md §8).

Metric tables are megabytes, not terabytes: a few shuffle partitions and 8 MB splits keep both
cores busy without scheduling hundreds of empty tasks. Timestamps are UTC everywhere.

In local mode nothing outside the process needs to reach it: the driver binds to loopback and
the web UI is off (a run lasts seconds; ``spark.ui.enabled=true`` brings it back, on loopback
through ``SPARK_LOCAL_IP``). The driver logs through the package's ``assets/log4j2.properties``:
warnings a user can act on, not Spark's notices about its own defaults.
"""

import os
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

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
    """In local mode the web UI is off unless ``spark.ui.enabled`` says otherwise, and the driver
    listens on loopback unless ``SPARK_LOCAL_IP``, ``spark.driver.host`` or
    ``spark.driver.bindAddress`` say otherwise: Spark would otherwise bind to the machine's
    outward address (the UI to every address), where nothing needs to reach a one-process job."""
    if not master.startswith('local'):
        return {}
    quiet = {} if 'spark.ui.enabled' in conf else {'spark.ui.enabled': 'false'}
    driver = {'spark.driver.host', 'spark.driver.bindAddress'} & set(conf)
    if env.get('SPARK_LOCAL_IP') or driver:
        return quiet
    return {**quiet, 'spark.driver.host': LOOPBACK, 'spark.driver.bindAddress': LOOPBACK}


LOG_CONFIG = 'log4j2.properties'


def logging_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """The driver JVM's options with the package's log4j2 configuration added (kept as given
    when they name one already)."""
    options = conf.get('spark.driver.extraJavaOptions', '')
    if 'log4j2.configurationFile' in options or 'log4j.configurationFile' in options:
        return {}
    path = Path(str(resources.files('shoal_analytics').joinpath('assets', LOG_CONFIG)))
    option = f'-Dlog4j2.configurationFile={path.as_uri()}'
    return {'spark.driver.extraJavaOptions': f'{options} {option}'.strip()}


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
    local = loopback_conf(master, os.environ, settings)
    if master.startswith('local'):  # the UI, if turned on, listens on loopback too
        os.environ.setdefault('SPARK_LOCAL_IP', LOOPBACK)
    for key, value in {**settings, **local, **logging_conf(settings)}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel('WARN')
    spark.dataSource.register(RedisStreamDataSource)
    return spark
