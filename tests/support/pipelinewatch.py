"""
A loopback TCP proxy in front of one Redis server that tells how deep the pipelines sent through
it were, for the tests of the background passes' slices.

Redis cannot tell one pipeline from the next. A client of redis-py sends a connection's next
pipeline only once it has read the replies of the last, so the commands a connection has sent
and not yet had answered at one moment are one pipeline's. The proxy parses both directions with
hiredis and counts, per label (``label``: a command's name and first argument, a script's hash
for EVALSHA): the most commands one connection had unanswered at once (``deepest``), and the most
connections with such commands unanswered at once (``widest``: pipelines side by side).

``watched_cluster`` puts one proxy in front of each primary of a cluster and has each node
announce its proxy's port (``cluster-announce-port``), so clients find the proxies in the slot
map and every call to a primary goes through its proxy.
"""

import collections
import contextlib
import socket
import threading
from collections.abc import Iterator

import hiredis
import redis
from processes import LOOPBACK, wait_for
from redisclusters import ClusterGroup

READ_SIZE = 65536
MAX_CONNECTIONS = 10_000
"""Connections one proxy forwards at most (a test opens a few dozen)."""
MAX_READS = 10_000_000
"""Reads one direction of a connection makes at most (a test's traffic is far less)."""


def label(command: list[bytes]) -> str:
    """``XADD shoal:metrics``, ``EVALSHA <sha>``: the name and the first argument."""
    head = command[0].decode().upper()
    return f'{head} {command[1].decode()}' if len(command) > 1 else head


class _Connection:
    def __init__(self) -> None:
        self.unanswered: collections.deque[str] = collections.deque()
        self.counts: collections.Counter[str] = collections.Counter()


class PipelineWatch:
    """The proxy: ``port`` in front of the Redis server on ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self.listener.getsockname()[1])
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._busy: collections.Counter[str] = collections.Counter()
        self.deepest: collections.Counter[str] = collections.Counter()
        """Label -> the most commands of it one connection had unanswered at once."""
        self.widest: collections.Counter[str] = collections.Counter()
        """Label -> the most connections with commands of it unanswered at once."""
        self.sent: collections.Counter[str] = collections.Counter()
        """Label -> commands sent through the proxy."""
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f'redis://{LOOPBACK}:{self.port}/0'

    def reset(self) -> None:
        with self._lock:
            self.deepest.clear()
            self.widest.clear()
            self.sent.clear()

    def close(self) -> None:
        """Stop: no new connection (the shutdown wakes the accepting thread, which a close alone
        leaves accepting), the open ones cut."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((LOOPBACK, self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            connection = _Connection()
            threading.Thread(
                target=self._requests, args=(client, server, connection), daemon=True
            ).start()
            threading.Thread(
                target=self._replies, args=(server, client, connection), daemon=True
            ).start()

    def _requests(self, source: socket.socket, target: socket.socket, c: _Connection) -> None:
        reader = hiredis.Reader()
        for data in _chunks(source):
            reader.feed(data)
            with self._lock:  # counted before Redis can answer them
                while (command := reader.gets()) is not False:
                    name = label(command)
                    c.unanswered.append(name)
                    c.counts[name] += 1
                    self.sent[name] += 1
                    self.deepest[name] = max(self.deepest[name], c.counts[name])
                    if c.counts[name] == 1:
                        self._busy[name] += 1
                        self.widest[name] = max(self.widest[name], self._busy[name])
            if not _forward(target, data):
                break
        _close(target)

    def _replies(self, source: socket.socket, target: socket.socket, c: _Connection) -> None:
        reader = hiredis.Reader()
        for data in _chunks(source):
            reader.feed(data)
            with self._lock:  # uncounted before the client can send more
                while reader.gets() is not False:
                    if not c.unanswered:  # a channel's message: nothing asked for it
                        continue
                    name = c.unanswered.popleft()
                    c.counts[name] -= 1
                    if not c.counts[name]:
                        self._busy[name] -= 1
            if not _forward(target, data):
                break
        _close(target)


def _chunks(sock: socket.socket) -> Iterator[bytes]:
    for _ in range(MAX_READS):
        try:
            data = sock.recv(READ_SIZE)
        except OSError:
            return
        if not data:
            return
        yield data


def _forward(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def watched_cluster(primaries: int = 3) -> Iterator[tuple[ClusterGroup, list[PipelineWatch]]]:
    """A cluster of ``primaries`` primaries (no replicas), each behind its own proxy, which
    every node's slot map names; its URL (``redis+cluster://``) names the proxies."""
    cluster = ClusterGroup(primaries=primaries, replicas_per_primary=0)
    watches: list[PipelineWatch] = []
    try:
        for node in cluster.nodes:
            watch = PipelineWatch(node.port)
            watches.append(watch)
            client = node.client()
            try:
                client.config_set('cluster-announce-port', watch.port)
            finally:
                client.close()
        wanted = {watch.port for watch in watches}
        wait_for(lambda: all(_announced(node.port) == wanted for node in cluster.nodes), 30,
                 "every node's slot map naming the proxies")  # fmt: skip
        yield cluster, watches
    finally:
        for watch in watches:
            watch.close()
        cluster.stop()


def _announced(port: int) -> set[int]:
    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=2)
    try:
        return {int(entry[2][1]) for entry in client.execute_command('CLUSTER', 'SLOTS')}
    except redis.exceptions.RedisError:
        return set()
    finally:
        client.close()


def cluster_url(watches: list[PipelineWatch]) -> str:
    return 'redis+cluster://' + ','.join(f'{LOOPBACK}:{watch.port}' for watch in watches)
