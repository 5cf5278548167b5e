"""Wire-level behaviour: the Open, heartbeats, deferred Open, and hostile bytes."""

import socket

import pytest
from amqpclient import connect, receive_all, receiver, sender
from enginepeer import EnginePeer, read_until_closed
from processes import BrokerProcess
from proton import Message

AMQP_HEADER = b'AMQP\x00\x01\x00\x00'
SASL_HEADER = b'AMQP\x03\x01\x00\x00'


def _still_serves(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='still here'))
    assert receive_all(receiver(conn, address, credit=1), 1)[0].body == 'still here'
    conn.close()


def test_the_open_offers_the_jms_capabilities(broker: BrokerProcess) -> None:
    peer = EnginePeer(broker.port)
    peer.connection.open()
    assert peer.pump(5, until=lambda: peer.remote_open)
    offered = {str(c) for c in peer.connection.remote_offered_capabilities}
    assert offered == {
        'SHARED-SUBS', 'ANONYMOUS-RELAY', 'DELAYED_DELIVERY', 'sole-connection-for-container'
    }  # fmt: skip
    assert peer.connection.remote_properties['product'] == 'shoal'
    peer.close()


def test_an_authenticated_transport_may_wait_without_open_past_the_idle_timeout(
    start_broker,
) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_IDLE_TIMEOUT_SECONDS': '1'})
    peer = EnginePeer(b.port)
    assert not peer.pump(3.0, until=lambda: peer.eof)  # SASL done, no Open: still connected
    peer.connection.open()
    assert peer.pump(5, until=lambda: peer.remote_open)
    peer.close()


def test_heartbeats_arrive_at_the_peers_requested_pace(broker: BrokerProcess) -> None:
    peer = EnginePeer(broker.port, idle_timeout=1.0)  # advertises 0.5 s: broker beats ≤ 0.25 s
    peer.connection.open()
    assert peer.pump(5, until=lambda: peer.remote_open)
    before = peer.transport.frames_input
    peer.pump(2.0)
    assert peer.transport.frames_input - before >= 4
    assert not peer.remote_closed
    peer.close()


def test_a_silent_peer_is_closed_after_the_idle_timeout(start_broker) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_IDLE_TIMEOUT_SECONDS': '1'})
    peer = EnginePeer(b.port)
    peer.connection.open()
    assert peer.pump(5, until=lambda: peer.remote_open)
    assert peer.pump(5, until=lambda: peer.remote_closed, tick=False)  # we never heartbeat
    assert peer.connection.remote_condition.name == 'amqp:resource-limit-exceeded'
    peer.close()


def test_garbage_instead_of_a_protocol_header_is_refused(
    broker: BrokerProcess, address: str
) -> None:
    with socket.create_connection(('127.0.0.1', broker.port)) as sock:
        sock.sendall(b'GET / HTTP/1.1\r\nHost: x\r\n\r\n')
        answer, closed = read_until_closed(sock, 5)
    assert closed
    assert answer.startswith(b'AMQP')  # the broker names the protocol it speaks, then hangs up
    _still_serves(broker, address)


@pytest.mark.parametrize(
    'body',
    [b'\x00\x53\xff\xff', b'\xff\xff\xff\xff', b'\x00\x53\x10\xd0\xff\xff\xff\xff'],
    ids=['unknown-performative', 'garbage', 'impossible-list-size'],
)
def test_a_malformed_frame_closes_the_connection(
    broker: BrokerProcess, address: str, body: bytes
) -> None:
    frame = (8 + len(body)).to_bytes(4, 'big') + b'\x02\x00\x00\x00' + body
    with socket.create_connection(('127.0.0.1', broker.port)) as sock:
        sock.sendall(AMQP_HEADER + frame)
        answer, closed = read_until_closed(sock, 5)
    assert closed
    assert answer.startswith(AMQP_HEADER)
    _still_serves(broker, address)


def test_a_frame_larger_than_max_frame_size_is_refused(broker: BrokerProcess, address: str) -> None:
    huge = (64 * 1024 * 1024).to_bytes(4, 'big') + b'\x02\x00\x00\x00'
    with socket.create_connection(('127.0.0.1', broker.port)) as sock:
        sock.sendall(AMQP_HEADER + huge + b'\x00' * 1024)
        answer, closed = read_until_closed(sock, 5)
    assert closed
    assert b'amqp:' in answer
    _still_serves(broker, address)


def test_a_truncated_sasl_exchange_does_not_disturb_others(
    broker: BrokerProcess, address: str
) -> None:
    with socket.create_connection(('127.0.0.1', broker.port)) as sock:
        sock.sendall(SASL_HEADER + b'\x00\x00\x00\x40\x02\x01')  # a frame cut short
        _still_serves(broker, address)


def test_max_frame_size_is_honoured_when_sending(broker: BrokerProcess, address: str) -> None:
    peer = EnginePeer(broker.port)
    peer.transport.max_frame_size = 4096
    peer.connection.open()
    assert peer.pump(5, until=lambda: peer.remote_open)
    assert peer.transport.remote_max_frame_size == 1024 * 1024
    peer.close()
    conn = connect(broker.url, max_frame_size=4096)
    body = b'y' * 50_000  # must arrive in 4 KiB frames
    sender(conn, address).send(Message(body=body))
    assert receive_all(receiver(conn, address, credit=1), 1)[0].body == body
    conn.close()


def test_several_sessions_on_one_connection_work_independently(
    broker: BrokerProcess, address: str
) -> None:
    peer = EnginePeer(broker.port)
    peer.connection.open()
    sessions = [peer.connection.session() for _ in range(3)]
    for session in sessions:
        session.open()
    sender_link = sessions[0].sender('s')
    sender_link.target.address = address
    receiver_link = sessions[2].receiver('r')
    receiver_link.source.address = address
    sender_link.open()
    receiver_link.open()
    receiver_link.flow(1)
    assert peer.pump(5, until=lambda: sender_link.credit > 0)
    delivery = sender_link.delivery('t1')
    sender_link.send(Message(body='across sessions').encode())
    sender_link.advance()
    sessions[1].close()  # ending an idle session disturbs nobody
    assert peer.pump(
        5, until=lambda: receiver_link.current is not None and not receiver_link.current.partial
    )
    received = Message()
    received.decode(receiver_link.recv(receiver_link.current.pending))
    assert received.body == 'across sessions'
    assert peer.pump(5, until=lambda: delivery.remote_state == delivery.ACCEPTED)
    peer.close()
