"""
The clients of the scale matrix (bench/matrix.sh) that bench/load.py's one-link-per-process
shape cannot drive: a topic with hundreds of subscriptions on one connection, a deep backlog
built with no consumer and then drained, and thousands of connections each sending a few
messages a second. Same style as load.py: python-qpid-proton's engine through its cffi C API,
plain sockets, no reactor. Every run is bounded in messages and seconds; loopback hosts only.

Each subcommand prints one JSON line (``--json FILE`` appends it there too):

- ``fanout``: ``--subs S`` consumer links on one topic in ``--workers`` processes (plain, or
  ``--shared``: S JMS shared durable subscriptions attached as Qpid JMS does), one producer.
  First ``--held M`` messages are published while no link has credit (memory per published
  message: Redis ``used_memory`` with ``--redis-port``, the RSS of every ``--broker-pid``), then
  credit is given and the backlog drained (drain deliveries/s), then ``-n N`` messages go through
  a closed loop (at most ``--max-backlog`` messages published and not yet delivered to every
  subscription): deliveries/s, and p99 latency.
- ``backlog``: ``-n N`` messages of ``--size`` bytes published at-least-once with no consumer
  (publish rate), memory read, then one consumer drains them (drain rate).
- ``conns``: ``--conns C`` connections in ``--workers`` processes, each with a sender and a
  receiver on its own queue, each sending ``--rate`` msg/s for ``--seconds``: p50/p99 latency,
  the brokers' RSS and CPU over the measured span.

usage: python bench/matrix.py fanout --port P --subs 100 --held 1000 -n 5000 [--shared]
       python bench/matrix.py backlog --port P -n 200000
       python bench/matrix.py conns --port P --conns 2000 --rate 5 --seconds 30
"""

import argparse
import json
import multiprocessing
import queue
import selectors
import socket
import struct
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi, lib
from proton import UNDESCRIBED, Array, Data, symbol

from load import Endpoint, cpu_s

MARK = b'SHOALMX1'
STAMP = struct.Struct('<QQ')  # sequence, send time (CLOCK_MONOTONIC ns)
DURABLE_TERMINUS = 2
CREDIT = 200


def body_prefix(size: int) -> tuple[bytes, int]:
    """A message with no header and one data section of ``size`` bytes; where the stamp goes."""
    size = max(size, len(MARK) + STAMP.size)
    prefix = b'\x00\x53\x75\xb0' + size.to_bytes(4, 'big')
    return prefix + MARK + bytes(STAMP.size) + b'.' * (size - len(MARK) - STAMP.size), len(
        prefix
    ) + len(MARK)


class Conn(Endpoint):
    """One AMQP connection and session over a non-blocking socket, served by a ``Loop`` with
    many others: ``load.Endpoint`` with small buffers, read when the selector says so."""

    def __init__(self, port: int, name: str) -> None:
        super().__init__('127.0.0.1', port, f'{name}-{uuid.uuid4().hex[:8]}',
                         buffer_bytes=1 << 16, connect_seconds=30)  # fmt: skip

    def read(self) -> None:
        """Push what arrived into the engine, as much as it takes."""
        room = lib.pn_transport_capacity(self.transport)
        if room <= 0:
            self.error = self.error or 'transport closed'
            return
        try:
            got = self.sock.recv_into(self.inbox, min(room, len(self.inbox)))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.error = f'receive: {exc}'
            return
        if not got:
            self.error = self.error or 'the broker closed the connection'
            return
        lib.pn_transport_push(self.transport, self.inbox_ptr, got)

    def close(self) -> None:
        """Close without waiting: thousands close at once."""
        lib.pn_connection_close(self.connection)
        self.flush()
        self.sock.close()


class Loop:
    """A selector over many connections: read what arrived, dispatch, flush."""

    def __init__(self, conns: list[Conn], on_delivery: Callable[[Any], None]) -> None:
        self.conns, self.on_delivery = conns, on_delivery
        self.selector = selectors.DefaultSelector()
        for conn in conns:
            conn.flush()
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)

    def turn(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            conn: Conn = key.data
            conn.read()
            conn.events(self.on_delivery)
            conn.flush()

    def error(self) -> str:
        return next((c.error for c in self.conns if c.error), '')

    def attach(self, deadline: float, links: int) -> None:
        while sum(c.opened for c in self.conns) < links:
            if time.monotonic() > deadline or self.error():
                raise TimeoutError(f'attach: {self.error() or "not answered"}')
            self.turn(0.05)


def sender(conn: Conn, address: str, name: str) -> Any:
    link = lib.pn_sender(conn.session, name.encode())
    lib.pn_terminus_set_address(lib.pn_link_target(link), address.encode())
    lib.pn_terminus_set_address(lib.pn_link_source(link), b'shoal-matrix')
    lib.pn_link_open(link)
    return link


def receiver(conn: Conn, address: str, name: str, shared: bool = False) -> Any:
    link = lib.pn_receiver(conn.session, (f'{name}|global' if shared else name).encode())
    source = lib.pn_link_source(link)
    lib.pn_terminus_set_address(source, address.encode())
    if shared:  # a JMS shared durable subscription, attached the way Qpid JMS does
        lib.pn_terminus_set_durability(source, DURABLE_TERMINUS)
        lib.pn_terminus_set_expiry_policy(source, lib.PN_EXPIRE_NEVER)
        caps = Data(lib.pn_terminus_capabilities(source))
        caps.put_object(
            Array(UNDESCRIBED, Data.SYMBOL, *map(symbol, ('topic', 'shared', 'global')))
        )
    lib.pn_terminus_set_address(lib.pn_link_target(link), b'shoal-matrix')
    lib.pn_link_open(link)
    return link


class Receipts:
    """Accepts every delivery, records latency, keeps each link's credit topped up."""

    def __init__(self, counter: Any, slot: int, credit: bool = True, first: int = 0) -> None:
        self.counter, self.slot, self.credit = counter, slot, credit
        self.first = first
        """The first sequence number whose latency counts (the held ones waited for credit)."""
        self.latencies: list[int] = []
        self.buffer = bytearray(1 << 16)
        self.filled = 0

    def on_delivery(self, delivery: Any) -> None:
        if lib.pn_link_is_sender(lib.pn_delivery_link(delivery)):  # an outcome of our own send
            if lib.pn_delivery_updated(delivery):
                lib.pn_delivery_settle(delivery)
            return
        if not lib.pn_delivery_readable(delivery):
            return
        link, size = lib.pn_delivery_link(delivery), lib.pn_delivery_pending(delivery)
        if self.filled + size > len(self.buffer):
            self.buffer += bytearray(self.filled + size)
        if size > 0:
            got = lib.pn_link_recv(link, ffi.from_buffer(self.buffer) + self.filled, size)
            self.filled += max(0, got)
        if lib.pn_delivery_partial(delivery):
            return
        now = time.monotonic_ns()
        where = self.buffer.find(MARK, 0, self.filled)
        if where >= 0:
            seq, sent_ns = STAMP.unpack_from(self.buffer, where + len(MARK))
            if seq >= self.first:
                self.latencies.append(now - sent_ns)
        self.filled = 0
        lib.pn_link_advance(link)
        lib.pn_delivery_update(delivery, lib.PN_ACCEPTED)
        lib.pn_delivery_settle(delivery)
        self.counter[self.slot] += 1
        if self.credit and (credit := lib.pn_link_credit(link)) < CREDIT // 2:
            lib.pn_link_flow(link, CREDIT - credit)


def rss_kib(pid: int) -> int:
    with open(f'/proc/{pid}/status') as status:
        for line in status:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    return 0


def redis_memory(port: int) -> int:
    """Redis ``used_memory`` in bytes (0 without a port)."""
    if not port:
        return 0
    with socket.create_connection(('127.0.0.1', port), timeout=10) as sock:
        sock.sendall(b'INFO memory\r\n')
        data = b''
        while b'\r\n' not in data:  # the bulk reply's header: $<length>
            data += sock.recv(65536) or b'\r\n'
        head, _, body = data.partition(b'\r\n')
        length = int(head[1:]) if head.startswith(b'$') else 0
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    for line in body.decode().splitlines():
        if line.startswith('used_memory:'):
            return int(line.split(':')[1])
    return 0


def memory(opts: argparse.Namespace) -> dict[str, int]:
    return {'redis_bytes': redis_memory(opts.redis_port)} | {
        f'rss_kib_{pid}': rss_kib(pid) for pid in opts.broker_pid
    }


def _errors(out: Any) -> list[str]:
    """What the workers that gave up reported."""
    errors = []
    while True:
        try:
            errors.append(out.get(timeout=1)['error'])
        except queue.Empty:
            return errors


def percentile(values: list[int], q: float) -> float:
    if not values:
        return float('nan')
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] / 1e6


class Publisher:
    """One sender link: sends as credit and a caller's bound allow; counts accepts."""

    def __init__(self, port: int, address: str, size: int) -> None:
        self.conn = Conn(port, 'matrix-producer')
        self.link = sender(self.conn, address, 'matrix-producer')
        self.payload, self.at = body_prefix(size)
        self.buffer = bytearray(self.payload)
        self.sent = self.accepted = self.refused = 0
        self.loop = Loop([self.conn], self.on_delivery)

    def on_delivery(self, delivery: Any) -> None:
        if not lib.pn_delivery_updated(delivery):
            return
        if lib.pn_delivery_remote_state(delivery) == lib.PN_ACCEPTED:
            self.accepted += 1
        else:
            self.refused += 1
        lib.pn_delivery_settle(delivery)

    def send(self, room: int) -> None:
        link, buffer, at = self.link, self.buffer, self.at
        room = min(room, lib.pn_link_credit(link), 256)
        for seq in range(self.sent, self.sent + room):
            STAMP.pack_into(buffer, at, seq, time.monotonic_ns())
            lib.pn_delivery(link, (8, ffi.from_buffer(seq.to_bytes(8, 'little'))))
            lib.pn_link_send(link, ffi.from_buffer(buffer), len(buffer))
            lib.pn_link_advance(link)
        self.sent += max(0, room)

    def until(self, count: int, bound: Callable[[], int], deadline: float) -> None:
        """Send up to ``count`` in all, and wait for their outcomes."""
        while self.accepted + self.refused < count:
            if time.monotonic() > deadline or self.conn.error:
                raise TimeoutError(f'producer: {self.accepted} accepted, {self.conn.error}')
            if self.sent < count:
                self.send(min(count - self.sent, bound()))
                self.conn.flush()
            self.loop.turn(0.001 if self.sent < count else 0.01)


def fanout_worker(opts: argparse.Namespace, first: int, last: int, counter: Any, go: Any,
                  stop: Any, out: Any) -> None:  # fmt: skip
    try:
        conn = Conn(opts.port, f'matrix-subscriber-{first}')
        run = opts.address.rsplit('/', 1)[-1]
        links = [
            receiver(conn, opts.address, f'{run}-sub-{i}', shared=opts.shared)
            for i in range(first, last)
        ]
        receipts = Receipts(counter, first // max(1, opts.subs // opts.workers), first=opts.held)
        loop = Loop([conn], receipts.on_delivery)
        deadline = time.monotonic() + opts.timeout
        loop.attach(deadline, len(links))
        counter[-1 - first // max(1, opts.subs // opts.workers)] = 1  # attached
        while not go.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError('never told to take messages')
            loop.turn(0.05)
        for link in links:
            lib.pn_link_flow(link, CREDIT)
        conn.flush()
        while not stop.is_set() and time.monotonic() < deadline and not conn.error:
            loop.turn(0.02)
        out.put({'latencies': receipts.latencies[-200000:], 'error': conn.error})
        conn.close()
    except Exception as exc:
        out.put({'latencies': [], 'error': repr(exc)})


def fanout(opts: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context('fork')
    stop = ctx.Event()
    try:
        return _fanout(opts, ctx, stop)
    finally:
        stop.set()  # the subscribers leave whatever happened here


def _fanout(opts: argparse.Namespace, ctx: Any, stop: Any) -> dict[str, Any]:
    workers = max(1, min(opts.workers, opts.subs))
    opts.workers = workers
    counter = ctx.RawArray('q', 2 * workers)  # deliveries per worker, then attached flags
    go, out = ctx.Event(), ctx.Queue()
    per = opts.subs // workers
    bounds = [(w * per, opts.subs if w == workers - 1 else (w + 1) * per) for w in range(workers)]
    procs = [
        ctx.Process(target=fanout_worker, args=(opts, a, b, counter, go, stop, out))
        for a, b in bounds
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + opts.timeout
    while sum(counter[workers:]) < workers:
        if time.monotonic() > deadline or any(p.exitcode is not None for p in procs):
            stop.set()
            raise SystemExit(f'the subscribers did not attach: {_errors(out)}')
        time.sleep(0.05)
    producer = Publisher(opts.port, opts.address, opts.size)
    producer.loop.attach(deadline, 1)
    before = memory(opts)
    producer.until(opts.held, lambda: 1 << 30, deadline)  # nobody has credit: all held
    time.sleep(1.0)  # the store's batches settle
    after = memory(opts)
    held_deliveries = opts.held * opts.subs
    t0 = time.monotonic()
    go.set()
    while sum(counter[:workers]) < held_deliveries:
        if time.monotonic() > deadline:
            stop.set()
            raise SystemExit(f'drain: {sum(counter[:workers])} of {held_deliveries} delivered')
        producer.loop.turn(0.005)
    drain_s = time.monotonic() - t0
    t1 = time.monotonic()
    total = opts.held + opts.count

    def room() -> int:  # closed loop: published and not yet delivered to every subscription
        delivered = sum(counter[:workers]) // opts.subs
        return opts.max_backlog - (producer.sent - delivered)

    producer.until(total, room, deadline)
    while sum(counter[:workers]) < total * opts.subs and time.monotonic() < deadline:
        producer.loop.turn(0.005)
    steady_s = time.monotonic() - t1
    delivered = sum(counter[:workers])
    stop.set()
    latencies: list[int] = []
    errors = []
    for _ in procs:
        got = out.get(timeout=30)
        latencies += got['latencies']
        if got['error']:
            errors.append(got['error'])
    for proc in procs:
        proc.join(10)
    producer.conn.close()
    result = {
        'row': 'fanout',
        'subs': opts.subs,
        'shared': opts.shared,
        'size': opts.size,
        'held': opts.held,
        'count': opts.count,
        'delivered': delivered,
        'expected': total * opts.subs,
        'drain_deliveries_per_s': round(held_deliveries / drain_s),
        'deliveries_per_s': round(opts.count * opts.subs / steady_s),
        'published_per_s': round(opts.count / steady_s),
        'p50_ms': percentile(latencies, 0.5),
        'p99_ms': percentile(latencies, 0.99),
        'redis_bytes_per_held_message': round(
            (after['redis_bytes'] - before['redis_bytes']) / opts.held
        ),
        'rss_kib_per_held_message': {
            k: round((after[k] - before[k]) / opts.held, 3) for k in after if k.startswith('rss')
        },
        'errors': errors,
    }
    return result


def backlog(opts: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + opts.timeout
    producer = Publisher(opts.port, opts.address, opts.size)
    producer.loop.attach(deadline, 1)
    before = memory(opts)
    t0 = time.monotonic()
    producer.until(opts.count, lambda: 1 << 30, deadline)
    publish_s = time.monotonic() - t0
    time.sleep(1.0)
    after = memory(opts)
    producer.conn.close()
    counter = [0]
    conn = Conn(opts.port, 'matrix-drain')
    link = receiver(conn, opts.address, 'matrix-drain')
    receipts = Receipts(counter, 0, credit=False)
    loop = Loop([conn], receipts.on_delivery)
    loop.attach(deadline, 1)
    lib.pn_link_flow(link, opts.credit)
    conn.flush()
    t1 = time.monotonic()
    while counter[0] < opts.count:
        if time.monotonic() > deadline or conn.error:
            raise SystemExit(f'drain: {counter[0]} of {opts.count}, {conn.error}')
        loop.turn(0.01)
        if (credit := lib.pn_link_credit(link)) < opts.credit // 2:
            lib.pn_link_flow(link, opts.credit - credit)
            conn.flush()
    drain_s = time.monotonic() - t1
    final = memory(opts)
    conn.close()
    return {
        'row': 'backlog',
        'count': opts.count,
        'size': opts.size,
        'accepted': producer.accepted,
        'publish_per_s': round(opts.count / publish_s),
        'drain_per_s': round(opts.count / drain_s),
        'redis_bytes_per_message': round(
            (after['redis_bytes'] - before['redis_bytes']) / opts.count
        ),
        'rss_kib_full': {k: v for k, v in after.items() if k.startswith('rss')},
        'rss_kib_drained': {k: v for k, v in final.items() if k.startswith('rss')},
    }


def conns_worker(opts: argparse.Namespace, index: int, first: int, last: int, ready: Any,
                 go: Any, out: Any) -> None:  # fmt: skip
    try:
        counter = [0]
        receipts = Receipts(counter, 0)
        conns, senders = [], []
        for i in range(first, last):
            conn = Conn(opts.port, f'matrix-conn-{i}')
            address = f'{opts.address}-{i}'
            senders.append(sender(conn, address, f'matrix-snd-{i}'))
            lib.pn_link_flow(receiver(conn, address, f'matrix-rcv-{i}'), 20)
            conns.append(conn)
        loop = Loop(conns, receipts.on_delivery)
        deadline = time.monotonic() + opts.timeout
        loop.attach(deadline, 2 * len(conns))
        ready[index] = 1
        go.wait(max(0.0, deadline - time.monotonic()))
        payload, at = body_prefix(opts.size)
        buffer = bytearray(payload)
        period = 1.0 / opts.rate
        start = time.monotonic()
        end = start + opts.seconds
        n = len(conns)
        # each connection sends every `period`, the connections spread evenly over it
        due = [start + period * k / n for k in range(n)]
        sent = seq = 0
        while time.monotonic() < end and not loop.error():
            now = time.monotonic()
            for k in range(n):
                if due[k] <= now:
                    link = senders[k]
                    if lib.pn_link_credit(link) > 0:
                        STAMP.pack_into(buffer, at, seq, time.monotonic_ns())
                        lib.pn_delivery(link, (8, ffi.from_buffer(seq.to_bytes(8, 'little'))))
                        lib.pn_link_send(link, ffi.from_buffer(buffer), len(buffer))
                        lib.pn_link_advance(link)
                        conns[k].flush()
                        sent += 1
                        seq += 1
                    due[k] += period
            loop.turn(max(0.0, min(due) - time.monotonic()))
        tail = time.monotonic() + 2.0  # what is in flight arrives
        while counter[0] < sent and time.monotonic() < tail:
            loop.turn(0.01)
        out.put({'sent': sent, 'received': counter[0], 'latencies': receipts.latencies,
                 'error': loop.error()})  # fmt: skip
        for conn in conns:
            conn.close()
    except Exception as exc:
        out.put({'sent': 0, 'received': 0, 'latencies': [], 'error': repr(exc)})


def conns(opts: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context('fork')
    workers = max(1, min(opts.workers, opts.conns))
    ready = ctx.RawArray('q', workers)
    go, out = ctx.Event(), ctx.Queue()
    per = opts.conns // workers
    procs = []
    for w in range(workers):
        last = opts.conns if w == workers - 1 else (w + 1) * per
        procs.append(
            ctx.Process(target=conns_worker, args=(opts, w, w * per, last, ready, go, out))
        )
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + opts.timeout
    while sum(ready) < workers:
        if time.monotonic() > deadline or any(p.exitcode is not None for p in procs):
            go.set()
            raise SystemExit(f'the connections did not attach: {_errors(out)}')
        time.sleep(0.1)
    attached = memory(opts)
    cpu0 = {pid: cpu_s(pid) for pid in opts.broker_pid}
    t0 = time.monotonic()
    go.set()
    time.sleep(opts.seconds / 2)
    during = memory(opts)
    results = [out.get(timeout=opts.seconds + opts.timeout) for _ in procs]
    span = time.monotonic() - t0
    cpu = {pid: round(100 * (cpu_s(pid) - c) / span, 1) for pid, c in cpu0.items()}
    for proc in procs:
        proc.join(10)
    latencies = [ns for r in results for ns in r['latencies']]
    sent = sum(r['sent'] for r in results)
    return {
        'row': 'conns',
        'conns': opts.conns,
        'rate_per_conn': opts.rate,
        'seconds': opts.seconds,
        'sent': sent,
        'received': sum(r['received'] for r in results),
        'msg_per_s': round(sent / opts.seconds),
        'p50_ms': percentile(latencies, 0.5),
        'p99_ms': percentile(latencies, 0.99),
        'max_ms': percentile(latencies, 1.0),
        'rss_kib_attached': {k: v for k, v in attached.items() if k.startswith('rss')},
        'rss_kib_during': {k: v for k, v in during.items() if k.startswith('rss')},
        'redis_bytes_during': during['redis_bytes'],
        'cpu_pct_of_core': cpu,
        'errors': [r['error'] for r in results if r['error']],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    sub = parser.add_subparsers(dest='row', required=True)
    for name in ('fanout', 'backlog', 'conns'):
        p = sub.add_parser(name)
        p.add_argument('--port', type=int, required=True)
        p.add_argument('-a', '--address', default=f'matrix-{name}-{uuid.uuid4().hex[:8]}')
        p.add_argument('-n', '--count', type=int, default=5000)
        p.add_argument('-s', '--size', type=int, default=1024)
        p.add_argument('--timeout', type=float, default=300)
        p.add_argument('--workers', type=int, default=2)
        p.add_argument('--redis-port', type=int, default=0)
        p.add_argument('--broker-pid', type=int, action='append', default=[])
        p.add_argument('--label', default=name)
        p.add_argument('--json', help='append the result here as one JSON line')
        if name == 'fanout':
            p.add_argument('--subs', type=int, default=100)
            p.add_argument('--shared', action='store_true')
            p.add_argument('--held', type=int, default=1000)
            p.add_argument('--max-backlog', type=int, default=100)
        if name == 'backlog':
            p.add_argument('--credit', type=int, default=1000)
        if name == 'conns':
            p.add_argument('--conns', type=int, default=2000)
            p.add_argument('--rate', type=float, default=5.0)
            p.add_argument('--seconds', type=float, default=30.0)
    opts = parser.parse_args()
    run = {'fanout': fanout, 'backlog': backlog, 'conns': conns}[opts.row]
    result = {'label': opts.label} | run(opts)
    line = json.dumps(result)
    print(line)
    if opts.json:
        with open(opts.json, 'a') as f:
            f.write(line + '\n')
    bad = result.get('errors') or (
        result.get('delivered', 0) < result.get('expected', 0)
        or result.get('received', 0) < result.get('sent', 0)
    )
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
