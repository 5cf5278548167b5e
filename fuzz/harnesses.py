"""
What each fuzz target feeds its input to, and what counts as a failure.

Every decoder that reads peer bytes is here: the SASL layer (header, frames, each mechanism's
exchange), the message-section walk (routing view, selector view, coordinator body), JMS
selector text, proton's own AMQP frame decoder as the broker configures it, and the store
lane's reading of what answers on Redis's port (``store/reply_reader.py`` and its C). A target fails
on any exception its decoder does not document (the harness lets those propagate) and on a hang
(libFuzzer's ``-timeout``); proton failing is a crash of the process.
"""

import tempfile
from collections.abc import Callable
from pathlib import Path

import hiredis
import redis.exceptions
from framesample import client_frames

from shoal_broker import selector as selectors
from shoal_broker.amqp import codec, engine, sasl
from shoal_broker.amqp.engine import ffi, lib
from shoal_broker.routing.storage import NORMAL_BAND
from shoal_broker.security.authenticator import Authenticator, AuthPolicy, UsersSource
from shoal_broker.security.credentials import make_user, write_user
from shoal_broker.security.permissions import Permissions
from shoal_broker.selector.parser import SelectorError
from shoal_broker.store import _replies
from shoal_broker.store.lane import NOT_ENOUGH_DATA
from shoal_broker.store.replies import new_entries
from shoal_broker.store.reply_reader import ReplyReader

FUZZ_PASSWORD = 'fuzz-secret'


def _authenticator() -> Authenticator:
    """A users file with cheap keys (one PBKDF2 iteration): fuzz the decoding, not the hashing."""
    path = str(Path(tempfile.mkdtemp(prefix='shoal-fuzz-')) / 'users.json')
    write_user(path, make_user('fuzz', FUZZ_PASSWORD, Permissions.none(), iterations=1))
    return Authenticator(AuthPolicy(allow_anonymous=True, users=UsersSource(path)))


_AUTHENTICATOR: Authenticator | None = None


def sasl_layer(data: bytes) -> None:
    """Any bytes, in two chunks split where the first byte says: ``receive`` never raises, and
    ends either still waiting, done with an identity, or failed with a reason."""
    global _AUTHENTICATOR
    if _AUTHENTICATOR is None:
        _AUTHENTICATOR = _authenticator()
    handshake = sasl.SaslHandshake(_AUTHENTICATOR, 'fuzz' if data[:1] == b'E' else None)
    split = data[0] % (len(data) + 1) if data else 0
    for chunk in (data[:split], data[split:]):
        step = handshake.receive(chunk)
        assert isinstance(step.output, bytes)
        if handshake.finished:
            break
    if handshake.state is sasl.State.DONE:
        assert handshake.identity is not None
    if handshake.state is sasl.State.FAILED:
        assert handshake.failure


def message_sections(data: bytes) -> None:
    """A transfer's payload: the routing walk, then (if it parses) what selectors and the
    transaction coordinator decode from it. Only ``DecodeError`` is allowed out. Where the
    broker's C walk (amqp/_wire.c) takes the payload, its view must be the reference's."""
    offsets = engine.scan(data)
    try:
        view = codec.parse(data)
    except codec.DecodeError:
        if offsets is not None:
            try:
                codec.view(data, offsets)
            except codec.DecodeError:
                return
            raise AssertionError('the C walk accepted a message codec.parse refuses') from None
        return
    if offsets is not None:
        assert codec.view(data, offsets) == view, 'the C walk and codec.parse disagree'
    try:
        codec.selection_view(view.header_bytes, view.rest)
        codec.body_value(view.rest)
    except codec.DecodeError:
        return


def selector_text(data: bytes) -> None:
    """A consumer's selector: refused with ``SelectorError`` or compiled; a compiled selector
    never raises on any identifiers."""
    text = data.decode('utf-8', 'replace')
    try:
        compiled = selectors.compile(text)
    except SelectorError:
        return
    for identifiers in _IDENTIFIER_SETS:
        compiled.matches(identifiers)


_IDENTIFIER_SETS: list[dict[str, object]] = [
    {},
    {'a': 1, 'b': 2.5, 'c': 'x', 'd': True, 'JMSPriority': 4, 'JMSType': 't'},
    {'a': 'x', 'b': None, 'c': 10**20, 'd': -1, 'JMSMessageID': 'ID:1'},
]


_FRAME_BASES: list[bytes] = []


def mutated_frames(data: bytes) -> bytes:
    """proton's decoder is not instrumented, so coverage cannot guide mutations: mutate valid
    frame streams by the input's own recipe instead. Byte 0 picks a base stream and flags
    (append the raw input, truncate); then each triple overwrites one byte (position, value)."""
    if not _FRAME_BASES:
        _FRAME_BASES.extend(client_frames())
    if not data:
        return b''
    buf = bytearray(_FRAME_BASES[data[0] % len(_FRAME_BASES)])
    recipe = data[1:]
    for i in range(0, len(recipe) - 2, 3):
        position = int.from_bytes(recipe[i : i + 2], 'big') % (len(buf) + 1)
        if position == len(buf):
            buf.append(recipe[i + 2])
        else:
            buf[position] = recipe[i + 2]
    if data[0] & 0x40:
        del buf[len(buf) * data[-1] // 256 :]
    if data[0] & 0x80:
        buf += recipe
    return bytes(buf)


def amqp_frames(data: bytes) -> None:
    """proton's frame decoder as the broker drives it: a server transport with no SASL layer,
    fed the AMQP header and a mutated frame stream; every event drained, all output taken."""
    transport = lib.pn_transport()
    lib.pn_transport_set_server(transport)
    lib.pn_transport_set_max_frame(transport, 1024 * 1024)
    connection = lib.pn_connection()
    collector = lib.pn_collector()
    lib.pn_connection_collect(connection, collector)
    lib.pn_transport_bind(transport, connection)
    try:
        payload = b'AMQP\x00\x01\x00\x00' + mutated_frames(data)
        offset = 0
        while offset < len(payload):
            capacity = lib.pn_transport_capacity(transport)
            if capacity <= 0:
                break
            chunk = payload[offset : offset + capacity]
            lib.pn_transport_push(transport, ffi.from_buffer(chunk), len(chunk))
            offset += len(chunk)
            while lib.pn_collector_peek(collector) != ffi.NULL:
                lib.pn_collector_pop(collector)
            pending = lib.pn_transport_pending(transport)
            if pending > 0:
                lib.pn_transport_pop(transport, pending)
    finally:
        lib.pn_transport_unbind(transport)
        lib.pn_connection_release(connection)
        lib.pn_decref(connection)
        lib.pn_decref(transport)
        lib.pn_collector_free(collector)


REPLY_ERRORS = (redis.exceptions.InvalidResponse, TypeError, ValueError)
"""What reading a stream that is not Redis's replies may raise (the lane then gives the
connection up): the scanner's and hiredis's protocol errors, and hiredis's TypeError and
ValueError for a map with an unhashable key or a number it cannot read."""


def _hiredis() -> hiredis.Reader:
    return hiredis.Reader(protocolError=redis.exceptions.InvalidResponse,
                          replyError=redis.exceptions.ResponseError,
                          notEnoughData=NOT_ENOUGH_DATA)  # fmt: skip


def redis_replies(data: bytes) -> None:
    """What the store lane reads: byte 0's bits say which of the replies answer a plain read of
    new entries, and where the rest is split into two reads. The reader hands on replies or
    raises one of ``REPLY_ERRORS``; the entries the C makes of a whole reply are those
    ``new_entries`` makes of hiredis's reading of it."""
    if not data:
        return
    stream = data[1:]
    found = _replies.entries(stream, 0, len(stream), NORMAL_BAND)
    if type(found) is tuple:
        parser = _hiredis()
        parser.feed(stream, 0, found[1])
        assert new_entries(parser.gets()) == found[0], 'the C and hiredis read entries apart'
    reader, parser, replies = ReplyReader(), _hiredis(), []
    reader.written(64, [i for i in range(64) if data[0] >> (i % 8) & 1])
    split = data[0] % (len(stream) + 1)
    try:
        for piece in (stream[:split], stream[split:]):
            pos = 0
            while pos < len(piece):
                pos = reader.read(parser, piece, pos, len(piece), replies)
    except REPLY_ERRORS:
        return


HARNESSES: dict[str, Callable[[bytes], None]] = {
    'sasl': sasl_layer,
    'sections': message_sections,
    'selector': selector_text,
    'frames': amqp_frames,
    'replies': redis_replies,
}
