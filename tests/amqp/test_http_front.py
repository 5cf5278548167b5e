"""
The HTTP port's front (``health.py``): it answers the probes and metrics itself, request after
request on one connection, and hands anything else, with the bytes already read, to the aiohttp
side, which then answers on that connection. Raw sockets, so that the bytes on the wire are
what is checked.
"""

import socket

from processes import LOOPBACK, BrokerProcess

from shoal_broker.health import REQUEST_TIMEOUT_SECONDS


def _exchange(port: int, data: bytes, parts: int = 1) -> bytes:
    """Sends ``data`` in ``parts`` writes; what the broker answers until it closes."""
    with socket.create_connection((LOOPBACK, port), timeout=10) as s:
        step = max(1, len(data) // parts)
        for i in range(0, len(data), step):
            s.sendall(data[i : i + step])
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b''.join(chunks)


def test_the_probe_front_answers_pipelined_split_and_head_requests(broker: BrokerProcess) -> None:
    keep = b'GET /livez HTTP/1.1\r\nHost: x\r\n\r\n'
    last = b'HEAD /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'
    answer = _exchange(broker.http_port, keep + keep + last, parts=7)
    assert answer.count(b'HTTP/1.1 200 OK\r\n') == 3
    assert answer.count(b'\r\n\r\nok\n') == 2
    head = answer.rsplit(b'HTTP/1.1 200 OK\r\n', 1)[1]
    assert b'Content-Length: ' in head
    assert head.endswith(b'\r\n\r\n')  # HEAD: the length of the body, no body
    assert b'Connection: close' in head


def test_what_the_front_does_not_take_is_answered_by_the_web_application(
    broker: BrokerProcess,
) -> None:
    # a probe first on the connection, then a method the probes do not serve: aiohttp's 405
    answer = _exchange(
        broker.http_port,
        b'GET /livez HTTP/1.1\r\nHost: x\r\n\r\n'
        b'POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi',
    )
    assert answer.startswith(b'HTTP/1.1 200 OK\r\n')
    assert b'HTTP/1.1 405 Method Not Allowed\r\n' in answer
    assert broker.http_get('/nope')[0] == 404


def test_a_request_head_never_finished_is_dropped_and_probes_go_on(broker: BrokerProcess) -> None:
    slow = [socket.create_connection((LOOPBACK, broker.http_port), timeout=10) for _ in range(20)]
    try:
        for s in slow:
            s.sendall(b'GET /livez HTTP/1.1\r\nHost: x\r\n')  # no blank line, ever
        assert broker.http_get('/livez') == (200, b'ok\n')
        for s in slow:
            s.settimeout(REQUEST_TIMEOUT_SECONDS + 10)
            assert s.recv(1024) == b''  # closed by the broker, nothing answered
    finally:
        for s in slow:
            s.close()
