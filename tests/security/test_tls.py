"""
The ``amqps`` listener: server certificate, client certificates (SASL EXTERNAL), reload without a
restart; and a ``rediss://`` store with a CA bundle, against a real TLS redis-server.
"""

import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from amqpclient import receive_all, receiver, send_all
from certs import Authority, Pem
from processes import LOOPBACK, BrokerProcess, RedisServer, free_port, wait_for
from proton import Endpoint, SSLDomain
from proton.utils import BlockingConnection
from saslwire import AUTH, OK, Wire, authenticate, open_amqp
from testusers import PASSWORDS


class Pki:
    def __init__(self, directory: Path) -> None:
        self.ca = Authority(directory)
        self.server = self.ca.issue('localhost', server=True, stem='server')
        self.certy = self.ca.issue('certy', server=False)
        self.stranger = self.ca.issue('stranger', server=False)
        self.rogue = Authority(directory, 'rogue CA').issue('certy', server=False, stem='rogue')


@pytest.fixture(scope='module')
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp('pki'))


def tls_env(pki: Pki, users_file: Path, client_auth: str, port: int) -> dict[str, str]:
    return {
        'SHOAL_USERS_FILE': str(users_file),
        'SHOAL_ALLOW_ANONYMOUS': 'false',
        'SHOAL_TLS_LISTEN': f'{LOOPBACK}:{port}',
        'SHOAL_TLS_CERT_FILE': str(pki.server.cert),
        'SHOAL_TLS_KEY_FILE': str(pki.server.key),
        'SHOAL_TLS_CLIENT_CA_FILE': str(pki.ca.pem.cert),
        'SHOAL_TLS_CLIENT_AUTH': client_auth,
        'SHOAL_TLS_RELOAD_INTERVAL_SECONDS': '0.5',
    }


@pytest.fixture(scope='module')
def tls_broker(redis_server: RedisServer, pki: Pki, users_file: Path) -> Iterator[BrokerProcess]:
    port = free_port()
    b = BrokerProcess(redis_server.url, env=tls_env(pki, users_file, 'optional', port))
    b.tls_port = port  # type: ignore[attr-defined]
    yield b
    b.stop()


def tls_wire(port: int, ca: Path, client: Pem | None = None) -> Wire:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    raw = socket.create_connection((LOOPBACK, port), timeout=5)
    return Wire(context.wrap_socket(raw, server_hostname='localhost'))


def test_plain_over_amqps_with_a_verified_server_certificate(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    with tls_wire(tls_broker.tls_port, pki.ca.pem.cert) as w:  # type: ignore[attr-defined]
        result = authenticate(w, user='alice', password=PASSWORDS['alice'], mechanism='PLAIN')
        assert result.offered == ['SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN']  # no cert, no EXTERNAL
        assert result.code == OK
        assert open_amqp(w).state & Endpoint.REMOTE_ACTIVE


def test_proton_client_over_amqps_sends_and_receives(
    tls_broker: BrokerProcess, pki: Pki, address: str
) -> None:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca.pem.cert))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    url = f'amqps://localhost:{tls_broker.tls_port}'  # type: ignore[attr-defined]
    conn = BlockingConnection(
        url, timeout=10, ssl_domain=domain, user='alice', password=PASSWORDS['alice'],
        allowed_mechs='PLAIN',
    )  # fmt: skip
    try:
        queue = f'orders.{address}'
        send_all(conn, queue, ['over tls'])
        assert [m.body for m in receive_all(receiver(conn, queue), 1)] == ['over tls']
    finally:
        conn.close()


def test_external_with_a_client_certificate_names_the_user(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    with tls_wire(tls_broker.tls_port, pki.ca.pem.cert, pki.certy) as w:  # type: ignore[attr-defined]
        result = authenticate(w, cert=True)
        assert result.offered[0] == 'EXTERNAL'
        assert (result.mechanism, result.code) == ('EXTERNAL', OK)
        assert open_amqp(w).state & Endpoint.REMOTE_ACTIVE


def test_external_with_a_certificate_for_no_user_fails(tls_broker: BrokerProcess, pki: Pki) -> None:
    with tls_wire(tls_broker.tls_port, pki.ca.pem.cert, pki.stranger) as w:  # type: ignore[attr-defined]
        result = authenticate(w, cert=True)
        assert (result.mechanism, result.code) == ('EXTERNAL', AUTH)
        assert result.closed_after


def test_a_client_certificate_from_another_ca_is_refused_in_the_handshake(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    with (
        pytest.raises((ssl.SSLError, EOFError, ConnectionResetError)),
        tls_wire(tls_broker.tls_port, pki.ca.pem.cert, pki.rogue) as w,  # type: ignore[attr-defined]
    ):
        authenticate(w, cert=True)


def test_required_client_certificates_refuse_peers_without_one(
    redis_server: RedisServer, pki: Pki, users_file: Path
) -> None:
    port = free_port()
    b = BrokerProcess(redis_server.url, env=tls_env(pki, users_file, 'required', port))
    try:
        with (
            pytest.raises((ssl.SSLError, EOFError, ConnectionResetError)),
            tls_wire(port, pki.ca.pem.cert) as w,
        ):
            authenticate(w, user='alice', password=PASSWORDS['alice'])
        with tls_wire(port, pki.ca.pem.cert, pki.certy) as w:
            assert authenticate(w, cert=True).code == OK
    finally:
        b.stop()


def _served_cn(port: int, ca: Path) -> str:
    with tls_wire(port, ca) as w:
        cert = w.sock.getpeercert()  # type: ignore[attr-defined]
        return str(dict(rdn[0] for rdn in cert['subject'])['commonName'])


def test_a_renewed_certificate_is_served_without_a_restart(
    redis_server: RedisServer, tmp_path: Path, users_file: Path
) -> None:
    pki = Pki(tmp_path)
    port = free_port()
    b = BrokerProcess(redis_server.url, env=tls_env(pki, users_file, 'none', port))
    try:
        with tls_wire(port, pki.ca.pem.cert) as kept:
            assert authenticate(kept, user='bob', password=PASSWORDS['bob']).code == OK
            assert open_amqp(kept).state & Endpoint.REMOTE_ACTIVE
            assert _served_cn(port, pki.ca.pem.cert) == 'localhost'
            # a renewal as cert-manager does it: new files in place (the CN differs to tell them
            # apart), picked up by the file watcher
            renewed = pki.ca.issue('127.0.0.1', server=True, stem='renewed')
            os.replace(renewed.key, pki.server.key)
            os.replace(renewed.cert, pki.server.cert)
            wait_for(lambda: _served_cn(port, pki.ca.pem.cert) == '127.0.0.1', 10, 'renewed cert')
            # SIGHUP reloads at once too
            again = pki.ca.issue('localhost', server=True, stem='again')
            os.replace(again.key, pki.server.key)
            os.replace(again.cert, pki.server.cert)
            os.kill(b.pid, signal.SIGHUP)
            wait_for(lambda: _served_cn(port, pki.ca.pem.cert) == 'localhost', 10, 'SIGHUP reload')
            # the connection made before both renewals still works
            kept.sock.sendall(b'\x00\x00\x00\x08\x02\x00\x00\x00')  # an empty frame (heartbeat)
            time.sleep(0.2)
            assert b.process.poll() is None
        assert 'TLS certificate reloaded' in b.log()
    finally:
        b.stop()


MISMATCH_SECONDS = 3.0
"""How long the renewed certificate sits beside the old key (the issue saw 9 s in the field)."""


def test_a_certificate_renewed_before_its_key_keeps_the_previous_pair(
    redis_server: RedisServer, tmp_path: Path, users_file: Path
) -> None:
    pki = Pki(tmp_path)
    port = free_port()
    b = BrokerProcess(redis_server.url, env=tls_env(pki, users_file, 'none', port))
    try:
        renewed = pki.ca.issue('127.0.0.1', server=True, stem='renewed')
        os.replace(renewed.cert, pki.server.cert)  # the certificate first, its key still the old
        wait_for(lambda: 'KEY_VALUES_MISMATCH' in b.log(), 10, 'the refused reload')
        served = []
        deadline = time.monotonic() + MISMATCH_SECONDS
        while time.monotonic() < deadline and len(served) < 200:
            served.append(_served_cn(port, pki.ca.pem.cert))  # raises if the handshake fails
            time.sleep(0.05)
        assert set(served) == {'localhost'}, 'the previous pair is served until the key arrives'
        os.replace(renewed.key, pki.server.key)
        wait_for(lambda: _served_cn(port, pki.ca.pem.cert) == '127.0.0.1', 10, 'the new pair')
        assert b.log().count('KEY_VALUES_MISMATCH') == 1, 'a refused pair is reported once'
    finally:
        b.stop()


def test_rediss_store_with_a_ca_bundle(tmp_path: Path, address: str) -> None:
    pki = Pki(tmp_path)
    redis_cert = pki.ca.issue('localhost', server=True, stem='redis')
    tls_port = free_port()
    redis = RedisServer(
        None, '--tls-port', str(tls_port), '--tls-cert-file', str(redis_cert.cert),
        '--tls-key-file', str(redis_cert.key), '--tls-ca-cert-file', str(pki.ca.pem.cert),
        '--tls-auth-clients', 'no',
    )  # fmt: skip
    try:
        b = BrokerProcess(
            f'rediss://localhost:{tls_port}/0', env={'SHOAL_REDIS_CA_FILE': str(pki.ca.pem.cert)}
        )
        try:
            conn = BlockingConnection(b.url, timeout=10)
            try:
                send_all(conn, address, ['via rediss'])
                assert [m.body for m in receive_all(receiver(conn, address), 1)] == ['via rediss']
            finally:
                conn.close()
        finally:
            b.stop()
    finally:
        redis.stop()
