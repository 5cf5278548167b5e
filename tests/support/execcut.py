"""
A loopback TCP proxy in front of one Redis that cuts the connection carrying a ``MULTI``'s
``EXEC``: the moment a one-slot commit's outcome is lost with its connection.

Armed with ``arm(run=True)``, the next ``EXEC`` reaches Redis but its reply never gets back; the
test checks in Redis itself that it ran, then ``cut()`` resets that connection (the reply lost,
as when Redis or the network dies right after applying it). Armed with ``arm(run=False)``, the
connection is reset just before the ``EXEC`` reaches Redis, which then drops the queued
``MULTI``: nothing of it ran. Armed with ``arm_late()``, the broker's side of the connection is
reset while the ``EXEC`` is kept, its connection to Redis open, until ``release_late()`` hands
it to Redis: the bytes a live Redis had not read yet when the broker closed the connection (a
``+switch-master`` closing connections in use, a ``socket_timeout``), run after the broker
already asked whether they had. Every other connection, and every one opened after the cut, goes
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
        self.answered = threading.Event()
        """Set whenever Redis answers on this connection."""

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
        self._late_armed = False
        self._late: tuple[_Link, bytes] | None = None
        self.late_kept = threading.Event()
        """Set once the ``EXEC`` armed by ``arm_late`` is kept and the broker's side reset."""
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

    def arm_late(self) -> None:
        """Keep the next ``EXEC`` from Redis and reset the broker's side of its connection."""
        with self._lock:
            self._late_armed = True

    def release_late(self) -> None:
        """Hand the kept ``EXEC`` to Redis at last, wait for Redis to answer it, then close."""
        with self._lock:
            late, self._late = self._late, None
        assert late is not None, 'no EXEC was kept'
        link, data = late
        link.answered.clear()
        link.upstream.sendall(data)
        assert link.answered.wait(10), 'Redis did not answer the EXEC'  # it ran, or was aborted
        link.reset()

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
                    late = at >= 0 and self._late_armed
                    if late:
                        self._late_armed = False
                        self._late = (link, data)
                        link.replies_lost = True
                    run = self._armed if at >= 0 and not late else None
                    if run is not None:
                        self._armed = None
                        if run:
                            link.replies_lost = True
                            self._caught = link
                if late:  # the broker's side goes; Redis keeps the connection, EXEC unread
                    with contextlib.suppress(OSError):
                        link.client.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0)
                        )
                        link.client.shutdown(socket.SHUT_RDWR)
                    link.client.close()
                    self.late_kept.set()
                    return
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
                link.answered.set()
                if link.replies_lost:
                    continue  # lost on the way
                link.client.sendall(data)
        _close(link.upstream, link.client, link.upstream)


def _close(source: socket.socket, sink: socket.socket, own: socket.socket) -> None:
    for s in (source, sink):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
    own.close()  # each socket is the source of exactly one pump
