"""
A loopback TCP proxy in front of one Redis that cuts the connection carrying a ``MULTI``'s
``EXEC``: the moment a one-slot commit's outcome is lost with its connection.

Armed with ``arm(run=True)``, the next ``EXEC`` reaches Redis but its reply never gets back; the
test checks in Redis itself that it ran, then ``cut()`` resets that connection (the reply lost,
as when Redis or the network dies right after applying it). Armed with ``arm(run=False)``, the
connection is reset just before the ``EXEC`` reaches Redis, which then drops the queued
``MULTI``: nothing of it ran. Every other connection, and every one opened after the cut, goes
through unchanged, unless ``cut`` also puts Redis out of reach for a while.
"""

import contextlib
import socket
import struct
import threading
import time

from processes import LOOPBACK

EXEC = b'*1\r\n$4\r\nEXEC\r\n'
"""The ``EXEC`` command as redis-py writes it (RESP)."""


class _Link:
    """One client connection and its connection to Redis."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.replies_lost = False

    def reset(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
                # shutdown first: close() alone does not end a connection another thread is
                # blocked reading from; the pump thread then closes it (a reset, thanks to linger)
                s.shutdown(socket.SHUT_RDWR)


class ExecCutter:
    def __init__(self, target_port: int) -> None:
        self.target = (LOOPBACK, target_port)
        self.listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self.listener.getsockname()[1])
        self.exec_sent = threading.Event()
        """Set once the armed ``EXEC`` reached Redis (``arm(run=True)``)."""
        self.exec_dropped = threading.Event()
        """Set once the armed ``EXEC`` was kept from Redis and its connection reset."""
        self._lock = threading.Lock()
        self._armed: bool | None = None
        self._caught: _Link | None = None
        self._links: list[_Link] = []
        self._refusing_until = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f'redis://{LOOPBACK}:{self.port}/0'

    def arm(self, *, run: bool) -> None:
        """Catch the next ``EXEC``: let it run and lose its reply, or keep it from Redis."""
        with self._lock:
            self._armed = run

    def cut(self, out_of_reach: float = 0.0) -> None:
        """Reset the connection whose ``EXEC`` ran (its reply never got back); with
        ``out_of_reach``, reset every connection as well and turn new ones away for that many
        seconds (Redis gone for a while)."""
        with self._lock:
            caught, self._caught = self._caught, None
            if out_of_reach:
                self._refusing_until = time.monotonic() + out_of_reach
            doomed = list(self._links) if out_of_reach else []
        assert caught is not None, 'no EXEC was caught'
        for link in (caught, *doomed):
            link.reset()

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.reset()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                if time.monotonic() < self._refusing_until:
                    client.close()  # Redis out of reach
                    continue
                upstream = socket.create_connection(self.target)
            except OSError:
                if self.listener.fileno() < 0:
                    return
                continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._replies, args=(link,), daemon=True).start()

    def _requests(self, link: _Link) -> None:
        tail = b''  # the end of the last chunk, short of a whole EXEC: one may straddle two
        with contextlib.suppress(OSError):
            while data := link.client.recv(65536):
                seen = tail + data
                tail = seen[-(len(EXEC) - 1) :]
                at = seen.find(EXEC)
                with self._lock:
                    run = self._armed if at >= 0 else None
                    if run is not None:
                        self._armed = None
                        if run:
                            link.replies_lost = True
                            self._caught = link
                if run is False:
                    link.upstream.sendall(data[: max(0, at - (len(seen) - len(data)))])
                    link.reset()
                    self.exec_dropped.set()
                    break
                link.upstream.sendall(data)
                if run:
                    self.exec_sent.set()
        _close(link.client, link.upstream, link.client)

    def _replies(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := link.upstream.recv(65536):
                if link.replies_lost:
                    continue  # lost on the way
                link.client.sendall(data)
        _close(link.upstream, link.client, link.upstream)


def _close(source: socket.socket, sink: socket.socket, own: socket.socket) -> None:
    for s in (source, sink):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
    own.close()  # each socket is the source of exactly one pump
