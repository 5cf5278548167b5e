"""
SASL at the wire level as Qpid JMS does it (jms-amqp-facts §1.1), on a plain or TLS socket.

proton's own client speaks only PLAIN, ANONYMOUS and EXTERNAL without Cyrus, so this client runs
the exchange itself: it reads the offered mechanisms, picks one by Qpid JMS's preference among
those its credentials suit, runs SCRAM with ``scramp`` (and checks the server's signature), then
(optionally) sends the AMQP header and an Open through a SASL-less proton transport. Frames are
decoded with proton's ``Data``, independently of the broker's codec.
"""

import dataclasses
import socket
import time

import scramp
from proton import Connection, Data, Endpoint, Transport

SASL_HEADER = b'AMQP\x03\x01\x00\x00'
AMQP_HEADER = b'AMQP\x00\x01\x00\x00'
PREFERENCE = ['EXTERNAL', 'SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN', 'ANONYMOUS']
OK, AUTH = 0, 1


@dataclasses.dataclass
class Outcome:
    offered: list[str]
    mechanism: str | None = None
    code: int | None = None
    additional: bytes = b''
    server_verified: bool = False
    closed_after: bool = False
    raw: bytes = b''
    """Every byte the server sent during SASL."""


def frame(descriptor: int, *fields: object) -> bytes:
    d = Data()
    d.put_described()
    d.enter()
    d.put_ulong(descriptor)
    d.put_list()
    d.enter()
    for f in fields:
        if f is None:
            d.put_null()
        elif isinstance(f, bytes):
            d.put_binary(f)
        else:
            d.put_symbol(str(f))
    d.exit()
    d.exit()
    body = d.encode()
    return (8 + len(body)).to_bytes(4, 'big') + b'\x02\x01\x00\x00' + body


class Wire:
    def __init__(self, sock: socket.socket, timeout: float = 5.0) -> None:
        self.sock = sock
        self.sock.settimeout(timeout)
        self.buffer = b''
        self.received = b''

    def __enter__(self) -> 'Wire':
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f'closed with {self.buffer!r} buffered')
            self.buffer += chunk
            self.received += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def frame(self) -> tuple[int, list[object]]:
        size = int.from_bytes(self.read(4), 'big')
        rest = self.read(size - 4)
        doff = rest[0]
        body = rest[doff * 4 - 4 :]
        d = Data()
        d.decode(body)
        d.rewind()
        d.next()
        value = d.get_object()
        # binaries come back as views into d's buffer: copy them before d is freed
        fields = [bytes(f) if isinstance(f, memoryview) else f for f in value.value]
        return int(value.descriptor), fields

    def closed(self, seconds: float = 3.0) -> bool:
        """True if the server closes the socket within ``seconds`` (nothing more read)."""
        self.sock.settimeout(seconds)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.received += chunk
        except TimeoutError:
            return False
        except (ConnectionResetError, OSError):
            return True


def _symbols(value: object) -> list[str]:
    elements = getattr(value, 'elements', None)
    if elements is not None:
        return [str(e) for e in elements]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)] if value is not None else []


def choose(offered: list[str], *, user: str | None, password: str | None, cert: bool) -> str | None:
    """Qpid JMS's choice: the most preferred mechanism offered that the credentials suit."""
    for mech in PREFERENCE:
        if mech not in offered:
            continue
        if mech == 'EXTERNAL' and not cert:
            continue
        if mech in ('SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN') and not (user and password):
            continue
        return mech
    return None


def authenticate(
    wire: Wire,
    *,
    user: str | None = None,
    password: str | None = None,
    cert: bool = False,
    mechanism: str | None = None,
) -> Outcome:
    wire.sock.sendall(SASL_HEADER)
    header = wire.read(8)
    assert header == SASL_HEADER, header
    descriptor, fields = wire.frame()
    assert descriptor == 0x40, descriptor
    result = Outcome(offered=_symbols(fields[0]))
    mech = mechanism or choose(result.offered, user=user, password=password, cert=cert)
    result.mechanism = mech
    if mech is None:
        return result
    scram = None
    if mech.startswith('SCRAM-'):
        scram = scramp.ScramClient([mech], user, password)
        initial = scram.get_client_first().encode()
    elif mech == 'PLAIN':
        initial = b'\0' + (user or '').encode() + b'\0' + (password or '').encode()
    else:
        initial = b''
    wire.sock.sendall(frame(0x41, mech, initial, None))
    while True:
        descriptor, fields = wire.frame()
        if descriptor == 0x42:  # challenge
            assert scram is not None
            scram.set_server_first(bytes(fields[0]).decode())
            wire.sock.sendall(frame(0x43, scram.get_client_final().encode()))
            continue
        assert descriptor == 0x44, descriptor
        result.code = int(fields[0])
        result.additional = bytes(fields[1]) if len(fields) > 1 and fields[1] is not None else b''
        if scram is not None and result.code == OK:
            scram.set_server_final(result.additional.decode())  # raises if the server lied
            result.server_verified = True
        break
    if result.code != OK:
        result.closed_after = wire.closed()
    result.raw = wire.received
    return result


def open_amqp(wire: Wire, container_id: str = 'saslwire', seconds: float = 5.0) -> Connection:
    """After a successful SASL: the AMQP header and an Open; returns once the peer answered."""
    transport = Transport()
    connection = Connection()
    connection.container = container_id
    transport.bind(connection)
    connection.open()
    wire.sock.settimeout(0.05)
    if wire.buffer:
        transport.push(wire.buffer)
        wire.buffer = b''
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pending = transport.pending()
        if pending > 0:
            wire.sock.sendall(transport.peek(pending))
            transport.pop(pending)
        if connection.state & (Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED):
            break
        try:
            data = wire.sock.recv(65536)
        except TimeoutError:
            continue
        if not data:
            break
        transport.push(data)
    return connection
