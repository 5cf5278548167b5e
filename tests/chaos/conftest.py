"""
Chaos tests: replicas and Redis servers of their own, broken on purpose under load.

Every test gets a ``cluster``: the broker replicas, Redis servers and Sentinel groups it starts
through it are stopped by PID at the end, in that order (a frozen redis-server is thawed first),
whatever the test did to them.
Nothing is shared with the session's Redis and brokers, so kills and reaping stay inside the test.
The cluster also carries the few operations the tests share (test modules cannot import this
file under ``--import-mode=importlib``).
"""

import contextlib
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import LOOPBACK, BrokerProcess, RedisServer
from sentinels import SentinelGroup

FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}


class CuttableProxy:
    """A loopback TCP proxy in front of Redis that can lose replies and cut every connection:
    the network between a broker and Redis failing, with Redis itself fine."""

    def __init__(self, target_port: int) -> None:
        self.target = (LOOPBACK, target_port)
        self.listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self.listener.getsockname()[1])
        self.cuts = 0
        self.reply_delay = 0.0
        """Seconds each chunk of replies is held back (a slow network or a busy Redis)."""
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._replies_lost = threading.Event()
        self._partitioned = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f'redis://{LOOPBACK}:{self.port}/0'

    def lose_replies_then_cut(self, seconds: float) -> None:
        """For ``seconds`` Redis gets and runs every command but no reply gets back; then every
        connection is reset (clients reconnect through the proxy at once)."""
        self._replies_lost.set()
        time.sleep(seconds)
        with self._lock:
            doomed, self._sockets = self._sockets, []
        for s in doomed:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
                # shutdown first: close() alone does not end a connection another thread is
                # blocked reading from; the pump thread then closes it (a reset, thanks to linger)
                s.shutdown(socket.SHUT_RDWR)
        self._replies_lost.clear()
        self.cuts += 1

    def partition(self, seconds: float) -> None:
        """For ``seconds`` nothing gets through either way and nothing is reset (a network
        partition: the broker only notices by its timeouts); then traffic flows again."""
        self._partitioned.set()
        time.sleep(seconds)
        self._partitioned.clear()

    def close(self) -> None:
        self.listener.close()
        self.lose_replies_then_cut(0)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                if self.listener.fileno() < 0:
                    return
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self._partitioned.is_set() or (replies and self._replies_lost.is_set()):
                    continue  # lost on the way
                if replies and self.reply_delay:
                    time.sleep(self.reply_delay)  # in order: one pump per direction
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        source.close()  # each socket is the source of exactly one pump


class Cluster:
    FAST_LEASE = FAST_LEASE

    def __init__(self) -> None:
        self.redis_servers: list[RedisServer] = []
        self.brokers: list[BrokerProcess] = []
        self.proxies: list[CuttableProxy] = []
        self.sentinel_groups: list[SentinelGroup] = []
        self._arguments: dict[int, tuple[str, ...]] = {}

    def proxy(self, redis_server: RedisServer) -> CuttableProxy:
        p = CuttableProxy(redis_server.port)
        self.proxies.append(p)
        return p

    def redis(self, *extra: str, port: int | None = None) -> RedisServer:
        server = RedisServer(port, *extra)
        self.redis_servers.append(server)
        self._arguments[server.port] = extra
        return server

    def aof_redis(self, data: Path, *, fsync_always: bool = False) -> RedisServer:
        """A Redis keeping an append-only file in ``data``: a clean stop keeps what was written
        (every write fsynced first with ``fsync_always``), and ``restart`` reads it back."""
        fsync = ('--appendfsync', 'always') if fsync_always else ()
        return self.redis('--appendonly', 'yes', *fsync, '--dir', str(data))  # the later --dir wins

    def restart(self, server: RedisServer) -> RedisServer:
        """The stopped ``server`` again, on its port and with its arguments."""
        return self.redis(*self._arguments[server.port], port=server.port)

    def sentinels(self) -> SentinelGroup:
        """A Sentinel group, stopped after the brokers: a broker whose Redis is gone takes
        seconds to stop."""
        group = SentinelGroup()
        self.sentinel_groups.append(group)
        return group

    def broker(self, redis_url: str, **kwargs: Any) -> BrokerProcess:
        b = BrokerProcess(redis_url, **kwargs)
        self.brokers.append(b)
        return b

    def stop_all(self) -> None:
        for b in self.brokers:
            b.stop()
        for p in self.proxies:
            p.close()
        for server in self.redis_servers:
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)
            server.stop()
        for group in self.sentinel_groups:
            group.stop()

    @staticmethod
    def kill_9(process: 'subprocess.Popen[bytes]') -> float:
        """SIGKILL a process and reap it; returns time.monotonic() right after the signal."""
        process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        process.wait(timeout=10)
        return killed_at

    @staticmethod
    def ready(b: BrokerProcess) -> bool:
        """/readyz answers 200 (False while it answers otherwise, or not within 2 s)."""
        try:
            return b.http_get('/readyz')[0] == 200
        except OSError:  # urllib's URLError and socket timeouts are OSErrors
            return False

    @classmethod
    def wait_ready(cls, b: BrokerProcess, timeout: float) -> float | None:
        """Seconds until /readyz answered 200, or None if it did not within ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if cls.ready(b):
                return time.monotonic() - start
            time.sleep(0.1)
        return None

    @staticmethod
    def reaped_entries(log: str, replica_id: str) -> int:
        """In-flight entries a reaper returned for ``replica_id``, read from a replica's log."""
        pattern = rf'replica {re.escape(replica_id)} is gone: (\d+) in-flight entries returned'
        return sum(int(n) for n in re.findall(pattern, log))

    @staticmethod
    def report(what: str) -> None:
        """One line of measurements on stderr (shown with ``-rA`` or on failure)."""
        sys.stderr.write(f'[chaos] {what}\n')


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.stop_all()
