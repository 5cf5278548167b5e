"""
Hold many idle AMQP connections open against one broker and report its memory per connection.

Each connection is a real AMQP 1.0 client (python-qpid-proton's engine driven from asyncio, SASL
ANONYMOUS when the broker offers SASL): it opens the connection and one session, then stays idle,
answering heartbeats, for ``--hold`` seconds. Reports connections opened, refused or dropped,
the broker's resident memory (``/proc/PID/status`` VmRSS) before and after, and MiB per
connection; then closes every connection cleanly. Loopback only; bounded in count and time.

usage: python bench/idle.py --port 5672 --broker-pid PID [--count 5000] [--hold 30]
"""

import argparse
import asyncio
import resource
import time
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi, lib

MiB = 1024 * 1024


class IdleClient(asyncio.Protocol):
    """One connection: open, begin, then only heartbeats until told to close."""

    def __init__(self, name: str, opened: asyncio.Future[None]) -> None:
        self.opened = opened
        self.closed_by_peer = False
        self.transport_ptr = lib.pn_transport()
        self.connection = lib.pn_connection()
        self.collector = lib.pn_collector()
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_connection_set_container(self.connection, name.encode())
        lib.pn_connection_set_hostname(self.connection, b'127.0.0.1')
        lib.pn_sasl_allowed_mechs(lib.pn_sasl(self.transport_ptr), b'ANONYMOUS')
        lib.pn_transport_bind(self.transport_ptr, self.connection)
        lib.pn_connection_open(self.connection)
        lib.pn_session_open(lib.pn_session(self.connection))
        self.socket: Any = None

    def connection_made(self, transport: Any) -> None:
        self.socket = transport
        self.pump()

    def data_received(self, data: bytes) -> None:
        view, offset = memoryview(data), 0
        while offset < len(view):
            room = lib.pn_transport_capacity(self.transport_ptr)
            if room <= 0:
                break
            chunk = view[offset : offset + room]
            lib.pn_transport_push(self.transport_ptr, ffi.from_buffer(chunk), len(chunk))
            offset += len(chunk)
        self.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self.socket = None
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f'closed before open: {exc}'))
        else:
            self.closed_by_peer = True

    def pump(self) -> None:
        while (event := lib.pn_collector_peek(self.collector)) != ffi.NULL:
            kind = lib.pn_event_type(event)
            if kind == lib.PN_CONNECTION_REMOTE_OPEN and not self.opened.done():
                self.opened.set_result(None)
            elif kind == lib.PN_CONNECTION_REMOTE_CLOSE:
                self.closed_by_peer = True
            lib.pn_collector_pop(self.collector)
        t = self.transport_ptr
        lib.pn_transport_tick(t, int(time.monotonic() * 1000))
        while self.socket is not None and (pending := lib.pn_transport_pending(t)) > 0:
            buffer = bytearray(pending)
            lib.pn_transport_peek(t, ffi.from_buffer(buffer), pending)
            lib.pn_transport_pop(t, pending)
            self.socket.write(buffer)

    def close(self) -> None:
        lib.pn_connection_close(self.connection)
        self.pump()

    def free(self) -> None:
        lib.pn_transport_unbind(self.transport_ptr)
        lib.pn_connection_release(self.connection)
        lib.pn_decref(self.connection)
        lib.pn_decref(self.transport_ptr)
        lib.pn_collector_free(self.collector)


def rss_mib(pid: int) -> float:
    """VmRSS of process PID (0: this process) in MiB."""
    with open(f'/proc/{pid or "self"}/status') as status:
        for line in status:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'no VmRSS for {pid}')


async def open_clients(
    opts: argparse.Namespace, prefix: str, on_open: Callable[[IdleClient, int], None] | None = None
) -> tuple[list[IdleClient], list[str]]:
    """Open ``opts.count`` connections, ``opts.parallel`` at a time, within ``opts.timeout``
    (the descriptor limit raised first); ``on_open`` is called with each one opened. Returns
    the clients opened and why the others failed."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < opts.count + 100:
        raise SystemExit(f'need {opts.count + 100} file descriptors, the hard limit is {hard}')
    loop = asyncio.get_running_loop()
    clients: list[IdleClient] = []
    failures: list[str] = []
    gate = asyncio.Semaphore(opts.parallel)
    deadline = time.monotonic() + opts.timeout

    async def one(i: int) -> None:
        async with gate:
            opened: asyncio.Future[None] = loop.create_future()
            client = IdleClient(f'{prefix}-{i}', opened)
            try:
                await loop.create_connection(lambda: client, opts.host, opts.port)
                await asyncio.wait_for(opened, max(0.1, deadline - time.monotonic()))
            except (OSError, TimeoutError, ConnectionError) as exc:
                failures.append(f'{type(exc).__name__}: {exc}')
                return
            if on_open is not None:
                on_open(client, i)
            clients.append(client)

    await asyncio.gather(*(one(i) for i in range(opts.count)))
    return clients, failures


async def close_clients(clients: list[IdleClient]) -> None:
    """Close every client, then free its engine once the broker had time to answer."""
    for client in clients:
        client.close()
    await asyncio.sleep(2.0)
    for client in clients:
        if client.socket is not None:
            client.socket.close()
        client.free()
    await asyncio.sleep(1.0)


async def main(opts: argparse.Namespace) -> None:
    before = rss_mib(opts.broker_pid)
    started = time.monotonic()
    clients, failures = await open_clients(opts, 'idle')
    open_seconds = time.monotonic() - started
    all_open = rss_mib(opts.broker_pid)

    async def heartbeats() -> None:  # tick every second: answers the broker's idle timeout
        while True:
            await asyncio.sleep(1.0)
            for client in clients:
                client.pump()

    ticking = asyncio.create_task(heartbeats())
    await asyncio.sleep(opts.hold)
    held = rss_mib(opts.broker_pid)
    dropped = sum(1 for c in clients if c.closed_by_peer)
    ticking.cancel()
    await close_clients(clients)
    after = rss_mib(opts.broker_pid)
    opened = len(clients)
    per = (held - before) / opened if opened else float('nan')
    print(
        f'connections: asked {opts.count}, opened {opened} in {open_seconds:.1f} s, failed '
        f'{len(failures)}{" (e.g. " + failures[0] + ")" if failures else ""}, dropped by the '
        f'broker while idle {dropped} (held {opts.hold:.0f} s)\n'
        f'broker RSS MiB: before {before:.1f}, all open {all_open:.1f}, after holding '
        f'{held:.1f}, after closing {after:.1f}; {per * 1024:.1f} KiB = {per:.3f} MiB per '
        f'connection'
    )
    if failures or dropped:
        raise SystemExit(1)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--broker-pid', type=int, required=True)
    parser.add_argument('--count', type=int, default=5000)
    parser.add_argument('--hold', type=float, default=30.0, help='seconds to stay idle')
    parser.add_argument('--parallel', type=int, default=200, help='connects in flight')
    parser.add_argument('--timeout', type=float, default=120.0, help='bound on opening them all')
    options = parser.parse_args()
    if not options.host.startswith('127.'):
        raise SystemExit('loopback only')
    asyncio.run(main(options))
