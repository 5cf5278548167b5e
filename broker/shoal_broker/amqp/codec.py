"""
Just enough of the AMQP 1.0 type system to route a message without re-encoding it.

The bare message is immutable (AMQP 1.0 §3.2): the broker stores the bytes it received and
delivers them unchanged. Routing needs a few fields from the header, the message annotations and
the properties, so this module walks the encoded sections, decodes those three small sections and
skips everything else by its encoded width. Decoding a whole message through proton's ``Message``
would cost tens of microseconds and re-encoding it would lose fidelity.

Re-encoding the header and annotations the broker may change is ``recode.py``'s.

Written by hand, not through proton's ``Data``: this runs once per message on the hot path, and
the walk is the part of AMQP's type system that never changes (Part 1 §1.6).
"""

import dataclasses
import struct
import types
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

# Section descriptors (AMQP 1.0 Part 3 §3.2).
HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74
DATA: Final = 0x75
AMQP_SEQUENCE: Final = 0x76
AMQP_VALUE: Final = 0x77
FOOTER: Final = 0x78

_SECTION_SYMBOLS: Final = {
    b'amqp:header:list': HEADER,
    b'amqp:delivery-annotations:map': DELIVERY_ANNOTATIONS,
    b'amqp:message-annotations:map': MESSAGE_ANNOTATIONS,
    b'amqp:properties:list': PROPERTIES,
    b'amqp:application-properties:map': APPLICATION_PROPERTIES,
    b'amqp:data:binary': DATA,
    b'amqp:amqp-sequence:list': AMQP_SEQUENCE,
    b'amqp:amqp-value:*': AMQP_VALUE,
    b'amqp:footer:map': FOOTER,
}

DEFAULT_PRIORITY: Final = 4


class DecodeError(ValueError):
    """The bytes are not a well-formed AMQP message."""


class Symbol(str):
    """An AMQP symbol, kept apart from strings so annotation keys stay symbols."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Described:
    descriptor: Any
    value: Any


# Encoded width by constructor family (high nibble): fixed widths, or the size prefix width.
_FIXED_WIDTH: Final = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_VALID_CONSTRUCTORS: Final = frozenset(
    [0x00, *range(0x40, 0x46), *range(0x50, 0x57), 0x60, 0x61, *range(0x70, 0x75),
     *range(0x80, 0x85), 0x94, 0x98, 0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3, 0xC0, 0xC1, 0xD0, 0xD1,
     0xE0, 0xF0]
)  # fmt: skip
MAX_DEPTH: Final = 64
"""Nesting of described and compound values we follow before calling the input hostile."""

_INVALID: Final = 0
_DESCRIBED: Final = -1
_SIZE1: Final = -2
_SIZE4: Final = -5


def _layout(code: int) -> int:
    if code not in _VALID_CONSTRUCTORS:
        return _INVALID
    if code == 0x00:
        return _DESCRIBED
    fixed = _FIXED_WIDTH.get(code >> 4)
    if fixed is not None:
        return 1 + fixed
    return _SIZE1 if code >> 4 in (0xA, 0xC, 0xE) else _SIZE4


_LAYOUT: Final = tuple(_layout(code) for code in range(256))
"""Per constructor byte: the value's whole width when fixed (> 0), else how its width is found.
One lookup instead of a set, a dict and comparisons: a JMS message's parse skips ~7 values."""


def skip(buf: bytes | bytearray, pos: int, depth: int = 0) -> int:
    """Return the position just after the encoded value starting at ``pos``."""
    if depth > MAX_DEPTH:
        raise DecodeError(f'values nested deeper than {MAX_DEPTH} levels')
    size = len(buf)
    if pos >= size:
        raise DecodeError(f'truncated value at {pos}')
    layout = _LAYOUT[buf[pos]]
    if layout > 0:
        end = pos + layout
    elif layout == _SIZE1:
        if pos + 1 >= size:
            raise DecodeError(f'truncated value at {pos}')
        end = pos + 2 + buf[pos + 1]
    elif layout == _SIZE4:
        if pos + 5 > size:
            raise DecodeError(f'truncated value at {pos}')
        end = pos + 5 + int.from_bytes(buf[pos + 1 : pos + 5], 'big')
    elif layout == _DESCRIBED:
        return skip(buf, skip(buf, pos + 1, depth + 1), depth + 1)
    else:
        raise DecodeError(f'unknown AMQP type constructor 0x{buf[pos]:02x} at {pos}')
    if end > size:
        raise DecodeError(f'value at {pos} runs past the end of the message')
    return end


def decode(buf: bytes | bytearray, pos: int, depth: int = 0) -> tuple[Any, int]:  # noqa: C901 - one branch per type family
    """Decode the value at ``pos``; return it and the position after it."""
    end = skip(buf, pos, depth)
    code = buf[pos]
    if code == 0x00:
        descriptor, vpos = decode(buf, pos + 1, depth + 1)
        value, _ = decode(buf, vpos, depth + 1)
        return Described(descriptor, value), end
    if code == 0x40:
        return None, end
    if code in (0x41, 0x42):
        return code == 0x41, end
    if code in (0x43, 0x44):
        return 0, end
    if code == 0x45:
        return [], end
    if code == 0x56:
        return buf[pos + 1] != 0, end
    if code in (0x50, 0x52, 0x53, 0x60, 0x70, 0x80):
        return int.from_bytes(buf[pos + 1 : end], 'big'), end
    if code in (0x51, 0x54, 0x55, 0x61, 0x71, 0x81, 0x83):  # timestamps are signed ms
        return int.from_bytes(buf[pos + 1 : end], 'big', signed=True), end
    if code == 0x72:
        return struct.unpack_from('>f', buf, pos + 1)[0], end
    if code == 0x82:
        return struct.unpack_from('>d', buf, pos + 1)[0], end
    if code == 0x73:
        point = int.from_bytes(buf[pos + 1 : end], 'big')
        # both found by fuzz/: chr() refuses what is past Unicode, and a surrogate made a str
        # that failed later when encoded (a section descriptor)
        if point > 0x10FFFF:
            raise DecodeError(f'char value 0x{point:x} at {pos} is not a Unicode code point')
        if 0xD800 <= point <= 0xDFFF:
            raise DecodeError(f'char value 0x{point:x} at {pos} is a surrogate, not a character')
        return chr(point), end
    if code == 0x98:
        return uuid.UUID(bytes=bytes(buf[pos + 1 : end])), end
    if code in (0xA0, 0xA1, 0xA3):
        return _variable(code, bytes(buf[pos + 2 : end])), end
    if code in (0xB0, 0xB1, 0xB3):
        return _variable(code, bytes(buf[pos + 5 : end])), end
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        return _compound(buf, pos, code, end, depth), end
    # arrays, decimals: not needed for routing; returned raw so callers can still compare them
    return bytes(buf[pos:end]), end


def _variable(code: int, raw: bytes) -> Any:
    kind = code & 0x0F
    if kind == 0x0:
        return raw
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError as exc:
        raise DecodeError('invalid UTF-8 in string or symbol') from exc
    return Symbol(text) if kind == 0x3 else text


def _compound(buf: bytes | bytearray, pos: int, code: int, end: int, depth: int) -> Any:
    wide = code >= 0xD0
    p = pos + (9 if wide else 3)
    if p > end:
        raise DecodeError(f'compound value at {pos} is too short to hold its count')
    count = int.from_bytes(buf[pos + 5 : pos + 9], 'big') if wide else buf[pos + 2]
    items = []
    for _ in range(count):
        if p >= end:
            raise DecodeError(f'compound value at {pos} has a wrong size or count')
        item, p = decode(buf, p, depth + 1)
        items.append(item)
    if p != end:
        raise DecodeError(f'compound value at {pos} has a wrong size or count')
    if code in (0xC0, 0xD0):
        return items
    if count % 2:
        raise DecodeError(f'map at {pos} has an odd number of elements')
    try:
        return dict(zip(items[::2], items[1::2], strict=True))
    except TypeError as exc:  # unhashable key
        raise DecodeError(f'map at {pos} has an unhashable key') from exc


def section_code(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    """Return the section descriptor code at ``pos`` and the position of its value."""
    # fast path: every client we know encodes section descriptors as small ulongs (0x53 code)
    if buf[pos] == 0x00 and pos + 2 < len(buf) and buf[pos + 1] == 0x53:
        code = buf[pos + 2]
        if HEADER <= code <= FOOTER:
            return code, pos + 3
    if buf[pos] != 0x00:
        raise DecodeError(f'expected a described section at {pos}')
    descriptor, vpos = decode(buf, pos + 1)
    if isinstance(descriptor, bytes | str):
        named = _SECTION_SYMBOLS.get(
            descriptor.encode() if isinstance(descriptor, str) else descriptor
        )
        if named is None:
            raise DecodeError(f'unknown section descriptor {descriptor!r}')
        return named, vpos
    if not isinstance(descriptor, int) or not HEADER <= descriptor <= FOOTER:
        raise DecodeError(f'unknown section descriptor {descriptor!r}')
    return descriptor, vpos


@dataclasses.dataclass(frozen=True, slots=True)  # frozen: shared through _HEADERS
class Header:
    durable: bool = False
    priority: int = DEFAULT_PRIORITY
    ttl: int | None = None
    first_acquirer: bool = False
    delivery_count: int = 0


DEFAULT_HEADER: Final = Header()
"""What a message without a header section means: not durable, priority 4, count 0."""

_HEADERS: dict[bytes, Header] = {}
"""Decoded header sections by their bytes: a producer sends the same few header encodings, and
decoding one cost ~4 µs per message (docs/performance.md#codec-caches)."""
MAX_CACHED_HEADERS: Final = 1024

_ANNOTATIONS: dict[bytes, Mapping[Any, Any]] = {}
"""Decoded message-annotations sections by their bytes: Qpid JMS writes the same two byte
annotations (x-opt-jms-msg-type, x-opt-jms-dest) on every message of a producer, and decoding
them was ~13 µs of the ~23 µs a JMS TextMessage took to parse. Shared: read, never changed."""
MAX_CACHED_ANNOTATIONS: Final = 1024
MAX_CACHED_SECTION_BYTES: Final = 512
"""Larger header or annotations sections are decoded every time: the caches hold at most
1024 times 512 bytes of keys, whatever peers send."""
_NO_ANNOTATIONS: Final[Mapping[Any, Any]] = types.MappingProxyType({})


@dataclasses.dataclass(slots=True)  # not frozen: built once per message
class RoutingView:
    """What the broker reads from a message; ``header`` and ``rest`` are the stored bytes."""

    header: Header
    header_bytes: bytes
    rest: bytes
    """Message annotations, bare message and footer, byte for byte as received; delivery
    annotations (one hop only, AMQP §3.2.2) are dropped."""
    annotations: Mapping[Any, Any]
    """Shared between messages with the same annotations section: never changed."""
    to: str | None = None
    absolute_expiry_time: int | None = None
    group: str | None = None
    """properties.group-id (JMSXGroupID): the message group it belongs to (docs/architecture.md,
    "Message groups")."""


def parse(buf: bytes | bytearray) -> RoutingView:
    """
    Split a received message into stored parts and decode what routing needs.

    Every section is walked (cheaply: values are skipped by their encoded width, not decoded),
    so a truncated or malformed message is refused here rather than delivered to a consumer.
    """
    pos, n = 0, len(buf)
    header, header_bytes = DEFAULT_HEADER, b''
    annotations: Mapping[Any, Any] = _NO_ANNOTATIONS
    to: Any = None
    expiry: Any = None
    group: Any = None
    rest_start: int | None = None
    try:
        while pos < n:
            if buf[pos] == 0x00 and buf[pos + 1] == 0x53 and HEADER <= buf[pos + 2] <= FOOTER:
                code, vpos = buf[pos + 2], pos + 3  # section_code's fast path, inlined
            else:
                code, vpos = section_code(buf, pos)
            end = skip(buf, vpos)
            if code == HEADER:
                header_bytes = bytes(buf[pos:end])
                header = _HEADERS.get(header_bytes) or _new_header(header_bytes, vpos - pos)
            elif code != DELIVERY_ANNOTATIONS:
                if rest_start is None:
                    rest_start = pos
                if code == MESSAGE_ANNOTATIONS:
                    annotations = _annotations(bytes(buf[vpos:end]))
                elif code == PROPERTIES:
                    to, expiry, group = _list_items(buf, vpos, end, (2, 8, 10))
            pos = end
    except IndexError as exc:
        raise DecodeError('truncated section') from exc
    return RoutingView(  # positional: keyword construction costs ~2 µs per message
        header,
        header_bytes,
        bytes(buf[rest_start:]) if rest_start is not None else b'',  # rest
        annotations,
        to if isinstance(to, str) else None,  # to
        expiry if isinstance(expiry, int) else None,  # absolute_expiry_time
        _group_id(group),
    )


def view(buf: Any, at: Sequence[int]) -> RoutingView:
    """
    ``parse``'s result for a message whose sections amqp/_wire.c has walked already.

    ``at`` holds that walk's offsets (header start, end and value; where the rest starts; the
    annotations' value and end; ``to``'s start and end; absolute-expiry-time's start and end;
    group-id's start and end; -1 for what is absent). ``buf`` is anything whose slices are
    ``bytes``: the engine's receive buffer. Only what routing reads is copied out.
    tests/unit/test_codec.py holds the two equal.
    """
    hs, he, hv, rs, av, ae, ts, te, xs, xe, gs, ge = at
    try:
        header, header_bytes = DEFAULT_HEADER, b''
        if hs >= 0:
            header_bytes = buf[hs:he]
            header = _HEADERS.get(header_bytes) or _new_header(header_bytes, hv - hs)
        to = decode(buf[ts:te], 0)[0] if ts >= 0 else None
        expiry = decode(buf[xs:xe], 0)[0] if xs >= 0 else None
        group = _group_id(decode(buf[gs:ge], 0)[0]) if gs >= 0 else None
        annotations = _annotations(buf[av:ae]) if av >= 0 else _NO_ANNOTATIONS
    except DecodeError:  # said again by the reference, with positions in the whole message
        return parse(buf[:])
    return RoutingView(
        header,
        header_bytes,
        buf[rs:] if rs >= 0 else b'',  # rest
        annotations,
        to if isinstance(to, str) else None,  # to
        expiry if isinstance(expiry, int) else None,  # absolute_expiry_time
        group,
    )


def _group_id(value: Any) -> str | None:
    """A group-id that names a group: a non-empty string."""
    return value if isinstance(value, str) and value else None


def _new_header(section: bytes, value_at: int) -> Header:
    """Decode a header section seen for the first time, and remember it if there is room."""
    header = header_from_fields(decode(section, value_at)[0])
    if len(_HEADERS) < MAX_CACHED_HEADERS and len(section) <= MAX_CACHED_SECTION_BYTES:
        _HEADERS[section] = header
    return header


def _annotations(section: bytes) -> Mapping[Any, Any]:
    """A message-annotations map (the section's value, encoded), decoded once per encoding."""
    known = _ANNOTATIONS.get(section)
    if known is None:
        value = decode(section, 0)[0]
        known = types.MappingProxyType(value) if isinstance(value, dict) else _NO_ANNOTATIONS
        if len(section) <= MAX_CACHED_SECTION_BYTES:
            if len(_ANNOTATIONS) >= MAX_CACHED_ANNOTATIONS:
                _ANNOTATIONS.clear()  # e.g. x-opt-delivery-time, new on every message
            _ANNOTATIONS[section] = known
    return known


def _list_items(buf: bytes | bytearray, pos: int, end: int, wanted: tuple[int, ...]) -> list[Any]:
    """Decode only the ``wanted`` positions of the list at ``pos``; skip the others."""
    found: list[Any] = [None] * len(wanted)
    code = buf[pos]
    if code == 0x45:
        return found
    if code not in (0xC0, 0xD0):
        raise DecodeError('properties section is not a list')
    wide = code == 0xD0
    p = pos + (9 if wide else 3)
    count = int.from_bytes(buf[pos + 5 : pos + 9], 'big') if wide else buf[pos + 2]
    last = max(wanted)
    for index in range(min(count, last + 1)):
        if p >= end:
            raise DecodeError('properties list has a wrong size or count')
        if buf[p] == 0x40:  # null, most of the fields: found already says None
            p += 1
        elif index in wanted:
            found[wanted.index(index)], p = decode(buf, p)
        else:
            p = skip(buf, p)
    return found


def header_from_fields(fields: Any) -> Header:
    """The header section's decoded list as a ``Header``, absent fields at their defaults."""
    if not isinstance(fields, list):
        raise DecodeError('header section is not a list')
    f = [*fields, None, None, None, None, None][:5]
    return Header(
        durable=bool(f[0]),
        priority=f[1] if isinstance(f[1], int) else DEFAULT_PRIORITY,
        ttl=f[2] if isinstance(f[2], int) else None,
        first_acquirer=bool(f[3]),
        delivery_count=f[4] if isinstance(f[4], int) else 0,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SelectionView:
    """The sections a JMS selector reads, decoded."""

    header: dict[str, Any]
    properties: list[Any]
    application_properties: dict[Any, Any]
    annotations: dict[Any, Any]


def selection_view(header_bytes: bytes, rest: bytes) -> SelectionView:
    """Decode header, annotations, properties and application properties of a stored message.

    Only done for consumers with a selector; the body is never decoded.
    """
    header = Header()
    if header_bytes:
        _, vpos = section_code(header_bytes, 0)
        header = header_from_fields(decode(header_bytes, vpos)[0])
    sections: dict[int, Any] = {}
    pos = 0
    while pos < len(rest):
        code, vpos = section_code(rest, pos)
        if code > APPLICATION_PROPERTIES:
            break
        sections[code] = decode(rest, vpos)[0]
        pos = skip(rest, vpos)
    annotations = sections.get(MESSAGE_ANNOTATIONS)
    properties = sections.get(PROPERTIES)
    application = sections.get(APPLICATION_PROPERTIES)
    return SelectionView(
        header={
            'durable': header.durable,
            'priority': header.priority,
            'delivery_count': header.delivery_count,
        },
        properties=properties if isinstance(properties, list) else [],
        application_properties=application if isinstance(application, dict) else {},
        annotations=annotations if isinstance(annotations, dict) else {},
    )


def body_value(buf: bytes | bytearray) -> Any:
    """The decoded amqp-value body of a message (transaction coordinator requests), or None."""
    pos = 0
    while pos < len(buf):
        code, vpos = section_code(buf, pos)
        if code == AMQP_VALUE:
            return decode(buf, vpos)[0]
        pos = skip(buf, vpos)
    return None
