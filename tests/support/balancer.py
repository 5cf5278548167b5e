"""
A loopback TCP balancer standing in for a Kubernetes Service: new connections go round-robin to
the replicas it lists, and a replica that is dropped gets no new connection while the ones it has
stay up, as kube-proxy does once a terminating pod's readiness goes false. A replica that refuses
a connection is skipped for the next one, so a client only fails to connect when none is listed.
"""

import contextlib
import socket
import threading

from processes import LOOPBACK


class Balancer:
    def __init__(self) -> None:
        self.listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self.listener.getsockname()[1])
        self._lock = threading.Lock()
        self._ports: list[int] = []
        self._next = 0
        self._sockets: list[socket.socket] = []
        self.connections: dict[int, int] = {}
        """Connections forwarded so far, by replica port."""
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f'amqp://{LOOPBACK}:{self.port}'

    def add(self, port: int) -> None:
        with self._lock:
            self._ports.append(port)

    def drop(self, port: int) -> None:
        with self._lock:
            self._ports.remove(port)

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            doomed, self._sockets = self._sockets, []
        for s in doomed:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _upstream(self) -> socket.socket | None:
        with self._lock:
            ports = list(self._ports)
            start = self._next
            self._next += 1
        for i in range(len(ports)):
            port = ports[(start + i) % len(ports)]
            try:
                upstream = socket.create_connection((LOOPBACK, port), timeout=2)
            except OSError:
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections[port] = self.connections.get(port, 0) + 1
            return upstream
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = self._upstream()
            if upstream is None:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with self._lock:
            if source in self._sockets:
                self._sockets.remove(source)
        source.close()  # each socket is the source of exactly one pump
