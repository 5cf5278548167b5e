"""The store lane's replies read in C (store/_replies.c): the scanner finds where each reply
ends however the bytes are split into reads, and agrees with hiredis, which is fed exactly those
bytes; a plain XREADGROUP's entries are the ones ``replies.new_entries`` makes of hiredis's
reply, a reply not all there is said to be short, and one of another shape is left to
hiredis."""

import hiredis
import pytest
import redis.exceptions
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal_broker.routing.storage import NORMAL_BAND, Entry
from shoal_broker.store import _replies
from shoal_broker.store.lane import NOT_ENOUGH_DATA
from shoal_broker.store.replies import new_entries
from shoal_broker.store.reply_reader import ReplyReader

BROKEN = redis.exceptions.InvalidResponse
SHORT = object()
"""hiredis's answer while a reply is not all there (redis-py's connections set one too: a
RESP3 false is False)."""


def bulk(value: bytes) -> bytes:
    return b'$%d\r\n%s\r\n' % (len(value), value)


def line(kind: bytes, text: bytes) -> bytes:
    return kind + text + b'\r\n'


simple_text = st.binary(max_size=40).filter(lambda b: b'\r' not in b and b'\n' not in b)
leaves = st.one_of(
    simple_text.map(lambda b: line(b'+', b)),
    simple_text.map(lambda b: line(b'-', b'ERR ' + b)),
    st.integers(-(2**62), 2**62).map(lambda i: line(b':', b'%d' % i)),
    st.binary(max_size=300).map(bulk),
    st.sampled_from([b'_\r\n', b'$-1\r\n', b'*-1\r\n', b'#t\r\n', b'#f\r\n', b',1.5\r\n',
                     b'(123456789012345678901234567890\r\n', b'=7\r\ntxt:abc\r\n']),
)  # fmt: skip


def aggregate(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    def made(kind: bytes, items: list[bytes]) -> bytes:
        return kind + b'%d\r\n' % len(items) + b''.join(items)

    def mapped(pairs: list[tuple[bytes, bytes]]) -> bytes:  # hiredis makes a dict: plain keys
        return b'%%%d\r\n' % len(pairs) + b''.join(key + value for key, value in pairs)

    keys = st.binary(max_size=20).map(bulk)
    return st.one_of(
        st.builds(made, st.sampled_from([b'*', b'>']), st.lists(children, max_size=6)),
        st.builds(mapped, st.lists(st.tuples(keys, children), max_size=4)),
    )


replies = st.recursive(leaves, aggregate, max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.lists(replies, min_size=1, max_size=12), st.data())
def test_the_scanner_finds_each_reply_s_end_however_the_bytes_are_split(
    sent: list[bytes], data: st.DataObject
) -> None:
    stream = b''.join(sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True) if b > a]
    scanner = _replies.Scanner(BROKEN)
    ends, offset = [], 0
    for read in reads:
        pos = 0
        while pos < len(read):
            end = scanner.scan(read, pos, len(read))
            if end < 0:
                break
            ends.append(offset + end)
            pos = end
        offset += len(read)
    expected, total = [], 0
    for reply in sent:
        total += len(reply)
        expected.append(total)
    assert ends == expected
    assert not scanner.midway
    for reply in sent:  # each piece is one reply to hiredis, nothing left over
        reader = hiredis.Reader(notEnoughData=SHORT)
        reader.feed(reply)
        assert reader.gets() is not SHORT
        assert reader.gets() is SHORT


@pytest.mark.parametrize(
    'stream',
    [b'@1\r\n', b'$3\r\nabcd\r\n', b'$3\r\nabc\n\n', b'*x\r\n', b'$\r\n', b'*1\rx', b'$03\r\n',
     b'*-2\r\n', b'$-0\r\n',
     b'$' + b'9' * 19 + b'\r\n', b'*1\r\n' * 65 + b':1\r\n'],
)  # fmt: skip
def test_a_stream_that_is_not_redis_replies_raises_the_error_it_was_given(stream: bytes) -> None:
    def bytewise() -> None:  # the state machine's every step
        scanner = _replies.Scanner(BROKEN)
        for i in range(len(stream)):
            scanner.scan(stream, i, i + 1)

    with pytest.raises(BROKEN, match='Protocol error'):
        bytewise()


def test_the_scanner_keeps_its_place_inside_a_line_or_a_body_across_reads() -> None:
    scanner = _replies.Scanner(BROKEN)
    stream = b'*2\r\n$10\r\n0123456789\r\n+OK\r\n:7\r\n'
    assert [scanner.scan(stream, i, i + 1) for i in range(len(stream))].count(-1) == len(stream) - 2
    assert scanner.scan(stream, 0, len(stream)) == len(stream) - 4
    with pytest.raises(TypeError):
        _replies.Scanner()  # type: ignore[call-arg]
    with pytest.raises(IndexError):
        scanner.scan(stream, 3, len(stream) + 1)


ids = st.builds(lambda ms, seq: f'{ms}-{seq}', st.integers(0, 2**48), st.integers(0, 2**20))
optional_fields = st.tuples(
    st.none() | st.integers(0, 2**53).map(lambda x: (b'x', b'%d' % x)),
    st.none() | st.text(max_size=30).map(lambda t: (b'c', t.encode())),
    st.none() | st.text(max_size=30).map(lambda t: (b'g', t.encode())),
    st.lists(st.binary(max_size=8).map(lambda v: (b'z', v)), max_size=2),  # not read by the broker
).flatmap(lambda t: st.permutations([*(pair for pair in t[:3] if pair), *t[3]]))
"""Each field append_entries.lua may write after header and rest at most once, in any order."""
stored = st.tuples(ids, st.binary(max_size=200), st.binary(max_size=1200), optional_fields)


def xreadgroup(entries: list[tuple[str, bytes, bytes, list[tuple[bytes, bytes]]]], resp3: bool
               ) -> bytes:  # fmt: skip
    body = b''
    for entry_id, header, rest, more in entries:
        fields = [b'h', header, b'r', rest, *(part for pair in more for part in pair)]
        body += b'*2\r\n' + bulk(entry_id.encode()) + b'*%d\r\n' % len(fields)
        body += b''.join(bulk(f) for f in fields)
    stream = bulk(b'shoal:{a:q}:p:5') + b'*%d\r\n' % len(entries) + body
    return (b'%1\r\n' if resp3 else b'*1\r\n*2\r\n') + stream


@settings(max_examples=200, deadline=None)
@given(st.lists(stored, max_size=6), st.booleans(), st.binary(max_size=20))
def test_entries_read_in_c_are_those_new_entries_makes_of_hiredis_s_reply(
    entries: list[tuple[str, bytes, bytes, list[tuple[bytes, bytes]]]], resp3: bool, after: bytes
) -> None:
    reply = xreadgroup(entries, resp3)
    reader = hiredis.Reader()
    reader.feed(reply)
    expected = new_entries(reader.gets())
    read = _replies.entries(b'!' + reply + after, 1, 1 + len(reply) + len(after), NORMAL_BAND)
    assert read is not None
    made, end = read
    assert end == 1 + len(reply)
    assert made == expected
    assert all(type(e) is Entry for e in made)
    assert new_entries(made) == made  # the lane's entries pass through as they are
    for cut in range(len(reply)):  # not all there: read once it is
        assert _replies.entries(bytearray(reply), 0, cut, NORMAL_BAND) is _replies.SHORT


@pytest.mark.parametrize(
    ('reply', 'read'),
    [
        (b'_\r\n', ([], 3)),  # RESP3 null: nothing new
        (b'*-1\r\n', ([], 5)),  # RESP2 null
        (b'-NOGROUP No such key or consumer group\r\n', None),  # errors are hiredis's to make
        (b'%2\r\n$1\r\na\r\n*0\r\n$1\r\nb\r\n*0\r\n', None),  # more than one stream
        (b'%1\r\n$1\r\na\r\n*1\r\n*2\r\n$3\r\n1-0\r\n_\r\n', None),  # a deleted entry
        (
            b'%1\r\n$1\r\na\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*4\r\n$1\r\nr\r\n$0\r\n\r\n$1\r\nh\r\n'
            b'$0\r\n\r\n',
            None,
        ),  # fields not in append_entries.lua's order
        (
            b'%1\r\n$1\r\na\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*6\r\n$1\r\nh\r\n$0\r\n\r\n$1\r\nr\r\n'
            b'$0\r\n\r\n$1\r\nx\r\n$2\r\n1x\r\n',
            None,
        ),  # an expiry that is not a number
        (
            b'%1\r\n$1\r\na\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*6\r\n$1\r\nh\r\n$0\r\n\r\n$1\r\nr\r\n'
            b'$0\r\n\r\n$1\r\nc\r\n$1\r\n\xff\r\n',
            None,
        ),  # an origin that is not UTF-8
        (
            b'%1\r\n$1\r\na\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*8\r\n$1\r\nh\r\n$0\r\n\r\n$1\r\nr\r\n'
            b'$0\r\n\r\n$1\r\nx\r\n$1\r\n?\r\n$1\r\nx\r\n$1\r\n7\r\n',
            None,
        ),  # a field twice (fuzzing: new_entries reads both, and refuses the first)
        (
            b'%1\r\n$1\r\na\r\n*1\r\n*2\r\n$03\r\n1-0\r\n*4\r\n$1\r\nh\r\n$0\r\n\r\n$1\r\nr\r\n'
            b'$0\r\n\r\n',
            None,
        ),  # a length with a leading zero, which hiredis refuses (fuzzing)
    ],
)
def test_a_reply_of_another_shape_is_left_to_hiredis(reply: bytes, read: object) -> None:
    assert _replies.entries(reply, 0, len(reply), NORMAL_BAND) == read


def hiredis_as_redis_py() -> hiredis.Reader:
    return hiredis.Reader(protocolError=BROKEN, replyError=redis.exceptions.ResponseError,
                          notEnoughData=NOT_ENOUGH_DATA)  # fmt: skip


def read_in_pieces(reader: ReplyReader, stream: bytes, cuts: list[int]) -> list[object]:
    """The replies ``reader`` finds in ``stream``, handed over in reads ending at ``cuts``."""
    parser, replies = hiredis_as_redis_py(), []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        piece, pos = stream[a:b], 0
        while pos < len(piece):
            pos = reader.read(parser, piece, pos, len(piece), replies)
    return replies


@pytest.mark.parametrize('cut_into_entries', [0, 7, 40, 90])
def test_the_reader_hands_each_command_its_reply_and_gathers_entries_split_over_reads(
    cut_into_entries: int,
) -> None:
    entries = [('1-0', b'H', b'R' * 30, [(b'c', b'conn')]), ('2-0', b'H2', b'', [])]
    read = xreadgroup(entries, resp3=True)
    # fields out of append_entries.lua's order: hiredis reads it, whole, once it is all there
    odd = read.replace(b'$1\r\nh\r\n$1\r\nH\r\n$1\r\nr\r\n', b'$1\r\nr\r\n$1\r\nH\r\n$1\r\nh\r\n')
    stream = b'+OK\r\n' + read + b':5\r\n' + odd + b'-ERR no\r\n'
    reader = ReplyReader()
    reader.written(5, [1, 3])
    start = len(b'+OK\r\n')
    cuts = sorted({start + cut_into_entries, start + len(read) + 4 + cut_into_entries})
    replies = read_in_pieces(reader, stream, cuts)
    assert replies[0] == b'OK'
    assert replies[1] == [Entry('1-0', NORMAL_BAND, b'H', b'R' * 30, 0, 0, 'conn'),
                          Entry('2-0', NORMAL_BAND, b'H2', b'', 0, 0)]  # fmt: skip
    assert replies[2] == 5
    assert isinstance(replies[3], dict)  # hiredis's reading of the odd one
    assert isinstance(replies[4], redis.exceptions.ResponseError)
    assert len(replies) == 5
