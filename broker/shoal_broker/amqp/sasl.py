"""
The SASL layer (AMQP 1.0 Part 5 §5.3), run on the connection's first bytes before proton sees any.

proton-c as built from PyPI can only be an ANONYMOUS/EXTERNAL SASL server and has no hook for a
Python password check (reference/limits.md §3), so the broker speaks SASL itself: it reads the
SASL protocol header and frames, answers through ``security.authenticator``, and once the outcome
is ``ok`` hands every later byte (starting with the AMQP header) to a proton transport that has
no SASL layer. Frames are decoded with ``codec.decode`` (the walk the fuzz harness covers).

A peer that skips SASL (AMQP header first) is let in only as ANONYMOUS, and only when that is
enabled; otherwise it gets the SASL header (what this server speaks) and the socket is closed.

A connection from an address the failed-login throttle holds (``throttled``) is answered as any
other up to its sasl-init, then with the outcome ``sys-temp``: the client learns "try later", not
a network fault, and the broker checks no credential for it.
"""

import dataclasses
import enum
import logging
from typing import Final

from shoal_broker.amqp import codec
from shoal_broker.security.authenticator import (
    ANONYMOUS,
    AuthenticationFailed,
    Authenticator,
    CredentialsRefused,
    Exchange,
    Identity,
)

logger = logging.getLogger(__name__)

SASL_HEADER: Final = b'AMQP\x03\x01\x00\x00'
AMQP_HEADER: Final = b'AMQP\x00\x01\x00\x00'
FRAME_TYPE_SASL: Final = 0x01
MAX_SASL_FRAME: Final = 8192
"""Larger than any real SASL frame (the spec lets peers assume 512 bytes); bigger is hostile."""

SASL_MECHANISMS: Final = 0x40
SASL_INIT: Final = 0x41
SASL_CHALLENGE: Final = 0x42
SASL_RESPONSE: Final = 0x43
SASL_OUTCOME: Final = 0x44
_DESCRIPTORS: Final = {
    codec.Symbol('amqp:sasl-init:list'): SASL_INIT,
    codec.Symbol('amqp:sasl-response:list'): SASL_RESPONSE,
}


THROTTLED: Final = 'too many failed logins from this address'


class Code(enum.IntEnum):
    """sasl-outcome codes."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


class SaslProtocolError(ValueError):
    """The peer's bytes are not a SASL exchange."""


class State(enum.Enum):
    HEADER = 'header'
    INIT = 'init'
    RESPONSE = 'response'
    DONE = 'done'
    FAILED = 'failed'


@dataclasses.dataclass(slots=True)
class Step:
    output: bytes = b''
    """To write to the peer now."""
    passthrough: bytes | None = None
    """Once authenticated: the bytes after the SASL exchange, for proton (maybe empty)."""


class SaslHandshake:
    """One connection's SASL conversation, fed the socket's bytes until it is done or failed."""

    def __init__(self, authenticator: Authenticator, certificate_name: str | None) -> None:
        self.authenticator = authenticator
        self.certificate_name = certificate_name
        self.state = State.HEADER
        self.identity: Identity | None = None
        self.failure: str | None = None
        self.credentials_refused = False
        """The failure was a wrong password or unknown user (what login throttling counts)."""
        self.mechanism: str | None = None
        self.failure_code: Code | None = None
        self.throttled = False
        """The source address failed too many logins: its sasl-init is answered ``sys-temp``."""
        self._buffer = bytearray()
        self._exchange: Exchange | None = None

    @property
    def finished(self) -> bool:
        return self.state in (State.DONE, State.FAILED)

    def receive(self, data: bytes) -> Step:
        """Consume bytes; never raises (bad input ends as ``State.FAILED`` with output to send)."""
        self._buffer += data
        step = Step()
        try:
            while not self.finished:
                if not self._advance(step):
                    break
        except SaslProtocolError as exc:
            self._fail(step, Code.SYS_PERM, f'malformed SASL input: {exc}')
        except AuthenticationFailed as exc:
            credentials = isinstance(exc, CredentialsRefused)
            self._fail(step, Code.AUTH, f'authentication failed: {exc}', credentials=credentials)
        return step

    def _fail(self, step: Step, code: Code, why: str, *, credentials: bool = False) -> None:
        if self.state is not State.HEADER:  # before our header the peer cannot read an outcome
            step.output += frame(outcome(code))
        self.state = State.FAILED
        self.failure, self.failure_code = why, code
        self.credentials_refused = credentials

    def _advance(self, step: Step) -> bool:
        """One unit of progress; False when more bytes are needed."""
        if self.state is State.HEADER:
            return self._header(step)
        body = self._next_frame()
        if body is None:
            return False
        descriptor, fields = body
        if self.state is State.INIT:
            if descriptor != SASL_INIT:
                raise SaslProtocolError(f'expected sasl-init, got descriptor {descriptor!r}')
            if self.throttled:  # no credential is read, let alone checked
                self._fail(step, Code.SYS_TEMP, THROTTLED)
                return False
            mechanism = _field(fields, 0)
            if not isinstance(mechanism, str):
                raise SaslProtocolError('sasl-init without a mechanism')
            self.mechanism = str(mechanism)
            self._exchange = self.authenticator.start(str(mechanism), self.certificate_name)
            self._answer(step, _binary(_field(fields, 1)))
        else:
            if descriptor != SASL_RESPONSE:
                raise SaslProtocolError(f'expected sasl-response, got descriptor {descriptor!r}')
            self._answer(step, _binary(_field(fields, 0)))
        return True

    def _header(self, step: Step) -> bool:
        have = bytes(self._buffer[:8])
        if not (SASL_HEADER.startswith(have) or AMQP_HEADER.startswith(have)):
            step.output += SASL_HEADER
            self.state = State.FAILED
            self.failure = f'not an AMQP 1.0 protocol header: {have!r}'
            return False
        if len(have) < 8:
            return False
        if have == AMQP_HEADER:  # no SASL at all: ANONYMOUS, if that is allowed
            refused = THROTTLED if self.throttled else None
            if ANONYMOUS not in self.authenticator.mechanisms(self.certificate_name):
                refused = 'no SASL layer and ANONYMOUS is not enabled'
            if refused is not None:  # no outcome can be sent without SASL: only our header
                step.output += SASL_HEADER
                self.state = State.FAILED
                self.failure = refused
                return False
            exchange = self.authenticator.start(ANONYMOUS, self.certificate_name)
            identity = exchange.respond(b'')
            assert isinstance(identity, tuple)
            self.identity = identity[0]
            self.state = State.DONE
            step.passthrough = bytes(self._buffer)
            self._buffer.clear()
            return False
        del self._buffer[:8]
        step.output += SASL_HEADER + frame(mechanisms(self.authenticator.mechanisms(
            self.certificate_name)))  # fmt: skip
        self.state = State.INIT
        return True

    def _answer(self, step: Step, response: bytes) -> None:
        assert self._exchange is not None
        result = self._exchange.respond(response)
        if isinstance(result, bytes):
            step.output += frame(challenge(result))
            self.state = State.RESPONSE
            return
        self.identity, additional = result
        step.output += frame(outcome(Code.OK, additional))
        self.state = State.DONE
        step.passthrough = bytes(self._buffer)
        self._buffer.clear()

    def _next_frame(self) -> tuple[object, list[object]] | None:
        """The next complete SASL frame's descriptor and fields; None if incomplete."""
        buf = self._buffer
        while True:
            if len(buf) < 8:
                return None
            size = int.from_bytes(buf[:4], 'big')
            doff, kind = buf[4], buf[5]
            if size < 8 or size > MAX_SASL_FRAME:
                raise SaslProtocolError(f'frame size {size}')
            if doff < 2 or doff * 4 > size or kind != FRAME_TYPE_SASL:
                raise SaslProtocolError(f'bad frame header (doff {doff}, type {kind})')
            if len(buf) < size:
                return None
            body = bytes(buf[doff * 4 : size])
            del buf[:size]
            if body:  # an empty frame is a heartbeat
                return decode_body(body)


def decode_body(body: bytes) -> tuple[object, list[object]]:
    """A SASL frame body: one described list, nothing after it."""
    try:
        value, end = codec.decode(body, 0)
    except codec.DecodeError as exc:
        raise SaslProtocolError(str(exc)) from None
    if end != len(body) or not isinstance(value, codec.Described):
        raise SaslProtocolError('frame body is not one described value')
    fields = value.value if value.value is not None else []
    if not isinstance(fields, list):
        raise SaslProtocolError('frame body is not a described list')
    descriptor = value.descriptor
    if isinstance(descriptor, str):  # a symbolic descriptor (anything unhashable stays as is)
        descriptor = _DESCRIPTORS.get(codec.Symbol(descriptor), descriptor)
    return descriptor, fields


def _field(fields: list[object], index: int) -> object:
    return fields[index] if index < len(fields) else None


def _binary(value: object) -> bytes:
    if value is None:
        return b''
    if not isinstance(value, bytes):
        raise SaslProtocolError('a SASL response must be binary')
    return value


# -- encoding the three frames a server sends ------------------------------------------------------


def frame(body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, 'big') + bytes([2, FRAME_TYPE_SASL, 0, 0]) + body


def _described_list(descriptor: int, *fields: bytes) -> bytes:
    items = b''.join(fields)
    return (
        b'\x00\x53'
        + bytes([descriptor])
        + b'\xd0'
        + (len(items) + 4).to_bytes(4, 'big')
        + len(fields).to_bytes(4, 'big')
        + items
    )


def _encode_binary(value: bytes) -> bytes:
    return b'\xb0' + len(value).to_bytes(4, 'big') + value


def mechanisms(names: list[str]) -> bytes:
    elements = b''.join(len(n).to_bytes(1, 'big') + n.encode() for n in names)
    array = (
        b'\xf0'
        + (len(elements) + 5).to_bytes(4, 'big')
        + len(names).to_bytes(4, 'big')
        + b'\xa3'
        + elements
    )
    return _described_list(SASL_MECHANISMS, array)


def challenge(data: bytes) -> bytes:
    return _described_list(SASL_CHALLENGE, _encode_binary(data))


def outcome(code: Code, additional: bytes = b'') -> bytes:
    return _described_list(
        SASL_OUTCOME, b'\x50' + bytes([code]), _encode_binary(additional) if additional else b'\x40'
    )
