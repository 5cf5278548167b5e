"""
The replies in the bytes one store lane's connection receives, each as its command wants it.

The connection's hiredis reader (redis-py made it, with its error classes) reads most replies. It
is fed one reply at a time, as far as ``_replies.Scanner`` finds the reply goes, so the reader
always knows which command the next reply answers, and hiredis never holds more than the reply
it is reading (fed more, it moved what it held to the front of its buffer after every reply:
docs/performance.md, "Replies fed in pieces"). The reply of a plain read of new entries
(``READ_ENTRIES``) is instead made into entries in C (``_replies.entries``): hiredis made two
lists and eight objects of each entry, which ``replies.new_entries`` turned into an ``Entry``
(docs/performance.md, "Entries read in C"). Such a reply that goes on into later reads is
gathered until it is whole and then read the same way; one of another shape goes to hiredis.
"""

import collections
from collections.abc import Sequence
from typing import Any

import redis.exceptions
from redis._parsers.hiredis import NOT_ENOUGH_DATA

from shoal_broker.routing.storage import NORMAL_BAND
from shoal_broker.store import _replies


class _ReadsEntries(str):
    """The command name of ``READ_ENTRIES``: a str to hiredis's packer, told apart by its type."""


READ_ENTRIES = _ReadsEntries('XREADGROUP')
"""Sent as a command's name in place of ``'XREADGROUP'``, it marks a plain read of the default
band's new entries (``XREADGROUP ... STREAMS <stream> >``), whose reply is handed on as a list of
``Entry``; a reply of another shape (an error) is hiredis's, and ``replies.new_entries`` takes
either."""


def entry_reads(commands: Sequence[tuple[Any, ...]]) -> list[int]:
    """The positions of the ``READ_ENTRIES`` commands in a pipeline's ``commands``."""
    return [i for i, command in enumerate(commands) if type(command[0]) is _ReadsEntries]


class ReplyReader:
    """The replies of one connection, in order; a fresh one for each connection."""

    def __init__(self) -> None:
        self._scanner = _replies.Scanner(redis.exceptions.InvalidResponse)
        self._read = 0
        self._written = 0
        """Replies read and commands written: the number of the next reply, and of the next
        command's."""
        self._reads_due: collections.deque[int] = collections.deque()
        """The numbers of the replies still to come that answer ``READ_ENTRIES``."""
        self._gathered: bytearray | None = None
        """The part read so far of an entries reply that goes on into later reads."""

    def written(self, count: int, reads: list[int]) -> None:
        """A pipeline of ``count`` commands was written, ``READ_ENTRIES`` at positions
        ``reads``; called before any of its replies can be read."""
        if reads:
            self._reads_due.extend(self._written + i for i in reads)
        self._written += count

    def read(self, parser: Any, data: bytes, pos: int, stop: int, replies: list[Any]) -> int:
        """Append to ``replies`` those that end in ``data[pos:stop]`` (an entries reply may be
        read past ``stop``, to its end); the offset read up to. A stream that is not Redis's
        replies raises ``InvalidResponse``; a reply saying the connection is no use, its error."""
        scanner, due = self._scanner, self._reads_due
        while pos < stop:
            if self._gathered is not None:  # an entries reply begun in an earlier read
                end = scanner.scan(data, pos, len(data))
                upto = end if end >= 0 else len(data)
                self._gathered += memoryview(data)[pos:upto]
                pos = upto
                if end >= 0:
                    gathered, self._gathered = self._gathered, None
                    self._answered(replies, self._entries_of(parser, gathered))
                continue
            if due and due[0] == self._read and not scanner.midway:
                found = _replies.entries(data, pos, len(data), NORMAL_BAND)
                if type(found) is tuple:
                    entries, pos = found
                    self._answered(replies, entries)
                    continue
                if found is _replies.SHORT:
                    self._gathered = bytearray()
                    continue
            end = scanner.scan(data, pos, stop)
            upto = end if end >= 0 else stop
            parser.feed(data, pos, upto - pos)
            pos = upto
            if end >= 0:
                self._answered(replies, _whole(parser.gets()))
        return pos

    def _answered(self, replies: list[Any], reply: Any) -> None:
        if self._reads_due and self._reads_due[0] == self._read:
            self._reads_due.popleft()
        self._read += 1
        replies.append(reply)

    @staticmethod
    def _entries_of(parser: Any, gathered: bytearray) -> Any:
        found = _replies.entries(gathered, 0, len(gathered), NORMAL_BAND)
        if type(found) is tuple:
            return found[0]
        parser.feed(gathered)  # another shape after all: hiredis reads it
        return _whole(parser.gets())


def _whole(reply: Any) -> Any:
    """A reply the scanner found whole, as hiredis read it: an error if hiredis found less (the
    two disagree about the stream), or if it says the connection is no use."""
    if reply is NOT_ENOUGH_DATA:
        raise redis.exceptions.InvalidResponse('a reply ended where hiredis found it incomplete')
    if isinstance(reply, redis.exceptions.ConnectionError):
        raise reply
    if isinstance(reply, redis.exceptions.ReadOnlyError):
        # a primary demoted to a replica (Sentinel failover): what this connection carries can
        # no longer be written; connect again, which through Sentinel finds the new primary
        raise redis.exceptions.ConnectionError('the Redis primary is now a replica')
    return reply
