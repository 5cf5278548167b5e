"""
What one AMQP connection costs the broker in memory, by what the connection carries.

Opens ``--count`` real AMQP 1.0 connections from this one process (``idle.IdleClient``: proton's
engine driven from asyncio), each with one session and, by ``--links``, a sender to its own queue,
a receiver from it, or both; waits until every link is attached, then reports the broker's
resident memory (``/proc/PID/status`` VmRSS) before, with them all open, and after closing, and
the KiB per connection. ``--proton-only`` instead builds the same server-side proton-c objects in
this process (a transport set up as ``amqp/connection.py`` sets it up, fed the client's Open,
Begin and Attach frames and answered) and reports proton-c's own RSS per connection, so the
broker's figure splits into proton-c and the rest (Python objects, asyncio).
Loopback only; bounded in count and time.

usage: python bench/connection_memory.py --port 5672 --broker-pid PID [--count 2000]
                                         [--links none|sender|receiver|both]
       python bench/connection_memory.py --proton-only [--count 2000] [--links both]
"""

import argparse
import asyncio
import time

from cproton_ffi import ffi, lib

from idle import IdleClient, close_clients, open_clients, rss_mib


def open_links(client: IdleClient, links: str, queue: str) -> None:
    """Attach the links ``links`` names on the client's session (opened with the connection)."""
    session = lib.pn_session_head(client.connection, 0)
    if links in ('sender', 'both'):
        snd = lib.pn_sender(session, f'{queue}-snd'.encode())
        lib.pn_terminus_set_address(lib.pn_link_target(snd), queue.encode())
        lib.pn_link_open(snd)
    if links in ('receiver', 'both'):
        rcv = lib.pn_receiver(session, f'{queue}-rcv'.encode())
        lib.pn_terminus_set_address(lib.pn_link_source(rcv), queue.encode())
        lib.pn_link_open(rcv)
        lib.pn_link_flow(rcv, 10)
    client.pump()


def attached(client: IdleClient) -> bool:
    """True once the broker answered every link this client opened."""
    link = lib.pn_link_head(client.connection, 0)
    while link != ffi.NULL:
        if lib.pn_link_state(link) & lib.PN_REMOTE_UNINIT:
            return False
        link = lib.pn_link_next(link, 0)
    return True


def client_frames(links: str) -> bytes:
    """The bytes a client sends to open a connection, a session and ``links`` (no SASL)."""
    t, c = lib.pn_transport(), lib.pn_connection()
    lib.pn_transport_bind(t, c)
    lib.pn_connection_open(c)
    session = lib.pn_session(c)
    lib.pn_session_open(session)
    if links in ('sender', 'both'):
        lib.pn_link_open(lib.pn_sender(session, b'snd'))
    if links in ('receiver', 'both'):
        lib.pn_link_open(lib.pn_receiver(session, b'rcv'))
    pending = lib.pn_transport_pending(t)
    frames = bytearray(pending)
    lib.pn_transport_peek(t, ffi.from_buffer(frames), pending)
    return bytes(frames)


def proton_only(opts: argparse.Namespace) -> None:
    """proton-c's RSS per server-side connection, in this process: no Python per connection
    beyond the three cffi pointers kept."""
    frames = client_frames(opts.links)
    kept = []
    before = rss_mib(0)
    for _ in range(opts.count):
        t, c, events = lib.pn_transport(), lib.pn_connection(), lib.pn_collector()
        lib.pn_transport_set_server(t)
        lib.pn_transport_set_max_frame(t, opts.max_frame)
        lib.pn_connection_collect(c, events)
        lib.pn_transport_bind(t, c)
        lib.pn_transport_push(t, frames, len(frames))
        lib.pn_connection_open(c)
        session = lib.pn_session_head(c, 0)
        while session != ffi.NULL:
            lib.pn_session_open(session)
            session = lib.pn_session_next(session, 0)
        link = lib.pn_link_head(c, 0)
        while link != ffi.NULL:
            lib.pn_link_open(link)
            if lib.pn_link_is_receiver(link):
                lib.pn_link_flow(link, 1000)
            link = lib.pn_link_next(link, 0)
        if (pending := lib.pn_transport_pending(t)) > 0:
            lib.pn_transport_pop(t, pending)
        while lib.pn_collector_peek(events) != ffi.NULL:
            lib.pn_collector_pop(events)
        kept.append((t, c, events))
    per = (rss_mib(0) - before) / opts.count
    print(
        f'proton-c only: {opts.count} server-side connections, links {opts.links}, max-frame '
        f'{opts.max_frame}: {per * 1024:.1f} KiB per connection'
    )


async def main(opts: argparse.Namespace) -> None:
    before = rss_mib(opts.broker_pid)
    deadline = time.monotonic() + opts.timeout
    clients, failures = await open_clients(
        opts, 'mem', lambda client, i: open_links(client, opts.links, f'mem-{opts.links}-{i}')
    )
    waiting = list(clients)
    while waiting and time.monotonic() < deadline:  # bounded: by --timeout
        await asyncio.sleep(0.2)
        waiting = [c for c in waiting if not attached(c)]
    await asyncio.sleep(opts.settle)
    for client in clients:
        client.pump()
    held = rss_mib(opts.broker_pid)
    await close_clients(clients)
    after = rss_mib(opts.broker_pid)
    opened = len(clients)
    per = (held - before) / opened if opened else float('nan')
    print(
        f'{opts.count} connections, links {opts.links}: opened {opened}, failed {len(failures)}, '
        f'not attached {len(waiting)}; broker RSS MiB before {before:.1f}, all open {held:.1f}, '
        f'after closing {after:.1f}; {per * 1024:.1f} KiB per connection'
    )
    if failures or waiting:
        raise SystemExit(1)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=0)
    parser.add_argument('--broker-pid', type=int, default=0)
    parser.add_argument('--count', type=int, default=2000)
    parser.add_argument('--links', choices=('none', 'sender', 'receiver', 'both'), default='none')
    parser.add_argument('--parallel', type=int, default=200, help='connects in flight')
    parser.add_argument('--settle', type=float, default=3.0, help='seconds before reading RSS')
    parser.add_argument('--timeout', type=float, default=120.0, help='bound on opening them all')
    parser.add_argument('--proton-only', action='store_true')
    parser.add_argument('--max-frame', type=int, default=1024 * 1024)
    options = parser.parse_args()
    if not options.host.startswith('127.'):
        raise SystemExit('loopback only')
    if options.proton_only:
        proton_only(options)
    else:
        if not options.port or not options.broker_pid:
            raise SystemExit('--port and --broker-pid are needed unless --proton-only')
        asyncio.run(main(options))
