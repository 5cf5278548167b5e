"""
One local Spark session for all analytics tests (a JVM costs seconds to start and to warm up).

Two cores, two shuffle partitions, no UI, the quick-start JIT flags of reference/spark.md §7; the
data source is registered by ``spark_session`` exactly as in production.
"""

import os
import shutil
import sys
from collections.abc import Iterator

import pytest
from processes import RedisServer
from pyspark.sql import SparkSession

from shoal_analytics.analyze import Analysis, analyze
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_analytics.session import spark_session
from shoal_analytics.synthetic import Synthetic, write_raw


@pytest.fixture(scope='session')
def spark() -> Iterator[SparkSession]:
    assert shutil.which('java'), 'java is not installed (make test installs a JRE)'
    os.environ.setdefault('SPARK_LOCAL_IP', '127.0.0.1')
    os.environ['PYSPARK_PYTHON'] = sys.executable
    session = spark_session(
        'local[2]',
        app_name='shoal-analytics-tests',
        conf={
            'spark.sql.shuffle.partitions': '2',
            'spark.ui.enabled': 'false',
            'spark.driver.extraJavaOptions': '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC',
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope='module')
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this module's own: its metrics stream holds only what the test put there."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope='session')
def planted(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Synthetic, Lake, Analysis]:
    """Synthetic records with every plant, analysed once for the analysis and report tests."""
    spec = Synthetic()
    lake = Lake(tmp_path_factory.mktemp('planted'))
    write_raw(spec, lake.raw)
    return spec, lake, analyze(spark, lake, AnalysisParams())
