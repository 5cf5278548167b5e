"""
Stream-id arithmetic for the Redis stream data source, kept free of Spark and Redis.

An offset is ``{'id': '<ms>-<seq>', 'n': <entries ever added up to id>}``: every entry with an id
``<= id`` has been read. ``n`` makes trimming visible: Redis counts ``entries-added`` forever, so
``entries-added - length`` entries are gone, and when more are gone than we have read, some were
trimmed before being read.
"""

import dataclasses
import itertools
import json

MAX_SEQ = 2**64 - 1


@dataclasses.dataclass(frozen=True, order=True)
class StreamId:
    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> 'StreamId':
        ms, _, seq = text.partition('-')
        try:
            return cls(int(ms), int(seq or 0))
        except ValueError:
            raise ValueError(f'not a stream id: {text!r}') from None

    def __str__(self) -> str:
        return f'{self.ms}-{self.seq}'


@dataclasses.dataclass(frozen=True)
class Offset:
    id: StreamId
    added: int
    """Entries ever added to the stream up to and including ``id``."""

    @classmethod
    def start(cls) -> 'Offset':
        return cls(StreamId(0, 0), 0)

    def to_json(self) -> str:
        return json.dumps({'id': str(self.id), 'n': self.added})

    @classmethod
    def from_json(cls, value: str | dict[str, object]) -> 'Offset':
        raw = json.loads(value) if isinstance(value, str) else value
        return cls(StreamId.parse(str(raw['id'])), int(str(raw['n'])))


class DataLossError(RuntimeError):
    """Entries were trimmed from the stream before the ingest read them."""


def check_not_trimmed(stream: str, position: Offset, entries_added: int, length: int) -> None:
    """Raise ``DataLossError`` when entries after ``position`` were trimmed unread."""
    trimmed = entries_added - length
    if trimmed > position.added:
        raise DataLossError(
            f'{trimmed - position.added} entries of {stream!r} after id {position.id} were trimmed '
            'before being read (data loss): run the ingest more often than the stream is trimmed '
            '(SHOAL_METRICS_STREAM_LENGTH), or start over from a new checkpoint'
        )


def split_range(start: StreamId, end: StreamId, parts: int) -> list[tuple[str, str]]:
    """
    Split the half-open id range (start, end] into at most ``parts`` XRANGE bounds.

    Ids are millisecond timestamps, so slicing on the millisecond part balances the slices. Each
    pair is (exclusive lower bound with its ``(`` prefix, inclusive upper bound).
    """
    if end <= start:
        return []
    span = end.ms - start.ms
    parts = max(1, min(parts, span))
    bounds = [start]
    for index in range(1, parts):
        bounds.append(StreamId(start.ms + span * index // parts, MAX_SEQ))
    bounds.append(end)
    return [(f'({low}', str(high)) for low, high in itertools.pairwise(bounds) if high > low]
