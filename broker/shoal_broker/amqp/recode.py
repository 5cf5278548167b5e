"""
Re-encoding the two parts of a stored message the broker may change: the header and the
message annotations.

The bare message is immutable (AMQP 1.0 §3.2): a redelivery sends the stored header with its
delivery-count raised (``delivery_header``), and a message moved to a dead-letter or expiry queue
gets annotations saying where it came from and why (``with_annotations``). Everything else goes
out as it was received. Reading is ``codec.py``'s.
"""

import dataclasses
from typing import Any

from shoal_broker.amqp.codec import (
    MESSAGE_ANNOTATIONS,
    DecodeError,
    Header,
    decode,
    header_from_fields,
    section_code,
    skip,
)


def encode_header(header: Header) -> bytes:
    """Encode a header section, leaving trailing default fields out as AMQP allows."""
    fields = [
        b'\x41' if header.durable else b'\x42',
        b'\x50' + bytes([header.priority]),
        b'\x40' if header.ttl is None else b'\x70' + header.ttl.to_bytes(4, 'big'),
        b'\x41' if header.first_acquirer else b'\x42',
        b'\x70' + header.delivery_count.to_bytes(4, 'big'),
    ]
    defaults = [b'\x42', b'\x50\x04', b'\x40', b'\x42', b'\x70\x00\x00\x00\x00']
    while fields and fields[-1] == defaults[len(fields) - 1]:
        fields.pop()
    body = b''.join(fields)
    return b'\x00\x53\x70' + _list(body, len(fields))


def delivery_header(header_bytes: bytes, failed_attempts: int) -> bytes:
    """
    The header to send: the stored bytes unchanged on a first delivery, else with
    delivery-count raised by the broker's count of failed attempts.
    """
    if failed_attempts == 0:
        return header_bytes
    header = Header()
    if header_bytes:
        _, vpos = section_code(header_bytes, 0)
        header = header_from_fields(decode(header_bytes, vpos)[0])
    count = header.delivery_count + failed_attempts
    return encode_header(dataclasses.replace(header, delivery_count=count, first_acquirer=False))


def _list(body: bytes, count: int) -> bytes:
    if count == 0:
        return b'\x45'
    if len(body) + 1 < 256 and count < 256:
        return b'\xc0' + bytes([len(body) + 1, count]) + body
    return b'\xd0' + (len(body) + 4).to_bytes(4, 'big') + count.to_bytes(4, 'big') + body


def encode_symbol(text: str) -> bytes:
    raw = text.encode()
    if len(raw) < 256:
        return b'\xa3' + bytes([len(raw)]) + raw
    return b'\xb3' + len(raw).to_bytes(4, 'big') + raw


def encode_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) < 256:
        return b'\xa1' + bytes([len(raw)]) + raw
    return b'\xb1' + len(raw).to_bytes(4, 'big') + raw


def with_annotations(rest: bytes, extra: dict[str, str]) -> bytes:
    """
    Set symbol-keyed string annotations in the message-annotations section of ``rest``.

    Other entries are copied as encoded bytes, so their AMQP types are unchanged; an entry with
    one of the keys being set is replaced (a map may not repeat a key). The bare message after the
    section is untouched. Used when dead-lettering or expiring a message.
    """
    return _with_pairs(rest, {k: encode_string(v) for k, v in extra.items()})


def with_flag(rest: bytes, key: str) -> bytes:
    """``with_annotations`` for one symbol-keyed annotation set to boolean true
    (``JMSXGroupFirstForConsumer``: an AMQP client reads it among the message annotations)."""
    return _with_pairs(rest, {key: b'\x41'})


def _with_pairs(rest: bytes, values: dict[str, bytes]) -> bytes:
    """The message-annotations section of ``rest`` with ``values`` (key -> encoded value) set,
    the other entries copied as encoded bytes; the bare message after it untouched."""
    pairs: list[bytes] = []
    pos = 0
    if rest:
        code, vpos = section_code(rest, 0)
        if code == MESSAGE_ANNOTATIONS:
            end = skip(rest, vpos)
            pairs = [raw for raw in _map_pairs(rest, vpos, end) if _key_of(raw) not in values]
            pos = end
    pairs += [encode_symbol(key) + value for key, value in values.items()]
    body = b''.join(pairs)
    count = 2 * len(pairs)
    encoded = b'\xd1' + (len(body) + 4).to_bytes(4, 'big') + count.to_bytes(4, 'big') + body
    return b'\x00\x53\x72' + encoded + rest[pos:]


def _map_pairs(buf: bytes, pos: int, end: int) -> list[bytes]:
    """The encoded key+value byte strings of the map at ``pos``."""
    code = buf[pos]
    if code not in (0xC1, 0xD1):
        raise DecodeError('message-annotations section is not a map')
    p = pos + (3 if code == 0xC1 else 9)
    pairs = []
    while p < end:
        value_at = skip(buf, p)
        after = skip(buf, value_at)
        pairs.append(bytes(buf[p:after]))
        p = after
    return pairs


def _key_of(pair: bytes) -> Any:
    return decode(pair, 0)[0]
