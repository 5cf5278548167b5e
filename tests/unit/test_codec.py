"""
The AMQP section codec against proton's own encoder and decoder as the oracle.

Messages are built with ``proton.Message(...).encode()``; where proton never emits an encoding
(list8, map8, array8), the bytes are written by hand and checked against proton's decoder first.
"""

import itertools
import random
import uuid
from typing import Any

import proton
import pytest

from shoal_broker.amqp import codec, engine, recode

MA = proton.symbol
JMS_MSG_TYPE = MA('x-opt-jms-msg-type')
JMS_DEST = MA('x-opt-jms-dest')


def encode_message(**fields: Any) -> bytes:
    fields.setdefault('body', 'hello')
    return bytes(proton.Message(**fields).encode())


def decode_message(buf: bytes) -> proton.Message:
    message = proton.Message()
    message.decode(buf)
    return message


def encode_value(value: Any) -> bytes:
    data = proton.Data()
    data.put_object(value)
    return bytes(data.encode())


def compound8(code: int, *items: bytes) -> bytes:
    """A list8 (0xc0) or map8 (0xc1) of already encoded items."""
    body = b''.join(items)
    return bytes([code, len(body) + 1, len(items)]) + body


def proton_value(buf: bytes) -> Any:
    """The first value in ``buf`` as proton decodes it (raises if proton cannot)."""
    data = proton.Data()
    consumed = data.decode(buf)
    assert consumed == len(buf), 'test bytes must hold exactly one value'
    data.rewind()
    data.next()
    value = data.get_object()
    # binary comes back as a view into proton's buffer, freed with ``data``: copy it now
    return bytes(value) if isinstance(value, memoryview) else value


def sections(buf: bytes) -> list[tuple[int, int, int]]:
    """(descriptor, start, end) of every section, as proton's decoder splits the message."""
    found = []
    pos = 0
    data = proton.Data()
    while pos < len(buf):
        data.clear()
        consumed = data.decode(buf[pos:])
        data.rewind()
        data.next()
        data.enter()
        data.next()
        found.append((int(data.get_object()), pos, pos + consumed))
        data.exit()
        pos += consumed
    return found


def section_bytes(buf: bytes, descriptor: int) -> bytes:
    for code, start, end in sections(buf):
        if code == descriptor:
            return buf[start:end]
    return b''


def tail_from_first(buf: bytes, descriptors: set[int]) -> bytes:
    """``buf`` from the first section whose descriptor is in ``descriptors``."""
    for code, start, _ in sections(buf):
        if code in descriptors:
            return buf[start:]
    return b''


def map_keys(section: bytes) -> list[Any]:
    """Every key of a described map section in encoded order, duplicates included."""
    data = proton.Data()
    data.decode(section)
    data.rewind()
    data.next()
    data.enter()
    data.next()  # descriptor
    data.next()  # the map
    data.enter()
    keys = []
    while data.next():
        keys.append(data.get_object())
        data.next()
    return keys


# Every section except header and delivery annotations: what ``rest`` keeps.
BARE_SECTIONS = set(range(codec.MESSAGE_ANNOTATIONS, codec.FOOTER + 1))


# -- parse ------------------------------------------------------------------------------------


def test_parse_reads_the_header_fields() -> None:
    buf = encode_message(durable=True, priority=7, ttl=5.0, delivery_count=3)
    header = codec.parse(buf).header
    assert header == codec.Header(durable=True, priority=7, ttl=5000, delivery_count=3)


def test_parse_reads_first_acquirer() -> None:
    assert codec.parse(encode_message(first_acquirer=True)).header.first_acquirer is True


def test_parse_reads_to_and_the_expiry_time_in_milliseconds() -> None:
    buf = encode_message(address='orders', expiry_time=1700000000.5, creation_time=1600000000.25)
    view = codec.parse(buf)
    assert view.to == 'orders'
    assert view.absolute_expiry_time == 1700000000500


def test_parse_leaves_absent_properties_as_none() -> None:
    view = codec.parse(encode_message())
    assert (view.to, view.absolute_expiry_time, view.group) == (None, None, None)


@pytest.mark.parametrize(('group_id', 'group'), [('acct-1', 'acct-1'), ('', None), (None, None)])
def test_parse_and_the_c_walk_read_the_group_id(group_id: str | None, group: str | None) -> None:
    buf = encode_message(address='q', group_id=group_id, group_sequence=3)
    assert codec.parse(buf).group == group
    offsets = engine.scan(buf)
    assert offsets is not None
    assert codec.view(buf, offsets).group == group


def test_parse_keeps_message_annotation_types_and_symbol_keys() -> None:
    buf = encode_message(
        annotations={
            JMS_MSG_TYPE: proton.byte(5),
            JMS_DEST: proton.byte(0),
            MA('x-text'): 'hi',
            MA('x-long'): proton.ulong(2**40),
        }
    )
    annotations = codec.parse(buf).annotations
    expected = {'x-opt-jms-msg-type': 5, 'x-opt-jms-dest': 0, 'x-text': 'hi', 'x-long': 2**40}
    assert annotations == expected
    assert all(type(key) is codec.Symbol for key in annotations)
    assert type(annotations['x-opt-jms-msg-type']) is int
    assert type(annotations['x-text']) is str


def test_parse_header_bytes_are_the_encoded_header_section() -> None:
    buf = encode_message(durable=True, priority=9)
    assert codec.parse(buf).header_bytes == section_bytes(buf, codec.HEADER)
    assert codec.parse(buf).header_bytes != b''


def test_rest_starts_at_the_message_annotations() -> None:
    buf = encode_message(durable=True, annotations={JMS_DEST: proton.byte(0)}, address='q')
    rest = codec.parse(buf).rest
    assert rest == tail_from_first(buf, {codec.MESSAGE_ANNOTATIONS})
    assert buf.endswith(rest)


def test_rest_starts_at_the_properties_without_message_annotations() -> None:
    buf = encode_message(durable=True, address='q')
    assert codec.parse(buf).rest == tail_from_first(buf, {codec.PROPERTIES})


def test_rest_drops_the_delivery_annotations() -> None:
    buf = encode_message(
        durable=True,
        instructions={MA('x-opt-hop'): 'one'},
        annotations={JMS_DEST: proton.byte(1)},
    )
    view = codec.parse(buf)
    assert section_bytes(buf, codec.DELIVERY_ANNOTATIONS) != b''
    assert view.rest == tail_from_first(buf, {codec.MESSAGE_ANNOTATIONS})
    assert codec.parse(view.header_bytes + view.rest).annotations == {'x-opt-jms-dest': 1}
    assert decode_message(view.header_bytes + view.rest).instructions is None


def test_a_message_without_a_header_has_no_header_bytes_and_the_default_header() -> None:
    full = encode_message(address='q')
    headerless = tail_from_first(full, BARE_SECTIONS)
    assert section_bytes(headerless, codec.HEADER) == b''
    view = codec.parse(headerless)
    assert view.header_bytes == b''
    assert view.header == codec.Header()
    assert view.header.priority == 4
    assert view.rest == headerless
    assert view.to == 'q'


def test_a_header_with_only_defaults_decodes_to_the_default_header() -> None:
    view = codec.parse(encode_message())
    assert view.header == codec.Header()


def test_parse_reads_a_section_named_by_its_symbolic_descriptor() -> None:
    # Section descriptors may be symbols instead of ulong codes (AMQP 1.0 §1.5).
    header = b'\x00\xa3\x10amqp:header:list' + b'\xc0\x04\x02\x41\x50\x08'
    body = b'\x00\x53\x77\xa1\x01x'
    assert proton_value(header) == proton.Described(MA('amqp:header:list'), [True, 8])
    view = codec.parse(header + body)
    assert view.header == codec.Header(durable=True, priority=8)
    assert view.rest == body


def test_parse_decodes_an_annotations_encoding_once_and_shares_it_read_only() -> None:
    first = codec.parse(encode_message(annotations={JMS_MSG_TYPE: proton.byte(5)}))
    again = codec.parse(encode_message(annotations={JMS_MSG_TYPE: proton.byte(5)}, address='q'))
    other = codec.parse(encode_message(annotations={JMS_MSG_TYPE: proton.byte(3)}))
    assert first.annotations is again.annotations
    assert first.annotations == {'x-opt-jms-msg-type': 5}
    assert other.annotations == {'x-opt-jms-msg-type': 3}
    with pytest.raises(TypeError):
        first.annotations['x-opt-jms-msg-type'] = 1  # type: ignore[index]


def test_parse_reads_annotations_right_past_the_cache_bound() -> None:
    # a delivery time differs on every message: the cache starts over rather than fill up
    for due in range(codec.MAX_CACHED_ANNOTATIONS + 3):
        annotations = {MA('x-opt-delivery-time'): proton.timestamp(due)}
        view = codec.parse(encode_message(annotations=annotations))
        assert view.annotations == {'x-opt-delivery-time': due}


def test_large_sections_are_decoded_but_never_kept() -> None:
    # the caches are keyed by section bytes: a peer sending big, ever different sections must
    # not grow them (1024 entries of up to MAX_CACHED_SECTION_BYTES each)
    codec._ANNOTATIONS.clear()
    codec._HEADERS.clear()
    big = 'x' * codec.MAX_CACHED_SECTION_BYTES
    for i in range(3):
        annotations = {MA('x-opt-big'): f'{i}{big}'}
        view = codec.parse(encode_message(annotations=annotations, ttl=float(i + 1)))
        assert view.annotations == {'x-opt-big': f'{i}{big}'}
        assert view.header.ttl == (i + 1) * 1000
    assert codec._ANNOTATIONS == {}
    assert len(codec._HEADERS) == 3  # small headers are still kept


def test_parse_reads_a_timestamp_before_1970_as_negative() -> None:
    buf = encode_message(creation_time=-1.0, expiry_time=-2.0)
    assert decode_message(buf).expiry_time == -2.0
    assert codec.parse(buf).absolute_expiry_time == -2000


HEADER_VARIANTS: list[dict[str, Any]] = [
    {},
    {'durable': True},
    {'priority': 0},
    {'priority': 9},
    {'ttl': 1.5},
    {'delivery_count': 7},
    {'first_acquirer': True},
    {'durable': True, 'priority': 5, 'ttl': 60.0, 'delivery_count': 2},
]
BARE_VARIANTS: list[dict[str, Any]] = [
    {},
    {'address': 'orders'},
    {'expiry_time': 1700000001.0, 'creation_time': 1700000000.0},
    {'annotations': {JMS_MSG_TYPE: proton.byte(5), MA('x-opt-n'): proton.int32(-3)}},
    {'instructions': {MA('x-opt-hop'): 'one'}},
    {
        'instructions': {MA('x-opt-hop'): 'one'},
        'annotations': {JMS_DEST: proton.byte(2)},
        'address': 'topic-a',
        'subject': 'subject',
        'id': uuid.UUID(int=7),
        'properties': {'app': 1},
    },
]
BODIES: list[Any] = ['text', b'\x00\x01binary', [1, 'two'], None, {'k': 'v'}]
ROUND_TRIPS = [
    {**h, **b, 'body': BODIES[i % len(BODIES)]}
    for i, (h, b) in enumerate(itertools.product(HEADER_VARIANTS, BARE_VARIANTS))
]


@pytest.mark.parametrize('fields', ROUND_TRIPS, ids=[str(i) for i in range(len(ROUND_TRIPS))])
def test_parse_agrees_with_proton_over_many_messages(fields: dict[str, Any]) -> None:
    buf = encode_message(**fields)
    oracle = decode_message(buf)
    view = codec.parse(buf)

    assert view.header.durable == oracle.durable
    assert view.header.priority == oracle.priority
    assert view.header.ttl == (round(oracle.ttl * 1000) if oracle.ttl else None)
    assert view.header.first_acquirer == oracle.first_acquirer
    assert view.header.delivery_count == oracle.delivery_count
    assert view.to == oracle.address
    expiry = oracle.expiry_time
    assert view.absolute_expiry_time == (round(expiry * 1000) if expiry else None)
    assert view.annotations == dict(oracle.annotations or {})
    assert view.header_bytes == section_bytes(buf, codec.HEADER)
    assert view.rest == tail_from_first(buf, BARE_SECTIONS)
    assert decode_message(view.header_bytes + view.rest).body == oracle.body
    offsets = engine.scan(buf)  # what the broker does: the walk in C, then codec.view
    assert offsets is not None, 'the C walk left a message of a real client to Python'
    assert codec.view(buf, offsets) == view


# -- the C walk (amqp/_wire.c) against codec.parse ----------------------------------------------


def _outcome(parse: Any) -> Any:
    try:
        return parse()
    except codec.DecodeError as exc:
        return f'DecodeError: {exc}'


def _damaged(buf: bytes, rng: random.Random) -> list[bytes]:
    """Every truncation of ``buf``, and byte flips: a few at random places, and one at every
    constructor-or-length position of the first 64 bytes."""
    out = [buf[:cut] for cut in range(len(buf))]
    for _ in range(24):
        at = rng.randrange(len(buf))
        out.append(buf[:at] + bytes([rng.randrange(256)]) + buf[at + 1 :])
    for at in range(min(64, len(buf))):
        for value in (0x00, 0x40, 0x45, 0xA1, 0xB1, 0xC0, 0xD0, 0xFF, buf[at] ^ 0x80):
            out.append(buf[:at] + bytes([value]) + buf[at + 1 :])
    return out


def test_the_c_walk_agrees_with_parse_on_damaged_messages() -> None:
    """Whenever the C walk takes a message, ``codec.view`` of its offsets is what ``parse``
    makes of it, value or error; everything else goes to ``parse`` whole."""
    rng = random.Random(8)
    taken = 0
    for fields in ROUND_TRIPS:
        for buf in _damaged(encode_message(**fields), rng):
            offsets = engine.scan(buf)
            if offsets is None:
                continue
            taken += 1
            assert _outcome(lambda b=buf, o=offsets: codec.view(b, o)) == _outcome(
                lambda b=buf: codec.parse(b)
            ), buf.hex()
    assert taken > 1000  # the walk took most prefixes that end on a section boundary and more


def test_the_c_skip_agrees_with_skip() -> None:
    rng = random.Random(9)
    samples = [encode_value(v) for v in (None, True, 7, -1, 2**40, 'text', b'raw', [1, 'a'],
                                          {'k': [1.5, None]}, uuid.UUID(int=3))]  # fmt: skip
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))) for _ in range(4000)]
    samples.append(b'\x00' * 70 + b'\x40')  # described values nested past MAX_DEPTH
    for buf in samples:
        expected = _outcome(lambda b=buf: codec.skip(b, 0))
        end = engine.wire.shoal_skip(buf, len(buf), 0)
        assert (end if end >= 0 else 'error') == (
            expected if isinstance(expected, int) else 'error'
        ), buf.hex()


# -- delivery_header --------------------------------------------------------------------------


def test_delivery_header_on_a_first_delivery_is_the_stored_bytes_themselves() -> None:
    header = codec.parse(encode_message(durable=True, priority=6, delivery_count=2)).header_bytes
    assert recode.delivery_header(header, 0) is header


def test_delivery_header_of_no_header_on_a_first_delivery_is_empty() -> None:
    assert recode.delivery_header(b'', 0) == b''


@pytest.mark.parametrize('failed', [1, 2, 9, 300])
@pytest.mark.parametrize(
    'fields',
    [
        {},
        {'delivery_count': 4},
        {'durable': True, 'priority': 9, 'ttl': 30.0, 'delivery_count': 1},
        {'priority': 0, 'first_acquirer': True},
        {'durable': True, 'ttl': 0.25},
    ],
)
def test_delivery_header_raises_the_count_and_keeps_the_other_fields(
    fields: dict[str, Any], failed: int
) -> None:
    buf = encode_message(address='q', **fields)
    original = decode_message(buf)
    view = codec.parse(buf)

    redelivered = decode_message(recode.delivery_header(view.header_bytes, failed) + view.rest)

    assert redelivered.delivery_count == original.delivery_count + failed
    assert redelivered.durable == original.durable
    assert redelivered.priority == original.priority
    assert redelivered.ttl == original.ttl
    assert redelivered.first_acquirer is False
    assert redelivered.address == 'q'
    assert redelivered.body == 'hello'


def test_delivery_header_without_a_stored_header_counts_from_zero() -> None:
    rest = codec.parse(encode_message()).rest
    redelivered = decode_message(recode.delivery_header(b'', 3) + rest)
    assert redelivered.delivery_count == 3
    assert redelivered.priority == 4
    assert redelivered.durable is False


def test_encode_header_leaves_out_trailing_defaults() -> None:
    assert recode.encode_header(codec.Header()) == b'\x00\x53\x70\x45'
    assert recode.encode_header(codec.Header(durable=True)) == b'\x00\x53\x70\xc0\x02\x01\x41'


# -- with_annotations -------------------------------------------------------------------------

DEAD_LETTER = {'x-opt-shoal-original-address': 'orders', 'x-opt-shoal-reason': 'rejected'}


def test_with_annotations_keeps_existing_annotations_and_their_types() -> None:
    buf = encode_message(
        durable=True,
        address='orders',
        annotations={JMS_MSG_TYPE: proton.byte(5), MA('x-opt-n'): proton.int32(-3)},
    )
    view = codec.parse(buf)

    moved = decode_message(view.header_bytes + recode.with_annotations(view.rest, DEAD_LETTER))

    annotations = moved.annotations
    assert annotations == {'x-opt-jms-msg-type': 5, 'x-opt-n': -3, **DEAD_LETTER}
    assert type(annotations['x-opt-jms-msg-type']) is proton.byte
    assert type(annotations['x-opt-n']) is proton.int32
    assert all(type(key) is proton.symbol for key in annotations)
    assert type(annotations['x-opt-shoal-reason']) is str
    assert moved.address == 'orders'
    assert moved.body == 'hello'
    assert moved.durable is True


def test_with_annotations_leaves_the_bare_message_byte_for_byte() -> None:
    buf = encode_message(annotations={JMS_DEST: proton.byte(0)}, address='q', properties={'a': 1})
    rest = codec.parse(buf).rest
    bare = tail_from_first(buf, {codec.PROPERTIES})

    annotated = recode.with_annotations(rest, DEAD_LETTER)

    assert annotated.endswith(bare)
    assert sections(annotated)[0][0] == codec.MESSAGE_ANNOTATIONS
    assert annotated[: -len(bare)] == section_bytes(annotated, codec.MESSAGE_ANNOTATIONS)


def test_with_annotations_adds_a_section_when_there_is_none() -> None:
    buf = encode_message(address='q', body=b'payload')
    rest = codec.parse(buf).rest
    assert section_bytes(rest, codec.MESSAGE_ANNOTATIONS) == b''

    annotated = recode.with_annotations(rest, DEAD_LETTER)

    assert annotated.endswith(rest)
    moved = decode_message(annotated)
    assert moved.annotations == DEAD_LETTER
    assert moved.address == 'q'
    assert moved.body == b'payload'
    assert codec.parse(annotated).annotations == DEAD_LETTER


def test_with_annotations_on_an_empty_rest_is_just_the_section() -> None:
    annotated = recode.with_annotations(b'', {'k': 'v'})
    assert [code for code, _, _ in sections(annotated)] == [codec.MESSAGE_ANNOTATIONS]
    assert codec.parse(annotated).annotations == {'k': 'v'}


def test_with_annotations_extends_a_map8_section() -> None:
    map8 = compound8(0xC1, b'\xa3\x01a', b'\x51\x05')
    body = b'\x00\x53\x77\xa1\x01x'
    rest = b'\x00\x53\x72' + map8 + body
    assert decode_message(rest).annotations == {'a': 5}

    moved = decode_message(recode.with_annotations(rest, {'b': 'c'}))

    assert moved.annotations == {'a': 5, 'b': 'c'}
    assert type(moved.annotations['a']) is proton.byte
    assert moved.body == 'x'


def test_with_annotations_adds_a_long_value() -> None:
    reason = 'r' * 300
    rest = codec.parse(encode_message()).rest
    assert decode_message(recode.with_annotations(rest, {'why': reason})).annotations == {
        'why': reason
    }


def test_with_annotations_replaces_a_key_that_is_already_there() -> None:
    rest = codec.parse(encode_message(annotations={MA('x-opt-shoal-reason'): 'expired'})).rest

    annotated = recode.with_annotations(rest, {'x-opt-shoal-reason': 'rejected'})

    assert decode_message(annotated).annotations == {'x-opt-shoal-reason': 'rejected'}
    keys = map_keys(section_bytes(annotated, codec.MESSAGE_ANNOTATIONS))
    assert keys == ['x-opt-shoal-reason']


# -- skip and decode --------------------------------------------------------------------------


LIST8 = compound8(0xC0, b'\x50\x07', b'\xa1\x01a')
MAP8 = compound8(0xC1, b'\xa3\x01k', b'\xa1\x03val')
ARRAY8 = b'\xe0\x05\x03\x50\x01\x02\x03'
SAMPLE_UUID = uuid.UUID('12345678-1234-5678-1234-567812345678')

VALUES: list[tuple[str, bytes, Any]] = [
    ('list8', LIST8, [7, 'a']),
    ('list32', encode_value([1, 'two', None]), [1, 'two', None]),
    ('list32 long', encode_value(list(range(200))), list(range(200))),
    ('map8', MAP8, {'k': 'val'}),
    ('map32', encode_value({MA('a'): 1, MA('b'): 'x'}), {'a': 1, 'b': 'x'}),
    ('map32 long', encode_value({str(i): i for i in range(100)}), {str(i): i for i in range(100)}),
    ('described', encode_value(proton.Described(MA('d'), 5)), codec.Described('d', 5)),
    ('uuid', encode_value(SAMPLE_UUID), SAMPLE_UUID),
    ('vbin8', encode_value(b'abc'), b'abc'),
    ('vbin32', encode_value(b'x' * 300), b'x' * 300),
    ('str8', encode_value('z'), 'z'),
    ('str32', encode_value('y' * 300), 'y' * 300),
    ('str32 utf8', encode_value('é' * 200), 'é' * 200),
    ('sym8', encode_value(MA('s')), codec.Symbol('s')),
    ('sym32', encode_value(MA('s' * 300)), codec.Symbol('s' * 300)),
    ('null', b'\x40', None),
    ('true', b'\x41', True),
    ('false', b'\x42', False),
    ('boolean', b'\x56\x01', True),
    ('uint0', b'\x43', 0),
    ('ulong0', b'\x44', 0),
    ('list0', b'\x45', []),
    ('ubyte', encode_value(proton.ubyte(200)), 200),
    ('byte', encode_value(proton.byte(-5)), -5),
    ('ushort', encode_value(proton.ushort(65535)), 65535),
    ('short', encode_value(proton.short(-5)), -5),
    ('uint', encode_value(proton.uint(2**32 - 1)), 2**32 - 1),
    ('smalluint', b'\x52\x09', 9),
    ('int', encode_value(proton.int32(-70000)), -70000),
    ('smallint', encode_value(proton.int32(-7)), -7),
    ('ulong', encode_value(proton.ulong(2**64 - 1)), 2**64 - 1),
    ('smallulong', b'\x53\x70', 0x70),
    ('long', encode_value(-(2**63)), -(2**63)),
    ('smalllong', b'\x55\xfe', -2),
    ('float', encode_value(proton.float32(1.5)), 1.5),
    ('double', encode_value(2.5), 2.5),
    ('char', encode_value(proton.char('é')), 'é'),
    ('timestamp', encode_value(proton.timestamp(1700000000000)), 1700000000000),
]


@pytest.mark.parametrize(('name', 'buf', 'expected'), VALUES, ids=[v[0] for v in VALUES])
def test_decode_agrees_with_proton(name: str, buf: bytes, expected: Any) -> None:
    oracle = proton_value(buf)
    if not isinstance(expected, codec.Described):
        assert oracle == expected
    value, end = codec.decode(buf, 0)
    assert value == expected
    assert type(value) is type(expected)
    assert end == len(buf)


@pytest.mark.parametrize(('name', 'buf', 'expected'), VALUES, ids=[v[0] for v in VALUES])
def test_skip_steps_over_exactly_one_value(name: str, buf: bytes, expected: Any) -> None:
    padded = b'\x45' + buf + b'\x40\x40'
    assert codec.skip(padded, 1) == 1 + len(buf)
    assert codec.decode(padded, 1)[1] == 1 + len(buf)


def test_symbols_decode_as_symbols_and_strings_as_plain_str() -> None:
    assert type(codec.decode(encode_value(MA('s')), 0)[0]) is codec.Symbol
    assert type(codec.decode(encode_value(MA('s' * 300)), 0)[0]) is codec.Symbol
    assert type(codec.decode(encode_value('s'), 0)[0]) is str
    assert type(codec.decode(encode_value('s' * 300), 0)[0]) is str


@pytest.mark.parametrize(
    'buf',
    [
        pytest.param(ARRAY8, id='array8'),
        pytest.param(
            encode_value(proton.Array(proton.UNDESCRIBED, proton.Data.INT, 1, 2)), id='array32'
        ),
        pytest.param(encode_value(proton.decimal32(1)), id='decimal32'),
        pytest.param(encode_value(proton.decimal128(b'0' * 16)), id='decimal128'),
    ],
)
def test_arrays_and_decimals_are_skipped_and_returned_raw(buf: bytes) -> None:
    proton_value(buf)  # a well-formed value
    assert codec.skip(buf + b'\x40', 0) == len(buf)
    assert codec.decode(buf + b'\x40', 0) == (buf, len(buf))


def test_described_values_nest() -> None:
    buf = encode_value(proton.Described(proton.ulong(0x70), [True, proton.ubyte(3)]))
    value, end = codec.decode(buf, 0)
    assert value == codec.Described(0x70, [True, 3])
    assert end == len(buf)


def test_decode_at_an_offset_leaves_earlier_bytes_alone() -> None:
    buf = b'\x41' + encode_value('x' * 300) + b'\x40'
    assert codec.decode(buf, 1) == ('x' * 300, len(buf) - 1)


# -- malformed input --------------------------------------------------------------------------

MALFORMED: list[tuple[str, bytes]] = [
    ('empty', b''),
    ('truncated ubyte', b'\x50'),
    ('truncated uint', b'\x70\x00\x00'),
    ('truncated ulong', b'\x80\x00\x00\x00\x00\x00\x00\x00'),
    ('truncated uuid', b'\x98' + b'\x00' * 15),
    ('truncated str8 size', b'\xa1'),
    ('truncated str8', b'\xa1\x05abc'),
    ('truncated str32 size', b'\xb1\x00\x00'),
    ('truncated str32', b'\xb1\x00\x00\x01\x00abc'),
    ('truncated list8', LIST8[:-1]),
    ('truncated list32', encode_value([1, 2, 3])[:-1]),
    ('truncated map32', encode_value({MA('a'): 1})[:-1]),
    ('truncated array8', ARRAY8[:-1]),
    ('truncated described', b'\x00\x53'),
    ('descriptor only', b'\x00'),
    ('unknown constructor 0xff', b'\xff'),
    ('unknown constructor 0x01', b'\x01'),
    ('unknown constructor 0x30', b'\x30\x00\x00\x00\x00'),
    ('list count too high', b'\xc0\x02\x02\x40'),
    ('list count too low', b'\xc0\x03\x01\x40\x40'),
    ('list32 count too high', b'\xd0\x00\x00\x00\x05\x00\x00\x00\x02\x40'),
    ('odd map8', b'\xc1\x04\x03\x40\x40\x40'),
    ('odd map32', b'\xd1\x00\x00\x00\x07\x00\x00\x00\x03\x40\x40\x40'),
    ('invalid utf-8 str', b'\xa1\x02\xff\xfe'),
    ('invalid utf-8 sym', b'\xa3\x01\x80'),
    ('item past list end', b'\xc0\x02\x01\xa1\x03abc'),
    ('char past unicode', b'\x73\x00\x11\x00\x00'),
    ('char surrogate', b'\x73\x00\x00\xdb\xf8'),
]


@pytest.mark.parametrize(('name', 'buf'), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_values_raise_decode_error(name: str, buf: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode(buf, 0)


def test_a_map_with_an_unhashable_key_is_a_decode_error() -> None:
    with pytest.raises(codec.DecodeError, match='unhashable'):
        codec.decode(b'\xc1\x03\x02\x45\x40', 0)


@pytest.mark.parametrize('constructor', [0xFF, 0xF1, 0xE1, 0xD2, 0xC2, 0xB2, 0xA2, 0x99, 0x57])
def test_unknown_constructors_with_a_plausible_size_raise_decode_error(constructor: int) -> None:
    buf = bytes([constructor]) + b'\x00' * 20
    with pytest.raises(codec.DecodeError):
        codec.decode(buf, 0)


@pytest.mark.parametrize('buf', [b'\xc0\x00', b'\xc1\x00'], ids=['list8', 'map8'])
def test_a_compound_with_size_zero_raises_decode_error(buf: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode(buf, 0)


def test_a_section_described_by_a_surrogate_char_is_a_decode_error() -> None:
    with pytest.raises(codec.DecodeError, match='surrogate'):  # fuzz/: UnicodeEncodeError escaped
        codec.parse(b'\x00\x73\x00\x00\xdb\xf8\x00\x00')


def test_deeply_nested_descriptors_raise_decode_error() -> None:
    with pytest.raises(codec.DecodeError):
        codec.parse(b'\x00' * 5000)


def test_truncating_a_message_inside_a_parsed_section_raises_decode_error() -> None:
    buf = encode_message(
        durable=True,
        priority=7,
        instructions={MA('x-opt-hop'): 'one'},
        annotations={JMS_DEST: proton.byte(0)},
        address='orders',
        creation_time=1600000000.0,
    )
    parsed = sections(buf)[:4]  # header, delivery annotations, annotations, properties
    assert [code for code, _, _ in parsed] == [0x70, 0x71, 0x72, 0x73]
    cuts = [cut for _, start, end in parsed for cut in range(start + 1, end)]
    assert len(cuts) > 50
    for cut in cuts:
        with pytest.raises(codec.DecodeError):
            codec.parse(buf[:cut])


@pytest.mark.parametrize(
    'buf',
    [
        pytest.param(b'\x41', id='not described'),
        pytest.param(b'\x00\x53\x69\x45', id='descriptor below header'),
        pytest.param(b'\x00\x53\x79\x45', id='descriptor above footer'),
        pytest.param(b'\x00\xa3\x0bamqp:nope:x\x45', id='unknown symbolic descriptor'),
        pytest.param(b'\x00\x53\x70\xa1\x01x', id='header not a list'),
        pytest.param(b'\x00\x53\x72\xc1\x04\x03\x40\x40\x40', id='odd annotations map'),
        pytest.param(b'\x00\x53\x72\xff', id='annotations truncated'),
    ],
)
def test_malformed_messages_raise_decode_error(buf: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.parse(buf)


def test_with_annotations_rejects_a_rest_that_is_not_a_section() -> None:
    with pytest.raises(codec.DecodeError):
        recode.with_annotations(b'\x41', {'k': 'v'})


def test_delivery_header_rejects_bytes_that_are_not_a_header() -> None:
    with pytest.raises(codec.DecodeError):
        recode.delivery_header(b'\x00\x53\x70\xa1\x01x', 1)
