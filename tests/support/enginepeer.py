"""
A client built on proton's engine and a plain socket, pumped by hand.

For wire-level tests the blocking client cannot express: holding a transport open without sending
Open, staying silent (no heartbeats), or writing arbitrary bytes before or after a handshake.
"""

import socket
import time

from proton import Connection, Endpoint, Transport


class EnginePeer:
    def __init__(self, port: int, *, sasl: bool = True, idle_timeout: float | None = None) -> None:
        self.sock = socket.create_connection(('127.0.0.1', port), timeout=5)
        self.sock.settimeout(0.02)
        self.connection = Connection()
        self.transport = Transport()
        if sasl:
            self.transport.sasl().allowed_mechs('ANONYMOUS')
        if idle_timeout is not None:
            self.transport.idle_timeout = idle_timeout
        self.transport.bind(self.connection)
        self.eof = False

    def pump(self, seconds: float, *, until=None, tick: bool = True) -> bool:  # type: ignore[no-untyped-def]
        """Move bytes both ways for up to ``seconds``; stop early once ``until()`` holds."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if tick:
                self.transport.tick(time.monotonic())
            pending = self.transport.pending()
            if pending > 0:
                self.sock.sendall(self.transport.peek(pending))
                self.transport.pop(pending)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                data = None
            except OSError:
                data = b''
            if data == b'':
                self.eof = True
                self.transport.close_tail()
            elif data:
                self._push(data)
            if until is not None and until():
                return True
            if self.eof:
                return until() if until is not None else False
        return False

    def _push(self, data: bytes) -> None:
        """Into the transport in the slices its capacity allows (it takes no more at once)."""
        while data:
            capacity = self.transport.capacity()
            if capacity <= 0:
                return  # its input side has closed: the rest means nothing to it
            self.transport.push(data[:capacity])
            data = data[capacity:]

    @property
    def remote_open(self) -> bool:
        return bool(self.connection.state & Endpoint.REMOTE_ACTIVE)

    @property
    def remote_closed(self) -> bool:
        return bool(self.connection.state & Endpoint.REMOTE_CLOSED)

    def close(self) -> None:
        self.sock.close()


def read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """Everything the peer writes until it closes (True) or ``seconds`` pass (False)."""
    sock.settimeout(0.1)
    received = b''
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
    return received, False
