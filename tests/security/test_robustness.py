"""
Hostile and broken peers against a live broker: malformed and truncated frames at every stage
(protocol header, SASL, AMQP), slow-loris connections that never finish SASL or never send Open.
Each is closed within its timeout; none leaks a connection; a healthy client alongside carries on.
"""

import concurrent.futures
import random
import re
import socket
import time
from collections.abc import Iterator

import pytest
from amqpclient import connect, receive_all, receiver, send_all, send_raw, sender
from framesample import client_frames
from processes import LOOPBACK, BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message
from proton.utils import BlockingConnection
from saslwire import Wire, authenticate

SASL_TIMEOUT = 2
OPEN_TIMEOUT = 3
IDLE_TIMEOUT = 4
"""Bounds a peer that sent a valid Open and then stalls mid-frame."""
BOUND = 15
"""Seconds within which the broker must have closed a hostile connection (timeouts + slack)."""


@pytest.fixture(scope='module')
def tough_broker(redis_server: RedisServer) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        redis_server.url,
        env={
            'SHOAL_SASL_TIMEOUT_SECONDS': str(SASL_TIMEOUT),
            'SHOAL_OPEN_TIMEOUT_SECONDS': str(OPEN_TIMEOUT),
            'SHOAL_IDLE_TIMEOUT_SECONDS': str(IDLE_TIMEOUT),
        },
    )
    yield b
    b.stop()


def connections(broker: BrokerProcess) -> int:
    status, body = broker.http_get('/metrics')
    assert status == 200
    found = re.search(rb'^shoal_connections (\S+)$', body, re.M)
    assert found is not None
    return int(float(found.group(1)))


def closed_by_peer(sock: socket.socket, seconds: float) -> bool:
    """Read (and drop) until the broker closes the socket, for at most ``seconds``."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


SASL = b'AMQP\x03\x01\x00\x00'
AMQP = b'AMQP\x00\x01\x00\x00'
ANONYMOUS_INIT = (  # sasl-init(mechanism=ANONYMOUS)
    b'\x00\x00\x00\x1d\x02\x01\x00\x00\x00\x53\x41\xd0\x00\x00\x00\x0d\x00\x00\x00\x01'
    b'\xa3\x09ANONYMOUS'
)


def hostile_inputs(count: int, seed: int = 7) -> list[bytes]:
    """Random bytes; mutated and truncated SASL and AMQP frames, after valid prefixes."""
    rng = random.Random(seed)
    frames = client_frames()[0]  # Open, Begin, Attach, Flow
    out = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            out.append(rng.randbytes(rng.randint(1, 300)))
            continue
        body = bytearray(ANONYMOUS_INIT if kind == 1 else frames)
        for _ in range(rng.randint(1, 6)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.5:
            del body[rng.randrange(len(body)) :]
        prefix = {1: SASL, 2: AMQP, 3: SASL + ANONYMOUS_INIT + AMQP, 4: AMQP}[kind]
        if kind == 4:  # a frame announcing a huge size, then little
            body = bytearray(b'\x7f\xff\xff\xff\x02\x00\x00\x00') + body[:20]
        out.append(prefix + bytes(body))
    return out


def attack(port: int, n: int, payload: bytes) -> str | None:
    """Send one hostile input; None once the broker closed the connection, else what is wrong."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as sock:
        try:
            sock.sendall(payload)
            if n % 2:  # half of them hang up at once, half wait to be thrown out
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            return None  # the broker already closed on a bad prefix: fine
        if closed_by_peer(sock, BOUND):
            return None
        return f'input {n} left open: {payload[:40]!r}'


def test_malformed_and_truncated_input_closes_only_its_own_connection(
    tough_broker: BrokerProcess, address: str
) -> None:
    healthy = connect(tough_broker.url)
    snd = sender(healthy, address)
    rcv = receiver(healthy, address, credit=10)
    baseline = connections(tough_broker)
    inputs = hostile_inputs(250)
    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
        attacks = [pool.submit(attack, tough_broker.port, n, p) for n, p in enumerate(inputs)]
        n = 0
        while not all(a.done() for a in attacks):  # meanwhile the healthy client is served
            snd.send(Message(body=n))
            assert rcv.receive(timeout=10).body == n
            rcv.accept()
            n += 1
            time.sleep(0.2)
        failures = [a.result() for a in attacks if a.result() is not None]
    assert failures == []
    assert n > 0
    assert tough_broker.process.poll() is None
    wait_for(lambda: connections(tough_broker) == baseline, 10, 'connections back to baseline')
    healthy.close()


def test_a_message_a_decoder_refuses_is_rejected_and_the_link_goes_on(
    tough_broker: BrokerProcess, address: str
) -> None:
    bad_char = b'\x00\x53\x73\xc0\x08\x03\x40\x40\x73\x7f\xff\xff\xff\x00\x53\x77\xa1\x01x'
    conn = connect(tough_broker.url)
    snd = sender(conn, address)
    assert send_raw(conn, snd, bad_char) == Delivery.REJECTED
    assert send_raw(conn, snd, b'\x00\x53\x77\xa1\x01x') == Delivery.ACCEPTED
    assert [m.body for m in receive_all(receiver(conn, address), 1)] == ['x']
    conn.close()


def test_a_silent_connection_is_dropped_after_the_sasl_timeout(
    tough_broker: BrokerProcess,
) -> None:
    with socket.create_connection((LOOPBACK, tough_broker.port), timeout=5) as sock:
        assert closed_by_peer(sock, BOUND)


def test_a_byte_at_a_time_handshake_is_dropped_after_the_sasl_timeout(
    tough_broker: BrokerProcess,
) -> None:
    trickle = SASL + ANONYMOUS_INIT
    with socket.create_connection((LOOPBACK, tough_broker.port), timeout=5) as sock:
        sock.settimeout(0.01)
        deadline = time.monotonic() + BOUND
        closed = False
        for byte in trickle * 10:
            if time.monotonic() > deadline:
                break
            try:
                sock.sendall(bytes([byte]))
                time.sleep(0.3)
                while True:  # drain what the broker wrote; EOF means it hung up
                    if not sock.recv(4096):
                        closed = True
                        break
            except TimeoutError:
                continue
            except OSError:
                closed = True
            if closed:
                break
        assert closed


def test_an_authenticated_connection_without_open_is_dropped_after_the_open_timeout(
    tough_broker: BrokerProcess,
) -> None:
    with Wire(socket.create_connection((LOOPBACK, tough_broker.port), timeout=5)) as w:
        assert authenticate(w).code == 0
        w.sock.sendall(AMQP)
        assert closed_by_peer(w.sock, BOUND)


def test_many_slow_loris_connections_do_not_stop_a_new_client(
    tough_broker: BrokerProcess, address: str
) -> None:
    lingering = [socket.create_connection((LOOPBACK, tough_broker.port)) for _ in range(60)]
    try:
        for i, sock in enumerate(lingering):
            sock.sendall(SASL[: i % 8])  # every stage of an unfinished header
        conn = BlockingConnection(tough_broker.url, timeout=10)
        send_all(conn, address, ['through'])
        assert [m.body for m in receive_all(receiver(conn, address), 1)] == ['through']
        conn.close()
        assert all(closed_by_peer(sock, BOUND) for sock in lingering)
    finally:
        for sock in lingering:
            sock.close()


@pytest.mark.parametrize(
    'sent', [b'', SASL, AMQP[:5]], ids=['nothing', 'after-sasl', 'half-a-header']
)
def test_a_connection_that_leaves_before_its_amqp_header_is_logged_once(
    broker: BrokerProcess, sent: bytes
) -> None:
    """Its end of input and then the loss of its socket both reached the engine, and each
    logged proton's transport error: one line per connection is what an operator should read."""
    with socket.create_connection((LOOPBACK, broker.port), timeout=5) as sock:
        port = sock.getsockname()[1]
        if sent == SASL:  # leave once SASL is over (ANONYMOUS), before the AMQP header
            assert authenticate(Wire(sock)).code == 0
        else:
            sock.sendall(sent)
    line = f'127.0.0.1:{port}: transport error'
    wait_for(lambda: line in broker.log(), 10, 'the transport error logged')
    # a full connection after it: by its end the socket loss of the first has been handled
    marker = connect(broker.url)
    send_all(marker, f'robust-{port}', ['marker'])
    marker.close()
    assert broker.log().count(line) == 1
