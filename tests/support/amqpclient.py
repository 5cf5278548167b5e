"""
Thin test helpers over proton's blocking client (a real AMQP 1.0 client, not a fake).

``BlockingConnection`` hides dispositions and raw bytes, so this adds: link options for
capabilities, dynamic nodes, copy distribution and settle modes; settling with any outcome; and a
raw receiver that keeps the exact bytes of each transfer.
"""

import time
import uuid
from collections.abc import Iterable
from typing import Any

from proton import Array, Data, Delivery, Link, Message, Terminus, Timeout, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

TIMEOUT = 10


class Capabilities(LinkOption):
    def __init__(self, *capabilities: str) -> None:
        self.capabilities = capabilities

    def apply(self, link: Link) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.capabilities.put_object(
            Array(Data.NULL, Data.SYMBOL, *[symbol(c) for c in self.capabilities])
        )


class DynamicTarget(LinkOption):
    """A JMS temporary-destination creator: a sender whose target the broker names."""

    def __init__(self, capability: str = 'temporary-queue') -> None:
        self.capability = capability

    def apply(self, link: Link) -> None:
        link.target.dynamic = True
        link.target.address = None
        Capabilities(self.capability).apply(link)


class Browse(LinkOption):
    def apply(self, link: Link) -> None:
        link.source.distribution_mode = Terminus.DIST_MODE_COPY
        link.snd_settle_mode = Link.SND_SETTLED


class Presettled(LinkOption):
    def apply(self, link: Link) -> None:
        link.snd_settle_mode = Link.SND_SETTLED


class Filter(LinkOption):
    def __init__(self, filters: dict[Any, Any]) -> None:
        self.filters = filters

    def apply(self, link: Link) -> None:
        link.source.filter.put_dict(self.filters)


def connect(url: str, **kwargs: Any) -> BlockingConnection:
    return BlockingConnection(url, timeout=TIMEOUT, **kwargs)


def _name(role: str) -> str:
    return f'{role}-{uuid.uuid4().hex[:12]}'


def sender(conn: BlockingConnection, address: str | None, *options: LinkOption) -> BlockingSender:
    return conn.create_sender(address, name=_name('sender'), options=list(options) or None)


def receiver(
    conn: BlockingConnection, address: str | None, *options: LinkOption, credit: int = 10,
    dynamic: bool = False,
) -> BlockingReceiver:  # fmt: skip
    return conn.create_receiver(
        address, credit=credit, dynamic=dynamic, name=_name('receiver'),
        options=list(options) or None,
    )  # fmt: skip


def settle(
    rcv: BlockingReceiver, state: int, *, failed: bool = False, undeliverable: bool = False
) -> None:
    """Settle the oldest received, unsettled message with any outcome."""
    delivery = rcv.fetcher.unsettled.popleft()
    if state == Delivery.MODIFIED:
        delivery.local.failed = failed
        delivery.local.undeliverable = undeliverable
    delivery.update(state)
    delivery.settle()


def send_all(
    conn: BlockingConnection, address: str, bodies: Iterable[Any], *options: LinkOption
) -> BlockingSender:
    """Send one message per body (each waits for its disposition); return the sender."""
    snd = sender(conn, address, *options)
    for body in bodies:
        snd.send(Message(body=body))
    return snd


def receive_all(rcv: BlockingReceiver, count: int, timeout: float = TIMEOUT) -> list[Message]:
    out = []
    for _ in range(count):
        out.append(rcv.receive(timeout=timeout))
        rcv.accept()
    flush(rcv.connection)
    return out


def flush(conn: BlockingConnection) -> None:
    """Write out what the blocking client has queued (it only does I/O while waiting).

    Its container turns until the transport has no output left, and no more: a turn with
    nothing to write waits in ``select`` for input or for the container's timeout (the
    connection's, seconds), which is shortened meanwhile as well."""
    transport = conn.conn.transport
    deadline = time.monotonic() + TIMEOUT
    saved, conn.container.timeout = conn.container.timeout, 0.05
    try:
        while transport.pending() > 0:
            assert time.monotonic() < deadline, f'output not written within {TIMEOUT}s'
            conn.container.process()
    finally:
        conn.container.timeout = saved


def nothing_more(rcv: BlockingReceiver, wait: float = 0.3) -> bool:
    """True when no message arrives within ``wait`` seconds."""
    try:
        rcv.receive(timeout=wait)
    except Exception:  # proton.utils Timeout
        return True
    return False


def drain(conn: BlockingConnection, rcv: BlockingReceiver, credit: int) -> float:
    """Drain with ``credit``; returns how long the broker took to answer."""
    start = time.monotonic()
    rcv.link.drain(credit)
    conn.wait(lambda: not rcv.link.draining(), timeout=TIMEOUT, msg='drain answer')
    return time.monotonic() - start


def take_all(
    conn: BlockingConnection, address: str, quiet: float, *, credit: int = 20, limit: float = 30.0
) -> list[Any]:
    """The bodies of every message of ``address``, accepted, until none comes for ``quiet``
    seconds (at most ``limit`` seconds in all): what a queue holds once nothing more is on its
    way."""
    rcv = receiver(conn, address, credit=credit)
    found: list[Any] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            message = rcv.receive(timeout=quiet)
        except Timeout:
            break
        found.append(message.body)
        rcv.accept()
    rcv.close()
    return found


class RawCollector:
    """A receiver handler that keeps each transfer's exact bytes and accepts it."""

    def __init__(self) -> None:
        self.transfers: list[bytes] = []
        self.link: Any = None

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if delivery.readable and not delivery.partial:
            self.transfers.append(bytes(event.link.recv(delivery.pending)))
            event.link.advance()
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()


def send_raw(conn: BlockingConnection, snd: BlockingSender, payload: bytes) -> int:
    """Send pre-encoded message bytes; return the remote outcome."""
    link = snd.link
    conn.wait(lambda: link.credit > 0, timeout=TIMEOUT, msg='credit')
    delivery = link.delivery(str(time.monotonic_ns()))
    link.send(payload)
    link.advance()
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='disposition')
    return int(delivery.remote_state)


def send_with_outcome(
    conn: BlockingConnection, snd: BlockingSender, message: Message
) -> tuple[int, str | None]:
    """Send one message; return its remote outcome and, if refused, the error condition."""
    link = snd.link
    conn.wait(lambda: link.credit > 0, timeout=TIMEOUT, msg='credit')
    delivery = link.delivery(str(time.monotonic_ns()))
    link.send(message.encode())
    link.advance()
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='disposition')
    condition = delivery.remote.condition
    return int(delivery.remote_state), condition.name if condition else None
