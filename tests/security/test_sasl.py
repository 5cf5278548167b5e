"""
SASL as Qpid JMS negotiates it, against a broker with ANONYMOUS off (jms-amqp-facts §1.1).

Each flow runs on a raw socket: mechanisms offered, the exchange, the outcome, and then an AMQP
Open on the same socket to show the authenticated transport really carries AMQP.
"""

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import scramp
from amqpclient import receive_all, receiver, send_all
from processes import LOOPBACK, BrokerProcess
from proton import ConnectionException, Endpoint
from proton.utils import BlockingConnection
from saslwire import AUTH, OK, Wire, authenticate, frame, open_amqp
from testusers import PASSWORDS

RHEA_DIR = Path(__file__).resolve().parents[1] / 'rhea'


def wire(broker: BrokerProcess) -> Wire:
    return Wire(socket.create_connection((LOOPBACK, broker.port), timeout=5))


def test_anonymous_is_not_offered_and_strong_mechanisms_come_first(
    secure_broker: BrokerProcess,
) -> None:
    with wire(secure_broker) as w:
        result = authenticate(w)  # no credentials: Qpid JMS would find nothing to use
        assert result.offered == ['SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN']
        assert result.mechanism is None


@pytest.mark.parametrize('mechanism', ['SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN'])
def test_correct_credentials_authenticate_and_the_connection_opens(
    secure_broker: BrokerProcess, mechanism: str
) -> None:
    with wire(secure_broker) as w:
        result = authenticate(w, user='alice', password=PASSWORDS['alice'], mechanism=mechanism)
        assert result.code == OK
        if mechanism.startswith('SCRAM'):
            assert result.server_verified  # the server proved it knows alice's key too
        connection = open_amqp(w)
        assert connection.state & Endpoint.REMOTE_ACTIVE


def test_qpid_jms_preference_picks_scram_sha_512(secure_broker: BrokerProcess) -> None:
    with wire(secure_broker) as w:
        result = authenticate(w, user='bob', password=PASSWORDS['bob'])
        assert (result.mechanism, result.code) == ('SCRAM-SHA-512', OK)


@pytest.mark.parametrize('mechanism', ['SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN'])
@pytest.mark.parametrize('user', ['alice', 'nobody'])
def test_wrong_credentials_fail_with_outcome_auth_then_close(
    secure_broker: BrokerProcess, mechanism: str, user: str
) -> None:
    with wire(secure_broker) as w:
        result = authenticate(w, user=user, password='wrong', mechanism=mechanism)
        assert result.code == AUTH
        assert result.additional == b''
        assert result.closed_after


def test_unknown_and_known_users_see_the_same_scram_challenge_shape(
    secure_broker: BrokerProcess,
) -> None:
    """No user-existence leak: an unknown name gets a stable salt and the same iteration count."""

    def server_first(user: str) -> dict[str, str]:
        with wire(secure_broker) as w:
            w.sock.sendall(b'AMQP\x03\x01\x00\x00')
            w.read(8)
            w.frame()
            client = scramp.ScramClient(['SCRAM-SHA-256'], user, 'x')
            w.sock.sendall(frame(0x41, 'SCRAM-SHA-256', client.get_client_first().encode(), None))
            descriptor, fields = w.frame()
            assert descriptor == 0x42
            return dict(part.split('=', 1) for part in bytes(fields[0]).decode().split(','))

    known, unknown, unknown_again = server_first('alice'), server_first('zed'), server_first('zed')
    assert known['i'] == unknown['i']
    assert len(known['s']) == len(unknown['s'])
    assert unknown['s'] == unknown_again['s']
    assert known['s'] != unknown['s']


def test_anonymous_is_refused_when_disabled(secure_broker: BrokerProcess) -> None:
    with wire(secure_broker) as w:
        result = authenticate(w, mechanism='ANONYMOUS')
        assert result.code == AUTH
        assert result.closed_after


def test_skipping_sasl_is_refused_when_anonymous_is_disabled(secure_broker: BrokerProcess) -> None:
    with wire(secure_broker) as w:
        w.sock.sendall(b'AMQP\x00\x01\x00\x00')
        assert w.read(8) == b'AMQP\x03\x01\x00\x00'  # "I speak SASL"
        assert w.closed()


def test_proton_client_with_plain_credentials_sends_and_receives(
    secure_broker: BrokerProcess, address: str
) -> None:
    queue = f'orders.{address}'
    conn = BlockingConnection(
        secure_broker.url, timeout=10, user='alice', password=PASSWORDS['alice'],
        allowed_mechs='PLAIN', allow_insecure_mechs=True,
    )  # fmt: skip
    try:
        send_all(conn, queue, [f'm{i}' for i in range(3)])
        got = receive_all(receiver(conn, queue), 3)
        assert [m.body for m in got] == ['m0', 'm1', 'm2']
    finally:
        conn.close()


def test_proton_client_with_a_wrong_password_is_refused(secure_broker: BrokerProcess) -> None:
    with pytest.raises(ConnectionException):
        BlockingConnection(
            secure_broker.url, timeout=10, user='alice', password='nope',
            allowed_mechs='PLAIN', allow_insecure_mechs=True,
        )  # fmt: skip


def test_anonymous_broker_still_accepts_clients_without_credentials(
    broker: BrokerProcess,
) -> None:
    """The default (tests, make run): ANONYMOUS on, no users file, no restrictions."""
    with wire(broker) as w:
        result = authenticate(w)
        assert result.offered == ['ANONYMOUS']
        assert (result.mechanism, result.code) == ('ANONYMOUS', OK)
        assert open_amqp(w).state & Endpoint.REMOTE_ACTIVE


def run_rhea(broker: BrokerProcess, **args: object) -> tuple[int, dict[str, object]]:
    """tests/rhea/client.js (rhea: an AMQP client independent of proton) against ``broker``."""
    node = shutil.which('node')
    assert node, 'node is not installed: run `make node-deps` (make test installs it)'
    done = subprocess.run(
        [node, 'client.js', json.dumps({'port': broker.port, 'timeout_ms': 20_000, **args})],
        cwd=RHEA_DIR, capture_output=True, text=True, timeout=40, check=False,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_rhea_with_plain_credentials_round_trips(
    secure_broker: BrokerProcess, address: str
) -> None:
    code, result = run_rhea(
        secure_broker, mode='roundtrip', address=f'orders.{address}', count=5,
        username='alice', password=PASSWORDS['alice'],
    )  # fmt: skip
    assert code == 0, result
    assert result['bodies'] == [f'm{i}' for i in range(5)]


def test_rhea_with_a_wrong_password_is_refused(secure_broker: BrokerProcess, address: str) -> None:
    code, result = run_rhea(
        secure_broker, mode='send', address=f'orders.{address}', username='alice',
        password='wrong',
    )  # fmt: skip
    assert code != 0
    assert result['ok'] is False


def test_failed_logins_are_throttled_per_source_address_and_logged_as_such(
    start_broker: Callable[..., BrokerProcess], users_file: Path
) -> None:
    """Five wrong passwords from one address within a minute: its next connection is closed at
    once, before any credential is read, even with the right password. Each refusal's log line
    says what happened (not proton's framing-error about a missing AMQP header)."""
    b = start_broker(
        env={
            'SHOAL_USERS_FILE': str(users_file), 'SHOAL_ALLOW_ANONYMOUS': 'false',
            'SHOAL_MAX_FAILED_LOGINS_PER_MINUTE': '5',
        }
    )  # fmt: skip
    for _ in range(5):
        with wire(b) as w:
            assert authenticate(w, user='alice', password='wrong', mechanism='PLAIN').code == AUTH
    with wire(b) as w:
        w.sock.sendall(b'AMQP\x03\x01\x00\x00')
        assert w.closed(), 'a throttled address is hung up on'
        assert w.received == b'', 'nothing is offered to a throttled address'
    log = b.log()
    assert log.count('refused: authentication failed') == 5
    assert '5 failed logins from 127.0.0.1 within a minute' in log
    assert 'framing-error' not in log
    metrics = b.http_get('/metrics')[1].decode()
    failures = r'^shoal_authentication_failures_total\{mechanism="%s",reason="%s"\} %s$'
    assert re.search(failures % ('none', 'throttled', r'1\.0'), metrics, re.MULTILINE)
    assert re.search(failures % ('PLAIN', 'credentials', r'5\.0'), metrics, re.MULTILINE)
