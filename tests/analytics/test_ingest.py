"""
Ingest acceptance: records a real broker appends land as raw Parquet exactly once.

Across incremental runs, across a crash between the sink's write and the checkpoint's commit
(reproduced by removing the commit the crash prevented), and with a clear failure when entries
were trimmed before being read.
"""

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from amqpclient import connect, receive_all, receiver, send_all
from processes import RedisServer
from pyspark.sql import SparkSession

from shoal_analytics.analyze import analyze
from shoal_analytics.errors import IngestError
from shoal_analytics.ingest import ingest
from shoal_analytics.lake import Lake
from shoal_analytics.params import AnalysisParams
from shoal_broker.metrics.records import MetricRecord
from shoal_broker.store.keys import METRICS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the first also starts the JVM


def _landed(spark: SparkSession, lake: Lake) -> list[str]:
    return [row['stream_id'] for row in spark.read.parquet(str(lake.raw)).collect()]


def _stream_ids(client: redis.Redis, stream: str = METRICS) -> list[str]:
    return [entry_id for entry_id, _ in client.xrange(stream)]


def _recorded(client: redis.Redis, address: str, field: str) -> int:
    records = [MetricRecord.from_fields(fields) for _, fields in client.xrange(METRICS)]
    return sum(getattr(r, field) for r in records if r.address == address)


def _record(ts_ms: int, address: str = 'synthetic') -> dict[str, str]:
    return MetricRecord(
        ts_ms=ts_ms, interval_ms=1000, replica='r', address=address, subscription='queue',
        enqueued=1,
    ).to_fields()  # fmt: skip


def _wait_for(predicate, what: str, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f'{what} within {timeout}s'
        time.sleep(0.2)


def test_broker_records_land_exactly_once_across_runs_and_a_crash_before_commit(
    spark: SparkSession, own_redis: RedisServer, start_broker, address: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    broker = start_broker(
        redis_url=own_redis.url, env={'SHOAL_METRICS_INTERVAL_SECONDS': '0.2'}, replica_id='rec'
    )
    lake = Lake(tmp_path / 'lake')
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=50)

    # Run 1 while the broker keeps appending: a gapless prefix of the stream, no duplicates.
    send_all(conn, address, range(40))
    receive_all(rcv, 40)
    _wait_for(lambda: _recorded(client, address, 'accepted') == 40, 'records of 40 messages')
    # A blocking client sends no heartbeats while Spark runs, so on a busy machine an ingest can
    # outlast the broker's idle timeout: each phase of traffic has a connection of its own.
    conn.close()
    limit = client.xlen(METRICS) // 2 + 1  # two or three batches
    first = ingest(spark, lake, own_redis.url, max_records_per_batch=limit)
    landed = _landed(spark, lake)
    assert len(landed) == len(set(landed)) == first.rows
    assert first.batches >= 2
    assert sorted(landed, key=_key) == _stream_ids(client)[: len(landed)]

    # Run 2 after more load and the broker's exit: everything, still once.
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=60)
    send_all(conn, address, range(60))
    receive_all(rcv, 60)
    _wait_for(lambda: _recorded(client, address, 'accepted') == 100, 'records of 100 messages')
    conn.close()
    broker.stop()
    second = ingest(spark, lake, own_redis.url)
    landed = _landed(spark, lake)
    assert second.rows > 0
    assert Counter(landed) == Counter(_stream_ids(client))
    rows = spark.read.parquet(str(lake.raw)).where(f"address = '{address}'")
    totals = rows.groupBy().sum('enqueued', 'delivered', 'accepted').first()
    assert totals is not None
    assert tuple(totals) == (100, 100, 100)

    # Run 3 lands new entries (one malformed) in two batches; then the crash: the sink wrote the
    # last batch but its commit never reached the checkpoint.
    for ms in range(5):
        client.xadd(METRICS, _record(ms))
    client.xadd(METRICS, {'v': '1', 'ts_ms': 'not a number'})
    ingest(spark, lake, own_redis.url, max_records_per_batch=4)
    commits = lake.checkpoint / 'commits'
    last = commits / str(max(int(p.name) for p in commits.iterdir() if p.name.isdigit()))
    last.unlink()
    (commits / f'.{last.name}.crc').unlink()  # Hadoop's checksum of it
    client.xadd(METRICS, _record(99))  # arrives after the crash: a batch of its own
    ingest(spark, lake, own_redis.url)
    assert last.exists()  # the batch was replayed and committed this time
    assert (commits / str(int(last.name) + 1)).exists()  # and the new entry had a batch of its own
    landed = _landed(spark, lake)
    assert Counter(landed) == Counter(_stream_ids(client))
    malformed = spark.read.parquet(str(lake.raw)).where('error IS NOT NULL').collect()
    assert [row['ts_ms'] for row in malformed] == [None]
    assert 'ValueError' in malformed[0]['error']

    # The analysis reads what the ingest landed: the broker's records, the malformed one counted.
    analysis = analyze(spark, lake, AnalysisParams(window_seconds=1))
    broker_records = sum(1 for _, f in client.xrange(METRICS) if f.get('replica') == 'rec')
    assert (analysis.summary.records, analysis.malformed_records) == (broker_records, 1)
    mine = spark.read.parquet(str(lake.analysis / 'entities.parquet')).where(
        f"address = '{address}'"
    )
    assert [(row['accepted'], row['p99_ms'] is not None) for row in mine.collect()] == [(100, True)]
    client.close()


def _key(stream_id: str) -> tuple[int, int]:
    ms, seq = stream_id.split('-')
    return int(ms), int(seq)


def test_entries_trimmed_before_being_read_fail_the_ingest_clearly(
    spark: SparkSession, own_redis: RedisServer, tmp_path: Path
) -> None:
    stream = 'test:trimmed'
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    for ms in range(30):
        client.xadd(stream, _record(ms))
    lake = Lake(tmp_path / 'lake')
    assert ingest(spark, lake, own_redis.url, stream=stream).rows == 30
    for ms in range(30, 50):
        client.xadd(stream, _record(ms))
    client.xtrim(stream, maxlen=5, approximate=False)  # 15 of the 20 new ones go unread

    with pytest.raises(IngestError, match=r'data loss: 15 entries .* trimmed before being read'):
        ingest(spark, lake, own_redis.url, stream=stream)
    assert len(_landed(spark, lake)) == 30  # nothing landed, nothing committed

    # The command says the same and exits 2 (a separate process: its own JVM and session).
    result = subprocess.run(
        [sys.executable, '-m', 'shoal_analytics', 'ingest', '--redis-url', own_redis.url,
         '--lake', str(lake.root), '--stream', stream, '--master', 'local[1]'],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith('shoal-analytics ingest: error: data loss: 15 entries')

    # A new lake starts at the oldest retained entry: what was trimmed before is not its loss.
    fresh = Lake(tmp_path / 'fresh')
    assert ingest(spark, fresh, own_redis.url, stream=stream).rows == 5
    client.close()


def test_a_failure_inside_the_data_source_is_one_line_naming_its_cause(
    spark: SparkSession, own_redis: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    client.set('test:not-a-stream', 'a string where a stream should be')
    client.close()
    with pytest.raises(IngestError) as raised:
        ingest(spark, Lake(tmp_path / 'lake'), own_redis.url, stream='test:not-a-stream')
    message = str(raised.value)
    assert message.startswith('reading the stream failed: redis.exceptions.ResponseError: ')
    assert 'WRONGTYPE' in message
    assert '\n' not in message
