"""
``redis_stream``: a PySpark Python data source over a Redis stream (batch and streaming).

Offsets are stream ids plus Redis's ``entries-added`` counter (``offsets.py``), so a checkpointed
streaming query replays exactly the same id ranges after a crash, and entries trimmed before they
were read fail the query instead of vanishing. Each partition is an XRANGE slice read on the
executor over its own connection. Options (Spark lower-cases their names):

- ``url``: ``redis://host:port/db`` without a password; the password, if any, comes from the
  environment variable named by ``passwordEnv`` (default ``SHOAL_REDIS_PASSWORD``), because
  options show up in query plans and logs.
- ``stream`` (default ``shoal:metrics``), ``numPartitions`` (2), ``pageSize`` (5000).
- ``maxRecordsPerBatch``: admission control per micro-batch (default: everything available).
- ``failOnDataLoss`` (``true``).
"""

import os
from collections.abc import Iterator
from typing import Any, cast

import redis
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from shoal_analytics.offsets import Offset, StreamId, check_not_trimmed, split_range
from shoal_analytics.rows import RAW_DDL, RawRow, raw_row
from shoal_broker.store.connect import SyncRedis, sync_client_of_any_mode
from shoal_broker.store.keys import METRICS

NAME = 'redis_stream'
DEFAULT_PASSWORD_ENV = 'SHOAL_REDIS_PASSWORD'


class _Options:
    """Typed access to the data source options (a case-insensitive mapping; never ``dict()`` it)."""

    def __init__(self, options: Any) -> None:
        self._options = options

    def get(self, name: str, default: str) -> str:
        value = self._options.get(name)
        return default if value is None else str(value)

    @property
    def stream(self) -> str:
        return self.get('stream', METRICS)

    def connect(self) -> SyncRedis:
        url = self.get('url', '')
        if not url:
            raise ValueError('redis_stream needs the option url (redis://host:port/db)')
        password = os.environ.get(self.get('passwordEnv', DEFAULT_PASSWORD_ENV)) or None
        arguments: dict[str, Any] = {'decode_responses': True}
        if password is not None:
            arguments['password'] = password
        return sync_client_of_any_mode(url, **arguments)


Entry = tuple[str, dict[str, str]]


def _xrange(client: SyncRedis, stream: str, low: str, high: str, count: int) -> list[Entry]:
    # decode_responses=True: ids and fields are str (redis-py types replies as bytes | str).
    return cast(list[Entry], client.xrange(stream, min=low, max=high, count=count))


class _Slice(InputPartition):
    def __init__(self, low: str, high: str) -> None:
        super().__init__((low, high))
        self.low = low
        self.high = high


def _read_slice(options: _Options, part: _Slice) -> Iterator[RawRow]:
    page = int(options.get('pageSize', '5000'))
    client = options.connect()
    try:
        low = part.low
        while True:
            entries = _xrange(client, options.stream, low, part.high, page)
            for entry_id, fields in entries:
                yield raw_row(entry_id, fields)
            if len(entries) < page:
                return
            low = '(' + entries[-1][0]
    finally:
        client.close()


class _Tail:
    """Where the stream stands, read atomically with one XINFO STREAM."""

    def __init__(self, client: SyncRedis, stream: str) -> None:
        try:
            info: dict[str, Any] = client.xinfo_stream(stream)
        except redis.ResponseError as exc:
            if 'no such key' not in str(exc).lower():
                raise
            info = {'last-generated-id': '0-0', 'entries-added': 0, 'length': 0}
        if 'entries-added' not in info:
            raise RuntimeError('redis_stream needs Redis >= 7.0 (XINFO STREAM entries-added)')
        last = StreamId.parse(str(info['last-generated-id']))
        self.last = Offset(last, int(info['entries-added']))
        self.length = int(info['length'])

    @property
    def trimmed(self) -> int:
        return self.last.added - self.length


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: _Options) -> None:
        self.options = options
        self._client: SyncRedis | None = None
        self._cap: Offset | None = None

    @property
    def client(self) -> SyncRedis:
        if self._client is None:
            self._client = self.options.connect()
        return self._client

    def _tail(self) -> _Tail:
        return _Tail(self.client, self.options.stream)

    def initialOffset(self) -> dict[str, Any]:
        # A first run starts at the oldest entry still retained: what was trimmed before this
        # ingest ever ran is history, not data loss.
        return {'id': '0-0', 'n': self._tail().trimmed}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.get('maxRecordsPerBatch', '')
        return ReadMaxRows(int(limit)) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._cap = self._tail().last

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        position = Offset.from_json(start)
        tail = self._tail()
        if self.options.get('failOnDataLoss', 'true').lower() == 'true':
            check_not_trimmed(self.options.stream, position, tail.last.added, tail.length)
        cap = self._cap or tail.last
        if isinstance(limit, ReadMaxRows) and cap.added - position.added > limit.max_rows:
            entries = _xrange(
                self.client, self.options.stream, f'({position.id}', str(cap.id), limit.max_rows
            )
            if entries:
                cap = Offset(StreamId.parse(entries[-1][0]), position.added + len(entries))
        end = cap if cap.id > position.id else position
        return {'id': str(end.id), 'n': end.added}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        parts = int(self.options.get('numPartitions', '2'))
        low, high = Offset.from_json(start).id, Offset.from_json(end).id
        return [_Slice(lo, hi) for lo, hi in split_range(low, high, parts)]

    def read(self, partition: InputPartition) -> Iterator[RawRow]:
        assert isinstance(partition, _Slice)
        return _read_slice(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the broker bounds the stream by length, not by what was read."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _BatchReader(DataSourceReader):
    """Everything the stream holds now (for ad-hoc reads, ``spark.read.format(...)``)."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        client = self.options.connect()
        try:
            tail = _Tail(client, self.options.stream)
        finally:
            client.close()
        parts = int(self.options.get('numPartitions', '2'))
        return [_Slice(lo, hi) for lo, hi in split_range(StreamId(0, 0), tail.last.id, parts)]

    def read(self, partition: InputPartition) -> Iterator[RawRow]:
        assert isinstance(partition, _Slice)
        return _read_slice(self.options, partition)


class RedisStreamDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType | str:
        return RAW_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_Options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(_Options(self.options))
