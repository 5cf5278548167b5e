"""
A JMS shared durable subscription under load: consumers spread over replicas, one producer.

bench/load.py attaches plain links; a JMS shared durable subscription needs the attach Qpid
JMS makes (link name ``NAME|global``, source capabilities ``topic shared global``, durable
terminus), so this is a small client of its own in the same style: python-qpid-proton's engine
through its cffi C API, one process per connection. The consumers attach first (creating the
subscription on the topic), then the producer sends ``--count`` 1 KiB messages at-least-once,
closed loop (at most ``--max-backlog`` sent but not yet received). Each body carries its
sequence number and send time; the consumers accept every message.

Prints one line: messages/s, p50/p99 end-to-end latency, per-consumer counts, duplicates and
missing (over all consumers together: each message to exactly one of them), and the CPU of the
broker PIDs given (``--json FILE`` appends it as one JSON line too). Exits 1 on a missing
message, an error or the timeout. Loopback only. With ``--queue`` the consumers compete for one
queue instead, attached plainly (the scale matrix's row f sets the two side by side).

usage: python bench/shared.py --replica HOST:PORT [--replica HOST:PORT ...] --consumers 4
         [--count 30000] [--broker-pid PID ...]
"""

import argparse
import json
import multiprocessing
import multiprocessing.sharedctypes
import os
import selectors
import socket
import statistics
import struct
import sys
import time
import uuid
from typing import Any

from cproton_ffi import ffi, lib
from proton import UNDESCRIBED, Array, Data, symbol

BODY = struct.Struct('>QQ')  # sequence, send time (CLOCK_MONOTONIC ns)
PN_DELIVERIES = 2


class Endpoint:
    """One AMQP connection and session over a blocking socket driven by a selector loop."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setblocking(False)
        self.transport = lib.pn_transport()
        self.connection = lib.pn_connection()
        self.collector = lib.pn_collector()
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_connection_set_container(self.connection, f'bench-{uuid.uuid4().hex}'.encode())
        lib.pn_connection_set_hostname(self.connection, host.encode())
        lib.pn_sasl_allowed_mechs(lib.pn_sasl(self.transport), b'ANONYMOUS')
        lib.pn_transport_bind(self.transport, self.connection)
        lib.pn_connection_open(self.connection)
        self.session = lib.pn_session(self.connection)
        lib.pn_session_open(self.session)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)

    def turn(self, timeout: float) -> list[Any]:
        """Write what is pending, read what arrived, return the engine events (type, pointer)."""
        self.flush()
        if self.selector.select(timeout):
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                data = None
            if data == b'':
                raise ConnectionError('broker closed the connection')
            if data:
                view, offset = memoryview(data), 0
                while offset < len(view):
                    room = lib.pn_transport_capacity(self.transport)
                    if room <= 0:
                        raise ConnectionError('transport closed')
                    chunk = view[offset : offset + room]
                    lib.pn_transport_push(self.transport, ffi.from_buffer(chunk), len(chunk))
                    offset += len(chunk)
        events = []
        while (event := lib.pn_collector_peek(self.collector)) != ffi.NULL:
            kind = lib.pn_event_type(event)
            if kind == lib.PN_DELIVERY:
                events.append((kind, lib.pn_event_delivery(event)))
            elif kind in (lib.PN_LINK_REMOTE_CLOSE, lib.PN_CONNECTION_REMOTE_CLOSE):
                raise ConnectionError(f'broker closed a link or the connection (event {kind})')
            lib.pn_collector_pop(self.collector)
        self.flush()
        return events

    def flush(self) -> None:
        lib.pn_transport_tick(self.transport, int(time.monotonic() * 1000))
        while (pending := lib.pn_transport_pending(self.transport)) > 0:
            buffer = bytearray(pending)
            lib.pn_transport_peek(self.transport, ffi.from_buffer(buffer), pending)
            try:
                sent = self.sock.send(buffer)
            except BlockingIOError:
                return
            lib.pn_transport_pop(self.transport, sent)


def consume(opts: Any, index: int, counts: Any, ready: Any, out: Any) -> None:
    host, port = opts.replica[index % len(opts.replica)].rsplit(':', 1)
    end = Endpoint(host, int(port))
    if opts.queue:  # --queue: competing consumers of one queue, a plain attach each
        link = lib.pn_receiver(end.session, f'{opts.name}-{index}'.encode())
        lib.pn_terminus_set_address(lib.pn_link_source(link), opts.topic.encode())
    else:
        link = lib.pn_receiver(end.session, f'{opts.name}|global'.encode())
        source = lib.pn_link_source(link)
        lib.pn_terminus_set_address(source, opts.topic.encode())
        lib.pn_terminus_set_durability(source, PN_DELIVERIES)
        lib.pn_terminus_set_expiry_policy(source, lib.PN_EXPIRE_NEVER)
        caps = Data(lib.pn_terminus_capabilities(source))
        caps.put_object(
            Array(UNDESCRIBED, Data.SYMBOL, *map(symbol, ('topic', 'shared', 'global')))
        )
    lib.pn_terminus_set_address(lib.pn_link_target(link), b'bench-consumer')
    lib.pn_link_open(link)
    lib.pn_link_flow(link, opts.credit)
    deadline = time.monotonic() + opts.timeout
    while lib.pn_link_state(link) & lib.PN_REMOTE_UNINIT:
        end.turn(0.05)
        if time.monotonic() > deadline:
            raise TimeoutError('attach not answered')
    ready[index] = 1
    seen: list[int] = []
    latencies: list[int] = []
    while not counts[-1] or sum(counts[:-1]) < opts.count:  # counts[-1]: producer finished
        if time.monotonic() > deadline:
            break
        for _, delivery in end.turn(0.05):
            if lib.pn_delivery_partial(delivery) or not lib.pn_delivery_readable(delivery):
                continue
            size = lib.pn_delivery_pending(delivery)
            data = bytearray(size)
            lib.pn_link_recv(link, ffi.from_buffer(data), size)
            lib.pn_link_advance(link)
            sequence, sent_ns = BODY.unpack_from(data, data.index(b'SHOALBEN') + 8)
            latencies.append(time.monotonic_ns() - sent_ns)
            seen.append(sequence)
            lib.pn_delivery_update(delivery, lib.PN_ACCEPTED)
            lib.pn_delivery_settle(delivery)
            counts[index] += 1
        if lib.pn_link_credit(link) < opts.credit // 2:
            lib.pn_link_flow(link, opts.credit - lib.pn_link_credit(link))
    lib.pn_link_close(link)
    lib.pn_connection_close(end.connection)
    end.flush()
    out.put((index, seen, latencies))


def produce(opts: Any, counts: Any) -> float:
    host, port = opts.replica[0].rsplit(':', 1)
    end = Endpoint(host, int(port))
    link = lib.pn_sender(end.session, b'bench-producer')
    lib.pn_terminus_set_address(lib.pn_link_target(link), opts.topic.encode())
    lib.pn_link_open(link)
    body = b'SHOALBEN' + bytes(BODY.size) + b'x' * (opts.size - 8 - BODY.size)
    # header (durable false), then a data section holding the body
    prefix = b'\x00\x53\x75\xb0' + len(body).to_bytes(4, 'big')
    sent = accepted = 0
    start = time.monotonic()
    deadline = start + opts.timeout
    while accepted < opts.count:
        if time.monotonic() > deadline:
            raise TimeoutError(f'producer: {accepted} of {opts.count} accepted')
        backlog = sent - sum(counts[:-1])
        while sent < opts.count and lib.pn_link_credit(link) > 0 and backlog < opts.max_backlog:
            payload = bytearray(prefix + body)
            BODY.pack_into(payload, len(prefix) + 8, sent, time.monotonic_ns())
            tag = sent.to_bytes(8, 'little')
            lib.pn_delivery(link, (8, ffi.from_buffer(tag)))
            lib.pn_link_send(link, ffi.from_buffer(payload), len(payload))
            lib.pn_link_advance(link)
            sent += 1
            backlog += 1
        for _, delivery in end.turn(0.01):
            state = lib.pn_delivery_remote_state(delivery)
            if state == lib.PN_ACCEPTED:
                accepted += 1
            elif state:
                raise RuntimeError(f'message refused (state {state})')
            lib.pn_delivery_settle(delivery)
    counts[-1] = 1
    return time.monotonic() - start


def cpu_seconds(pid: int) -> float:
    with open(f'/proc/{pid}/stat') as stat:
        fields = stat.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    parser.add_argument('--replica', action='append', required=True, help='HOST:PORT')
    parser.add_argument('--consumers', type=int, default=4)
    parser.add_argument('--count', type=int, default=30000)
    parser.add_argument('--size', type=int, default=1024)
    parser.add_argument('--credit', type=int, default=200)
    parser.add_argument('--max-backlog', type=int, default=1000)
    parser.add_argument('--timeout', type=float, default=180.0)
    parser.add_argument('--broker-pid', type=int, action='append', default=[])
    parser.add_argument('--label', default='shared durable subscription')
    parser.add_argument('--queue', action='store_true', help='a queue instead of the subscription')
    parser.add_argument('--json', help='append the result here as one JSON line')
    opts = parser.parse_args()
    if not all(r.startswith('127.') for r in opts.replica):
        raise SystemExit('loopback only')
    run = uuid.uuid4().hex[:8]
    opts.topic, opts.name = f'bench-shared-{run}', f'bench-{run}'
    counts = multiprocessing.sharedctypes.RawArray('q', opts.consumers + 1)
    ready = multiprocessing.sharedctypes.RawArray('q', opts.consumers)
    out: Any = multiprocessing.Queue()
    consumers = [
        multiprocessing.Process(target=consume, args=(opts, i, counts, ready, out))
        for i in range(opts.consumers)
    ]
    for process in consumers:
        process.start()
    while sum(ready) < opts.consumers:
        if any(p.exitcode is not None for p in consumers):
            raise SystemExit('a consumer failed to attach')
        time.sleep(0.05)
    cpu0 = [cpu_seconds(pid) for pid in opts.broker_pid]
    elapsed = produce(opts, counts)
    results = [out.get(timeout=opts.timeout) for _ in consumers]
    cpu = sum(cpu_seconds(pid) - c for pid, c in zip(opts.broker_pid, cpu0, strict=True))
    for process in consumers:
        process.join(10)
    seen = [s for _, s_list, _ in results for s in s_list]
    latencies = sorted(ns for _, _, lat in results for ns in lat)
    duplicates = len(seen) - len(set(seen))
    missing = opts.count - len(set(seen))
    per_consumer = [len(s) for _, s, _ in sorted(results)]
    p50 = statistics.median(latencies) / 1e6 if latencies else float('nan')
    p99 = latencies[int(0.99 * (len(latencies) - 1))] / 1e6 if latencies else float('nan')
    print(
        f'{opts.label}: {opts.count / elapsed:.0f} msg/s, p50 {p50:.2f} ms, p99 {p99:.2f} ms, '
        f'per consumer {per_consumer} over {len(opts.replica)} replicas, duplicates {duplicates}, '
        f'missing {missing}, brokers {1e6 * cpu / opts.count:.0f} µs/msg (all replicas)'
    )
    if opts.json:
        with open(opts.json, 'a') as out_file:
            out_file.write(json.dumps({
                'label': opts.label, 'msg_per_s': round(opts.count / elapsed), 'p50_ms': p50,
                'p99_ms': p99, 'per_consumer': per_consumer, 'replicas': len(opts.replica),
                'duplicates': duplicates, 'missing': missing,
                'broker_us_per_msg': round(1e6 * cpu / opts.count, 1),
            }) + '\n')  # fmt: skip
    sys.exit(1 if missing or duplicates else 0)


if __name__ == '__main__':
    main()
