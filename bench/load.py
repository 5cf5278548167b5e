"""
Shoal's AMQP 1.0 load generator and latency meter: the client side of ``make bench``.

Why its own: a benchmark must be runnable from a clone, and the client must not be what is
measured. So each producer and consumer is one process driving python-qpid-proton's protocol
engine (``cproton_ffi``, the binding's C functions) from a plain ``select`` loop, without the
reactor's per-event Python objects: one process moves tens of thousands of 1 KiB messages a
second, well above what a broker on the same machine sustains.

A row (``run``) is one producer and ``--consumers`` consumers, each in its own forked process:

- competing consumers share one queue (each message to one of them), or with ``--fanout``
  every consumer receives every message (topic subscribers);
- at-least-once by default (the producer counts a message done when the broker *accepts* it,
  consumers accept each delivery), or ``--presettled`` (settled on send, both link ends ask for
  settled transfers);
- ``--max-backlog B`` closes the loop: the producer holds back while B messages are sent but not
  yet received (by the slowest subscriber in fan-out), so the row measures steady-state capacity
  and its latency is not queueing time; ``--rate R`` paces the producer at R msg/s instead (the
  latency rows); ``--durable`` marks messages durable and asks for durable termini;
- ``--addresses K`` spreads the row over K addresses (``<address>-0`` ... ``-<K-1>``): the
  producer has one link to each and sends to them in turn, every consumer has one link from each
  (load over many queues, for a store sharded by address).

Each body is ``--size`` bytes: a marker, the sequence number and the send time (CLOCK_MONOTONIC,
shared by the processes of one machine), then padding. Consumers record end-to-end latency and
count every sequence number, so a row reports missing and duplicated messages too. Reported per
repetition and as the median of ``--reps``: messages/s (messages in over first send to last
receive), deliveries/s (all consumers' receipts over the same span; differs in fan-out), latency
p50/p99/max, the CPU of every ``--broker-pid`` (µs per message and % of one core) and of the
clients. ``--json FILE`` appends one line per row; ``table FILE...`` prints them as markdown.

Bounds: every process stops after its messages or ``--timeout`` seconds, whichever comes first
(a row cut short is reported incomplete and the exit status is 1). Loopback hosts only.

usage: python bench/load.py run --port 5672 -a 'bench-{run}' -n 50000 --max-backlog 1000 --reps 3
       python bench/load.py table results.jsonl
"""

import argparse
import json
import multiprocessing
import os
import queue
import select
import socket
import statistics
import struct
import sys
import time
import uuid
from array import array
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi, lib
from proton import Message

MARK = b'\x8eSHOALBENCH\x01'
STAMP = struct.Struct('<QQ')  # sequence, send time in ns
ID_PLACEHOLDER = b'0' * 16
GROUP_PLACEHOLDER = b'g-------'
"""Patched per message with ``g<seq % groups>``, eight bytes (``--groups``)."""
TAG = struct.Struct('<Q')
TRACE_MARK = 'f' * 32
KEY_MARK = 'lvq-' + 'e' * 16
"""--last-value-key: the key property's value, its last 16 characters patched per message."""
"""The trace id of the template's ``traceparent``, overwritten per message."""
BATCH = 256  # most messages encoded per loop turn
HIGH_WATER = 1 << 20  # stop encoding while this many bytes wait for the socket
CREDIT = 1000  # each consumer's link credit
LINGER_S = 0.3  # a finished consumer stays so the broker sees its last dispositions
DURABLE_TERMINUS = 2  # terminus durability unsettled-state
ACCEPTED = lib.PN_ACCEPTED

Fields = dict[str, Any]


class Endpoint:
    """One TCP connection carrying one AMQP connection, one session and one link."""

    def __init__(
        self, host: str, port: int, name: str, *, buffer_bytes: int = 256 * 1024,
        connect_seconds: float = 10.0,
    ) -> None:  # fmt: skip
        """``buffer_bytes``: each of the input and output buffers (bench/matrix.py opens
        thousands of connections, with smaller ones)."""
        self.sock = socket.create_connection((host, port), timeout=connect_seconds)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.transport = lib.pn_transport()
        self.connection = lib.pn_connection()
        self.collector = lib.pn_collector()
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_connection_set_container(self.connection, name.encode())
        lib.pn_connection_set_hostname(self.connection, host.encode())
        lib.pn_sasl_allowed_mechs(lib.pn_sasl(self.transport), b'ANONYMOUS')
        lib.pn_transport_bind(self.transport, self.connection)
        lib.pn_connection_open(self.connection)
        self.session = lib.pn_session(self.connection)
        lib.pn_session_open(self.session)
        self.inbox = bytearray(buffer_bytes)
        self.inbox_ptr = ffi.from_buffer(self.inbox)
        self.outbox = bytearray(buffer_bytes)
        self.outbox_ptr = ffi.from_buffer(self.outbox)
        self.outbox_view = memoryview(self.outbox)
        self.error = ''
        self.opened = 0  # links the broker has attached

    def pending(self) -> int:
        return int(lib.pn_transport_pending(self.transport))

    def flush(self) -> None:
        t = self.transport
        while (pending := lib.pn_transport_pending(t)) > 0:
            n = lib.pn_transport_peek(t, self.outbox_ptr, min(pending, len(self.outbox)))
            try:
                sent = self.sock.send(self.outbox_view[:n])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.error = f'send: {exc}'
                return
            lib.pn_transport_pop(t, sent)
            if sent < n:
                return

    def wait(self, timeout: float) -> None:
        """Flush, then wait up to ``timeout`` for input and push it into the engine."""
        self.flush()
        now = time.monotonic()
        due = lib.pn_transport_tick(self.transport, int(now * 1000))
        if due > 0:
            timeout = min(timeout, max(0.0, due / 1000 - now))
        writing = [self.sock] if self.pending() > 0 else []
        readable, _, _ = select.select([self.sock], writing, [], timeout)
        if not readable:
            return
        room = lib.pn_transport_capacity(self.transport)
        if room <= 0:
            return
        try:
            got = self.sock.recv_into(self.inbox, min(room, len(self.inbox)))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            got, self.error = 0, f'receive: {exc}'
        if got == 0:
            self.error = self.error or 'the broker closed the connection'
            lib.pn_transport_close_tail(self.transport)
            return
        lib.pn_transport_push(self.transport, self.inbox_ptr, got)

    def events(self, on_delivery: Callable[[Any], None]) -> None:
        """Hand each delivery event to ``on_delivery``; note the link opening and any close."""
        collector = self.collector
        while (event := lib.pn_collector_peek(collector)) != ffi.NULL:
            kind = lib.pn_event_type(event)
            if kind == lib.PN_DELIVERY:
                on_delivery(lib.pn_event_delivery(event))
            elif kind == lib.PN_LINK_REMOTE_OPEN:
                self.opened += 1
            elif kind in (lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH):
                self.error = self.error or 'the broker closed the link: ' + condition(
                    lib.pn_link_remote_condition(lib.pn_event_link(event))
                )
            elif kind in (lib.PN_CONNECTION_REMOTE_CLOSE, lib.PN_TRANSPORT_ERROR):
                self.error = self.error or 'the broker closed the connection'
            lib.pn_collector_pop(collector)

    def close(self) -> None:
        """Close the connection and give the broker a moment to see it; bounded to 2 s."""
        lib.pn_connection_close(self.connection)
        end = time.monotonic() + 2
        while self.pending() > 0 and not self.error and time.monotonic() < end:
            self.wait(0.05)
        self.sock.close()


def condition(cond: Any) -> str:
    if cond == ffi.NULL or not lib.pn_condition_is_set(cond):
        return 'no reason given'
    name = lib.pn_condition_get_name(cond)
    text = lib.pn_condition_get_description(cond)
    return ' '.join(ffi.string(p).decode() for p in (name, text) if p != ffi.NULL)


def terminus(term: Any, address: str, durable: bool) -> None:
    lib.pn_terminus_set_address(term, address.encode())
    if durable:
        lib.pn_terminus_set_durability(term, DURABLE_TERMINUS)
        lib.pn_terminus_set_expiry_policy(term, lib.PN_EXPIRE_NEVER)


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process (all its threads) has used so far."""
    with open(f'/proc/{pid}/stat') as stat:
        fields = stat.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


class Row:
    """What the processes of one repetition share: options, counters and signals."""

    def __init__(self, opts: argparse.Namespace, addresses: list[str]) -> None:
        ctx = multiprocessing.get_context('fork')
        self.opts, self.addresses = opts, addresses
        self.received = ctx.RawArray('q', opts.consumers)  # per consumer, for the closed loop
        self.go, self.stop = ctx.Event(), ctx.Event()
        self.results: Any = ctx.Queue()
        self.ctx = ctx

    def backlog(self, sent: int) -> int:
        got = min(self.received) if self.opts.fanout else sum(self.received)
        return sent - got


def produce(row: Row, ready: Any) -> None:
    out: Fields = {'role': 'producer', 'sent': 0, 'accepted': 0, 'error': ''}
    try:
        out.update(Producer(row).run(ready))
    except Exception as exc:  # reported, not raised: the parent must still hear from us
        out['error'] = f'producer: {exc!r}'
    out['cpu_s'] = time.process_time()
    row.results.put(out)


def consume(row: Row, index: int, ready: Any) -> None:
    out: Fields = {'role': 'consumer', 'index': index, 'received': 0, 'error': ''}
    try:
        out.update(Consumer(row, index).run(ready))
    except Exception as exc:
        out['error'] = f'consumer {index}: {exc!r}'
    out['cpu_s'] = time.process_time()
    row.results.put(out)


class Producer:
    """Sends ``count`` messages as credit, the closed loop's backlog and the rate allow."""

    def __init__(self, row: Row) -> None:
        opts = self.opts = row.opts
        self.row = row
        self.end = Endpoint(opts.host, opts.port, f'shoal-bench-producer-{os.getpid()}')
        self.links = []
        settle_mode = lib.PN_SND_SETTLED if opts.presettled else lib.PN_SND_UNSETTLED
        for i, address in enumerate(row.addresses):
            name = 'shoal-bench-producer' + (f'-{i}' if i else '')
            link = lib.pn_sender(self.end.session, name.encode())
            terminus(lib.pn_link_target(link), address, opts.durable)
            lib.pn_terminus_set_address(lib.pn_link_source(link), b'shoal-bench')
            lib.pn_link_set_snd_settle_mode(link, settle_mode)
            lib.pn_link_open(link)
            self.links.append(link)
        # --traceparent: a sampled W3C context per message, its trace id made afresh on each send
        properties = {'traceparent': f'00-{TRACE_MARK}-{"1" * 16}-01'} if opts.traceparent else None
        if opts.last_value_key:  # a last-value queue's key, one per message: nothing replaced
            properties = {**(properties or {}), '_AMQ_LVQ_NAME': KEY_MARK}
        template = Message(
            body=MARK + bytes(STAMP.size), durable=opts.durable, properties=properties
        )
        template.body += b'.' * (opts.size - len(template.body))
        template.inferred = True  # bytes as a data section
        if opts.priorities:  # priorities 0 .. P-1 in turn: the header's byte patched per message
            template.priority = 7
        if opts.groups:  # a message group per message, g<seq % N>, patched in place
            template.group_id = GROUP_PLACEHOLDER.decode()
        if opts.message_ids:  # as Qpid JMS's: ID:<uuid>:1:1:1-<seq>, the sequence patched in place
            template.id = f'ID:{uuid.uuid4()}:1:1:1-{ID_PLACEHOLDER.decode()}'
        self.payload = bytearray(template.encode())
        self.at = self.payload.index(MARK) + len(MARK)
        self.id_at = self.payload.index(ID_PLACEHOLDER) if opts.message_ids else -1
        self.trace_at = self.payload.index(TRACE_MARK.encode()) if opts.traceparent else -1
        self.key_at = self.payload.index(KEY_MARK.encode()) + 4 if opts.last_value_key else -1
        self.group_at = self.payload.index(GROUP_PLACEHOLDER) if opts.groups else -1
        self.priority_at = (
            self.payload.index(b'\x50\x07', self.payload.index(b'\x00\x53\x70')) + 1
            if opts.priorities
            else -1
        )
        self.payload_ptr = ffi.from_buffer(self.payload)
        self.tag = bytearray(8)
        self.tag_arg = (8, ffi.from_buffer(self.tag))
        self.sent = self.accepted = self.refused = 0
        self.first_ns = self.last_send_ns = self.start_ns = 0

    def on_delivery(self, delivery: Any) -> None:
        if not lib.pn_delivery_updated(delivery):
            return
        outcome = lib.pn_delivery_remote_state(delivery)
        if outcome == lib.PN_ACCEPTED:
            self.accepted += 1
        elif outcome in (lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED):
            self.refused += 1
        else:
            return
        lib.pn_delivery_settle(delivery)

    def room(self) -> int:
        """How many messages may go out now."""
        opts = self.opts
        if self.sent >= opts.count or self.end.pending() > HIGH_WATER:
            return 0
        room = min(self.credit(), opts.count - self.sent, BATCH)
        if opts.rate:
            due = int((time.monotonic_ns() - self.start_ns) * opts.rate / 1e9) + 1
            room = min(room, due - self.sent)
        if opts.max_backlog:
            room = min(room, opts.max_backlog - self.row.backlog(self.sent))
        return room

    def credit(self) -> int:
        """Messages that may go out on credit: message ``seq`` goes to link ``seq % K``, so
        ``K`` times the smallest link credit never overruns a link."""
        links = self.links
        if len(links) == 1:
            return int(lib.pn_link_credit(links[0]))
        return len(links) * min(int(lib.pn_link_credit(link)) for link in links)

    def send(self, room: int) -> None:
        # the per-message loop: names bound locally, the tag and stamp packed in place
        links, spread, payload, payload_ptr, size, at = (
            self.links,
            len(self.links),
            self.payload,
            self.payload_ptr,
            len(self.payload),
            self.at,
        )
        tag, tag_arg, presettled = self.tag, self.tag_arg, self.opts.presettled
        new, write, advance, settle = (
            lib.pn_delivery,
            lib.pn_link_send,
            lib.pn_link_advance,
            lib.pn_delivery_settle,
        )
        stamp, pack_tag, clock = STAMP.pack_into, TAG.pack_into, time.monotonic_ns
        trace_at, key_at = self.trace_at, self.key_at
        priority_at, levels = self.priority_at, self.opts.priorities
        group_at, groups = self.group_at, self.opts.groups
        self.first_ns = self.first_ns or clock()
        id_at, id_end = self.id_at, self.id_at + len(ID_PLACEHOLDER)
        for seq in range(self.sent, self.sent + room):
            link = links[seq % spread]
            pack_tag(tag, 0, seq)
            delivery = new(link, tag_arg)
            stamp(payload, at, seq, clock())
            if id_at >= 0:
                payload[id_at:id_end] = b'%016d' % seq
            if trace_at >= 0:
                payload[trace_at : trace_at + 32] = os.urandom(16).hex().encode()
            if key_at >= 0:
                payload[key_at : key_at + 16] = b'%016d' % seq
            if priority_at >= 0:
                payload[priority_at] = seq % levels
            if group_at >= 0:
                payload[group_at : group_at + 8] = b'g%07d' % (seq % groups)
            write(link, payload_ptr, size)
            advance(link)
            if presettled:
                settle(delivery)
        self.sent += room
        if self.sent >= self.opts.count:
            self.last_send_ns = clock()

    def pause(self) -> float:
        """How long to wait for the socket before trying to send again."""
        opts = self.opts
        if self.sent >= opts.count or self.credit() <= 0:
            return 0.05
        if opts.rate:
            return max(
                0.0, (self.start_ns + self.sent / opts.rate * 1e9 - time.monotonic_ns()) / 1e9
            )
        if opts.max_backlog and self.row.backlog(self.sent) >= opts.max_backlog:
            return 0.0005  # the consumers' counters move without any socket event
        return 0.0

    def finished(self) -> bool:
        if self.sent < self.opts.count:
            return False
        return self.opts.presettled or self.accepted + self.refused >= self.opts.count

    def run(self, ready: Any) -> Fields:
        end, opts = self.end, self.opts
        deadline = time.monotonic() + opts.timeout
        while end.opened < len(self.links) and not end.error and time.monotonic() < deadline:
            end.wait(0.05)
            end.events(self.on_delivery)
        ready.set()
        self.row.go.wait(max(0.0, deadline - time.monotonic()))
        self.start_ns = time.monotonic_ns()
        # presettled: stay connected until the consumers have everything (row.stop)
        while not end.error and not (self.finished() and self.row.stop.is_set()):
            if time.monotonic() >= deadline:
                end.error = f'timed out after {opts.timeout:.0f} s'
                break
            room = self.room()
            if room > 0:
                self.send(room)
            end.wait(self.pause())
            end.events(self.on_delivery)
        error = end.error
        end.close()
        return {
            'sent': self.sent,
            'accepted': self.accepted,
            'refused': self.refused,
            'first_send_ns': self.first_ns,
            'last_send_ns': self.last_send_ns,
            'error': error,
        }


class Consumer:
    """Receives, accepts (unless presettled) and records each message's latency and sequence."""

    def __init__(self, row: Row, index: int) -> None:
        opts = self.opts = row.opts
        self.row, self.index = row, index
        self.end = Endpoint(opts.host, opts.port, f'shoal-bench-consumer-{index}-{os.getpid()}')
        self.links = []
        for i, address in enumerate(row.addresses):
            name = f'shoal-bench-consumer-{index}' + (f'-{i}' if i else '')
            link = lib.pn_receiver(self.end.session, name.encode())
            terminus(lib.pn_link_source(link), address, opts.durable)
            if opts.presettled:
                lib.pn_link_set_snd_settle_mode(link, lib.PN_SND_SETTLED)
            lib.pn_link_open(link)
            lib.pn_link_flow(link, CREDIT)
            self.links.append(link)
        self.buffer = bytearray(max(65536, 2 * opts.size))
        self.buffer_ptr = ffi.from_buffer(self.buffer)
        self.filled = 0
        self.latencies = array('q')
        self.seen = bytearray(opts.count)
        self.got = self.first_ns = self.last_ns = 0

    def on_delivery(self, delivery: Any) -> None:
        if not lib.pn_delivery_readable(delivery):
            return
        link, size = lib.pn_delivery_link(delivery), lib.pn_delivery_pending(delivery)
        if self.filled + size > len(self.buffer):
            self.buffer = self.buffer + bytearray(self.filled + size)
            self.buffer_ptr = ffi.from_buffer(self.buffer)
        if size > 0:
            self.filled += max(0, lib.pn_link_recv(link, self.buffer_ptr + self.filled, size))
        if lib.pn_delivery_partial(delivery):
            return
        now = time.monotonic_ns()
        buffer, filled, self.filled = self.buffer, self.filled, 0
        where = buffer.find(MARK, 0, filled)
        if where >= 0:
            seq, sent_ns = STAMP.unpack_from(buffer, where + len(MARK))
            self.latencies.append(now - sent_ns)
            seen = self.seen
            if seq < len(seen) and seen[seq] < 255:
                seen[seq] += 1
        lib.pn_link_advance(link)
        if not lib.pn_delivery_settled(delivery):
            lib.pn_delivery_update(delivery, ACCEPTED)
        lib.pn_delivery_settle(delivery)
        self.got += 1
        self.first_ns = self.first_ns or now
        self.last_ns = now
        credit = lib.pn_link_credit(link)
        if credit < CREDIT // 2:
            lib.pn_link_flow(link, CREDIT - credit)

    def done(self) -> bool:
        received = self.row.received
        got = received[self.index] if self.opts.fanout else sum(received)
        return bool(got >= self.opts.count)

    def run(self, ready: Any) -> Fields:
        end = self.end
        deadline = time.monotonic() + self.opts.timeout
        finished_at = 0.0
        while not end.error:
            now = time.monotonic()
            if end.opened >= len(self.links):
                ready.set()
            if now >= deadline:
                end.error = f'timed out after {self.opts.timeout:.0f} s with {self.got} received'
                break
            if self.done():  # linger so the broker sees the last dispositions
                finished_at = finished_at or now
                if now - finished_at >= LINGER_S:
                    break
            end.wait(0.01 if finished_at else 0.05)
            end.events(self.on_delivery)
            self.row.received[self.index] = self.got
        error = end.error
        end.close()
        return {
            'received': self.got,
            'first_ns': self.first_ns,
            'last_ns': self.last_ns,
            'latencies': self.latencies.tobytes(),
            'seen': bytes(self.seen),
            'error': error,
        }


def percentile(ordered: list[int], p: float) -> float:
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] / 1e6


def attached(process: Any, ready: Any, limit: float) -> None:
    """Wait until ``process`` says its links are attached, it has ended (a link refused: its
    error is in the results) or ``limit`` has passed."""
    while not ready.wait(0.1) and process.is_alive() and time.monotonic() < limit:
        pass


def one_rep(opts: argparse.Namespace, rep: int, count: int) -> Fields:
    """Run producer and consumers once on a fresh address; return this repetition's figures."""
    token = f'{os.getpid()}-{rep}-{time.time_ns() % 10**9}'
    address = opts.address.replace('{run}', token)
    spread = opts.addresses
    addresses = [address] if spread == 1 else [f'{address}-{i}' for i in range(spread)]
    row = Row(argparse.Namespace(**{**vars(opts), 'count': count}), addresses)
    processes = []
    for index in range(opts.consumers):
        ready = row.ctx.Event()
        process = row.ctx.Process(target=consume, args=(row, index, ready), daemon=True)
        process.start()
        processes.append((process, ready))
    limit = time.monotonic() + opts.timeout + 20
    for process, ready in processes:
        attached(process, ready, limit)
    time.sleep(0.2)  # the broker has made the consumers' subscriptions before the first send
    ready = row.ctx.Event()
    producer = row.ctx.Process(target=produce, args=(row, ready), daemon=True)
    producer.start()
    attached(producer, ready, limit)
    brokers0 = [cpu_s(pid) for pid in opts.broker_pid]
    wall0 = time.monotonic()
    row.go.set()
    results: list[Fields] = []

    def heard(role: str) -> int:
        return sum(r['role'] == role for r in results)

    def collect(enough: Callable[[], bool]) -> None:
        while not enough() and time.monotonic() < limit:
            try:
                results.append(row.results.get(timeout=max(0.1, limit - time.monotonic())))
            except queue.Empty:
                return

    # the consumers report when they have everything; a failed producer reports early
    collect(lambda: heard('consumer') == opts.consumers or heard('producer') > 0)
    row.stop.set()  # the producer (presettled: still connected) may now leave
    collect(lambda: heard('producer') > 0)
    if heard('consumer') < opts.consumers:  # the producer failed: hear the rest out briefly
        limit = min(limit, time.monotonic() + 5)
        collect(lambda: heard('consumer') == opts.consumers)
    wall = time.monotonic() - wall0
    broker_s = sum(cpu_s(pid) - c for pid, c in zip(opts.broker_pid, brokers0, strict=True))
    for process, _ in [*processes, (producer, None)]:
        process.join(max(0.1, limit - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(2)
    return figures(row, rep, count, results, wall, broker_s if opts.broker_pid else None)


def figures(
    row: Row, rep: int, count: int, results: list[Fields], wall: float, broker_s: float | None
) -> Fields:
    opts = row.opts
    producer = next((r for r in results if r['role'] == 'producer'), {'error': 'no producer'})
    consumers = [r for r in results if r['role'] == 'consumer']
    errors = sorted({r['error'] for r in results if r.get('error')})
    if len(consumers) < opts.consumers:
        errors.append(f'{opts.consumers - len(consumers)} consumer(s) never reported')
    latencies = array('q')
    seen: list[bytes] = []
    for r in consumers:
        latencies.frombytes(r.get('latencies', b''))
        seen.append(r.get('seen', b''))
    if opts.fanout:  # every subscriber should see every message once
        missing = sum(s.count(0) for s in seen) + count * (opts.consumers - len(seen))
        duplicates = sum(len(s) - s.count(0) - s.count(1) for s in seen)
    else:  # every message reaches exactly one consumer
        totals = [sum(column) for column in zip(*seen, strict=True)] if seen else [0] * count
        missing = totals.count(0)
        duplicates = sum(t - 1 for t in totals if t > 1)
    deliveries = sum(r.get('received', 0) for r in consumers)
    first = producer.get('first_send_ns') or 0
    last = max((r.get('last_ns') or 0 for r in consumers), default=0)
    span = (last - first) / 1e9 if first and last > first else 0.0
    ordered = sorted(latencies)
    expected = count * (opts.consumers if opts.fanout else 1)
    out: Fields = {
        'label': opts.label,
        'rep': rep,
        'addresses': row.addresses,
        'count': count,
        'size': opts.size,
        'consumers': opts.consumers,
        'fanout': opts.fanout,
        'presettled': opts.presettled,
        'durable': opts.durable,
        'rate': opts.rate,
        'max_backlog': opts.max_backlog,
        'sent': producer.get('sent', 0),
        'accepted': producer.get('accepted', 0),
        'deliveries': deliveries,
        'missing': missing,
        'duplicates': duplicates,
        'errors': errors,
        'span_s': span,
        'wall_s': wall,
        'msgs_per_s': count / span if span and (deliveries >= expected) else None,
        'deliveries_per_s': deliveries / span if span else None,
        'p50_ms': percentile(ordered, 50) if ordered else None,
        'p99_ms': percentile(ordered, 99) if ordered else None,
        'max_ms': ordered[-1] / 1e6 if ordered else None,
        'client_cpu_s': sum(r.get('cpu_s', 0.0) for r in results),
        'broker_cpu_s': broker_s,
        'broker_us_per_msg': 1e6 * broker_s / count if broker_s is not None else None,
        'broker_cpu_pct': 100 * broker_s / wall if broker_s is not None and wall else None,
    }
    out['client_cpu_pct'] = 100 * out['client_cpu_s'] / wall if wall else None
    out['complete'] = not errors and not missing and deliveries >= expected
    return out


def show(r: Fields) -> str:
    def num(key: str, spec: str = ',.0f') -> str:
        return '-' if r.get(key) is None else format(r[key], spec)

    text = (
        f'{r["label"]} rep {r["rep"]}: {num("msgs_per_s")} msg/s, {num("deliveries_per_s")} '
        f'deliveries/s, p50 {num("p50_ms", ".2f")} ms, p99 {num("p99_ms", ".2f")} ms, '
        f'max {num("max_ms", ".1f")} ms, broker {num("broker_us_per_msg")} µs/msg '
        f'({num("broker_cpu_pct")} % of a core), clients {r["client_cpu_s"]:.1f} CPU s'
    )
    if r.get('missing') or r.get('duplicates'):
        text += f', missing {r["missing"]}, duplicates {r["duplicates"]}'
    if r['errors']:
        text += ', INCOMPLETE: ' + '; '.join(r['errors'])
    return text


MEDIAN_KEYS = (
    'msgs_per_s',
    'deliveries_per_s',
    'p50_ms',
    'p99_ms',
    'max_ms',
    'broker_us_per_msg',
    'broker_cpu_pct',
    'client_cpu_pct',
)


def run(opts: argparse.Namespace) -> int:
    if opts.warmup:
        print(show(one_rep(argparse.Namespace(**{**vars(opts), 'rate': 0}), 0, opts.warmup)))
    reps = []
    for rep in range(1, opts.reps + 1):
        reps.append(one_rep(opts, rep, opts.count))
        print(show(reps[-1]), flush=True)
    median: Fields = {'label': opts.label, 'rep': 'median', 'client_cpu_s': 0.0, 'errors': []}
    for key in MEDIAN_KEYS:
        values = [r[key] for r in reps if r.get(key) is not None]
        median[key] = statistics.median(values) if values else None
    median['complete_reps'] = sum(r['complete'] for r in reps)
    median['client_cpu_s'] = statistics.median(r['client_cpu_s'] for r in reps)
    print(show(median) + f' ({median["complete_reps"]} of {len(reps)} complete)', flush=True)
    if opts.json:
        with open(opts.json, 'a') as out:
            out.write(json.dumps({'median': median, 'reps': reps}) + '\n')
    return 0 if median['complete_reps'] == len(reps) else 1


def table(paths: list[str]) -> int:
    print('| row | messages | msg/s | deliveries/s | p50 ms | p99 ms | broker µs/msg | complete |')
    print('|---|---|---|---|---|---|---|---|')
    for path in paths:
        with open(path) as lines:
            for line in filter(str.strip, lines):
                record = json.loads(line)
                m, first = record['median'], record['reps'][0]

                def num(key: str, spec: str = ',.0f', m: Fields = m) -> str:
                    return '-' if m.get(key) is None else format(m[key], spec)

                cells = [
                    m['label'],
                    f'{first["count"]:,} x {first["size"]} B',
                    num('msgs_per_s'),
                    num('deliveries_per_s'),
                    num('p50_ms', '.2f'),
                    num('p99_ms', '.2f'),
                    num('broker_us_per_msg'),
                    f'{m["complete_reps"]}/{len(record["reps"])}',
                ]
                print('| ' + ' | '.join(cells) + ' |')
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or '').strip().split('\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('run', help='one row: a producer and its consumers, --reps times')
    p.add_argument('--host', default='127.0.0.1', help='broker host (loopback only)')
    p.add_argument('--port', type=int, default=5672)
    p.add_argument('-a', '--address', default='bench-{run}', help='{run}: fresh per repetition')
    p.add_argument('-n', '--count', type=int, default=10000, help='messages per repetition')
    p.add_argument('-s', '--size', type=int, default=1024, help='body bytes')
    p.add_argument('-k', '--consumers', type=int, default=1)
    p.add_argument('--addresses', type=int, default=1, help='spread over this many addresses')
    p.add_argument('--fanout', action='store_true', help='every consumer receives every message')
    p.add_argument('--presettled', action='store_true', help='at-most-once, settled on send')
    p.add_argument('--durable', action='store_true', help='durable messages and termini')
    p.add_argument('--message-ids', action='store_true', help='a message-id per message')
    p.add_argument(
        '--traceparent', action='store_true', help='a sampled W3C traceparent on every message'
    )
    p.add_argument(
        '--last-value-key',
        action='store_true',
        help='an _AMQ_LVQ_NAME per message (a distinct key each: a last-value queue replaces none)',
    )
    p.add_argument(
        '--priorities',
        type=int,
        default=0,
        help='send JMS priorities 0 .. N-1 in turn (header.priority; 0: no header priority)',
    )
    p.add_argument(
        '--groups',
        type=int,
        default=0,
        help='a message group (group-id, JMSXGroupID) per message, N groups in turn; 0: none',
    )
    p.add_argument('--max-backlog', type=int, default=0, help='closed loop bound, 0: open loop')
    p.add_argument('--rate', type=float, default=0, help='msg/s, 0: as fast as allowed')
    p.add_argument('--reps', type=int, default=1, help='repetitions (the median is reported)')
    p.add_argument('--warmup', type=int, default=0, help='messages of one discarded first run')
    p.add_argument('--timeout', type=float, default=120, help='seconds per process and rep')
    p.add_argument('--broker-pid', type=int, action='append', default=[], help='repeatable')
    p.add_argument('--label', default='run')
    p.add_argument('--json', help='append this row (reps and median) as one JSON line')
    t = sub.add_parser('table', help='markdown table of rows saved by run --json')
    t.add_argument('files', nargs='+')
    opts = parser.parse_args(argv)
    if opts.command == 'table':
        return table(opts.files)
    if not opts.host.startswith('127.') and opts.host != 'localhost':
        parser.error('loopback hosts only')
    if opts.size < len(MARK) + STAMP.size + 16 or opts.count < 1 or opts.timeout <= 0:
        parser.error('--size >= 48, --count >= 1 and --timeout > 0')
    if opts.addresses < 1:
        parser.error('--addresses >= 1')
    return run(opts)


if __name__ == '__main__':
    sys.exit(main())
