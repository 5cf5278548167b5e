"""
The bytes between a socket and proton's engine (amqp/engine.py's ``take_output``, ``read_room``
and ``push_read``): all the output leaves in one piece, and a read into the engine's own buffer
gives the engine what a pushed one gives it. Two engines in one process, no socket.
"""

from collections.abc import Callable
from typing import Any

from proton import Connection, Delivery, Message, Transport

from shoal_broker.amqp import engine
from shoal_broker.amqp.engine import wire

BIG = 1024 * 1024
OLD_PIECE = 256 * 1024
"""What ``take_output`` took at a time before it took all there was."""


class Side:
    """One engine: a connection bound to a transport (no collector: the tests read its state)."""

    def __init__(self, *, server: bool, max_frame: int = 2 * BIG) -> None:
        self.transport = Transport(Transport.SERVER if server else Transport.CLIENT)
        self.transport.max_frame_size = max_frame
        self.connection = Connection()
        self.transport.bind(self.connection)

    @property
    def ptr(self) -> Any:
        return self.transport._impl


Move = Callable[[Side, Side], int]
"""Moves what one side has to write into the other; returns how many bytes moved."""


def by_proton(source: Side, target: Side) -> int:
    data = source.transport.peek(source.transport.pending() or 0) or b''
    source.transport.pop(len(data))
    feed(target, data)
    return len(data)


def feed(target: Side, data: bytes) -> None:
    while data:
        room = target.transport.capacity()
        target.transport.push(data[:room])
        data = data[room:]


def pump(a: Side, b: Side, move: Move, until: Callable[[], bool]) -> None:
    for _ in range(1000):
        if until():
            return
        if not move(a, b) + move(b, a) and not until():
            break
    raise AssertionError('the engines stopped before the condition held')


def opened_pair(move: Move, server_frame: int = 2 * BIG) -> tuple[Side, Side, Any, Any]:
    """A client sending on one link and a server receiving on it with credit for one message,
    taking frames of up to ``server_frame`` bytes."""
    client, server = Side(server=False), Side(server=True, max_frame=server_frame)
    client.connection.open()
    session = client.connection.session()
    session.open()
    sender = session.sender('big')
    sender.open()
    pump(client, server, move, lambda: server.connection.link_head(0) is not None)
    server.connection.open()
    server_session = server.connection.session_head(0)
    server_session.open()
    receiver = server.connection.link_head(0)
    receiver.open()
    receiver.flow(1)
    pump(client, server, move, lambda: sender.credit == 1)
    return client, server, sender, receiver


def send_big(sender: Any, body: bytes) -> None:
    delivery = sender.delivery(str(id(body)).encode())
    sender.send(Message(body=body).encode())
    sender.advance()
    assert isinstance(delivery, Delivery)


def test_output_leaves_whole_as_the_engine_has_it_and_none_is_left() -> None:
    client, server, sender, receiver = opened_pair(by_proton)
    receiver.flow(1)
    pump(client, server, by_proton, lambda: sender.credit == 2)
    pieces = []
    for n in (1, 2):
        send_big(sender, bytes([n]) * BIG)
        sizes = []
        while (output := engine.take_output(client.ptr)) is not None:
            sizes.append(len(output))
        assert client.transport.pending() == 0
        assert sum(sizes) > BIG
        pieces.append(sizes)
    # the first grew proton's buffer as it went (doubling from 8 KiB); the second leaves in pieces
    # of that buffer, not of 256 KiB with the rest moved up after each
    assert len(pieces[1]) <= 2
    assert min(pieces[1]) > OLD_PIECE


def test_a_long_run_of_output_leaves_in_pieces_of_at_most_the_bound() -> None:
    # a peer that takes frames of any size, as one that sets no max-frame-size does
    client, server, sender, receiver = opened_pair(by_proton, server_frame=64 * BIG)
    receiver.flow(3)
    pump(client, server, by_proton, lambda: sender.credit == 4)
    for n in range(4):  # 8 MiB waiting at once, each message one frame
        send_big(sender, bytes([n]) * (2 * BIG))
    sizes = []
    while (output := engine.take_output(client.ptr)) is not None:
        sizes.append(len(output))
    assert sum(sizes) > 8 * BIG
    assert max(sizes) == engine.OUTPUT_MOST_BYTES
    assert client.transport.pending() == 0


def test_a_little_output_is_taken_as_it_is() -> None:
    client, _, sender, _ = opened_pair(by_proton)
    send_big(sender, b'small')
    output = engine.take_output(client.ptr)
    assert output is not None
    assert len(output) < 100
    assert engine.take_output(client.ptr) is None


def test_output_taken_is_the_engines_own_bytes() -> None:
    client, server, sender, receiver = opened_pair(by_proton)
    body = bytes(range(256)) * (BIG // 256)
    send_big(sender, body)
    while (output := engine.take_output(client.ptr)) is not None:
        feed(server, output)
    delivery = receiver.current
    assert delivery is not None
    assert not delivery.partial
    message = Message()
    message.decode(receiver.recv(delivery.pending))
    assert message.body == body


def in_place(source: Side, target: Side) -> int:
    """The broker's read: into the target engine's own buffer when it has room enough, else into
    the shared buffer and pushed; at most what one read would take."""
    pending = source.transport.pending() or 0
    if pending <= 0:
        return 0
    room = engine.read_room(target.ptr)
    if room is not None:
        size = min(pending, len(room))
        room[0:size] = source.transport.peek(size)
        wire.shoal_input_read(target.ptr, size)
        in_place.direct += size  # type: ignore[attr-defined]
    else:
        size = min(pending, engine.READ_BUFFER_BYTES)
        engine.READ_BUFFER[0:size] = source.transport.peek(size)
        engine.push_read(target.ptr, size)
    source.transport.pop(size)
    return size


in_place.direct = 0  # type: ignore[attr-defined]


def test_a_fresh_engine_is_read_through_the_shared_buffer() -> None:
    server = Side(server=True)
    assert server.transport.capacity() < engine.DIRECT_READ_BYTES
    assert engine.read_room(server.ptr) is None


def test_big_messages_read_into_the_engine_arrive_whole() -> None:
    client, server, sender, receiver = opened_pair(in_place)
    assert in_place.direct == 0  # type: ignore[attr-defined]  # small frames: the shared buffer
    receiver.flow(1)
    bodies = [bytes([n]) * BIG for n in (1, 2)]
    for body in bodies:
        before = in_place.direct  # type: ignore[attr-defined]
        send_big(sender, body)
        pump(
            client,
            server,
            in_place,
            lambda: receiver.current is not None and not receiver.current.partial,
        )
        message = Message()
        message.decode(receiver.recv(receiver.current.pending))
        receiver.advance()
        assert message.body == body
    # the first grew the engine's buffer on its way in; the second went mostly straight into it
    assert in_place.direct - before > BIG // 2  # type: ignore[attr-defined]


def test_a_read_into_the_engine_after_its_input_closed_is_refused_room() -> None:
    server = Side(server=True)
    server.transport.close_tail()
    assert engine.read_room(server.ptr) is None
    engine.READ_BUFFER[0:8] = b'AMQP\x00\x01\x00\x00'
    engine.push_read(server.ptr, 8)  # taken by nobody, and no error
    assert server.transport.capacity() < 0
