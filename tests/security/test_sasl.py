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
from proton import ConnectionException, Endpoint, Event
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection
from saslwire import AUTH, OK, SASL_HEADER, Wire, authenticate, frame, open_amqp
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


SYS_TEMP = 4
"""The sasl-outcome code for "temporary system error": try again later."""


def throttling_broker(
    start_broker: Callable[..., BrokerProcess], users_file: Path, limit: int
) -> BrokerProcess:
    return start_broker(
        env={
            'SHOAL_USERS_FILE': str(users_file), 'SHOAL_ALLOW_ANONYMOUS': 'false',
            'SHOAL_MAX_FAILED_LOGINS_PER_MINUTE': str(limit),
        }
    )  # fmt: skip


def failures_metric(broker: BrokerProcess, mechanism: str, reason: str) -> float:
    metrics = broker.http_get('/metrics')[1].decode()
    pattern = r'^shoal_authentication_failures_total\{mechanism="%s",reason="%s"\} (\S+)$'
    found = re.search(pattern % (mechanism, reason), metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


class SaslOutcome(MessagingHandler):  # type: ignore[misc]
    """A proton client logging in with PLAIN, no reconnect: the sasl-outcome code it got."""

    def __init__(self, url: str, user: str, password: str) -> None:
        super().__init__()
        self.url, self.user, self.password = url, user, password
        self.code: int | None = None
        self.condition = ''

    def on_start(self, event: Event) -> None:
        event.container.connect(
            self.url, user=self.user, password=self.password, allowed_mechs='PLAIN',
            allow_insecure_mechs=True, reconnect=False,
        )  # fmt: skip

    def on_transport_error(self, event: Event) -> None:
        self.code = event.transport.sasl().outcome
        self.condition = str(event.transport.condition)


def proton_outcome(broker: BrokerProcess, user: str, password: str) -> SaslOutcome:
    client = SaslOutcome(broker.url, user, password)
    Container(client).run()
    return client


def test_failed_logins_are_throttled_per_source_address_and_told_to_try_later(
    start_broker: Callable[..., BrokerProcess], users_file: Path
) -> None:
    """Five wrong passwords from one address within a minute: its next connection is answered
    with the SASL header and mechanisms as usual, then sasl-outcome sys-temp, even with the
    right password, and closed. Each refusal's log line says what happened (not proton's
    framing-error about a missing AMQP header), and the throttled one is not logged per
    connection."""
    b = throttling_broker(start_broker, users_file, 5)
    for _ in range(5):
        with wire(b) as w:
            assert authenticate(w, user='alice', password='wrong', mechanism='PLAIN').code == AUTH
    with wire(b) as w:
        result = authenticate(w, user='alice', password=PASSWORDS['alice'], mechanism='PLAIN')
        assert result.offered == ['SCRAM-SHA-512', 'SCRAM-SHA-256', 'PLAIN']
        assert result.code == SYS_TEMP, 'a throttled address is told to try later'
        assert result.closed_after
    with wire(b) as w:  # skipping SASL: no outcome can be sent, only the SASL header
        w.sock.sendall(b'AMQP\x00\x01\x00\x00')
        assert w.read(8) == SASL_HEADER
        assert w.closed()
    log = b.log()
    assert log.count('refused: authentication failed') == 5
    assert '5 failed logins from 127.0.0.1 within a minute' in log
    assert 'too many failed logins' not in log  # DEBUG: the WARNING above said it once
    assert 'framing-error' not in log
    assert failures_metric(b, 'none', 'throttled') == 2
    assert failures_metric(b, 'PLAIN', 'credentials') == 5


def test_a_throttled_client_reads_sys_temp_not_a_network_fault(
    start_broker: Callable[..., BrokerProcess], users_file: Path, address: str
) -> None:
    """What the clients make of it: proton's outcome code is 4 (Qpid JMS raises a
    JMSSecuritySaslException with it, which its failover treats as worth retrying), and rhea
    reports "Failed to authenticate: 4" rather than a dropped connection."""
    b = throttling_broker(start_broker, users_file, 1)
    refused = proton_outcome(b, 'alice', 'wrong')
    assert refused.code == AUTH
    throttled = proton_outcome(b, 'alice', PASSWORDS['alice'])
    assert throttled.code == SYS_TEMP, throttled.condition
    assert 'unauthorized-access' in throttled.condition
    code, result = run_rhea(
        b, mode='send', address=f'orders.{address}', username='alice',
        password=PASSWORDS['alice'],
    )  # fmt: skip
    assert code != 0
    assert 'Failed to authenticate: 4' in str(result['error']), result
    assert failures_metric(b, 'PLAIN', 'credentials') == 1  # the throttled tries add nothing


def malformed_plain(w: Wire) -> int:
    """A PLAIN initial response that is not ``authzid NUL authcid NUL passwd``."""
    w.sock.sendall(SASL_HEADER)
    w.read(8)
    w.frame()  # the mechanisms
    w.sock.sendall(frame(0x41, 'PLAIN', b'no separators here', None))
    descriptor, fields = w.frame()
    assert descriptor == 0x44
    return int(fields[0])  # type: ignore[call-overload]


def test_only_refused_credentials_count_toward_the_throttle(
    start_broker: Callable[..., BrokerProcess], users_file: Path
) -> None:
    """A mechanism not offered and a malformed PLAIN response check no password, so they cannot
    be guesses: a client misconfigured that way, reconnecting in a loop, does not lock out the
    other clients behind its address. Wrong passwords and unknown users do count."""
    b = throttling_broker(start_broker, users_file, 2)
    for _ in range(3):
        with wire(b) as w:
            assert authenticate(w, mechanism='CRAM-MD5').code == AUTH
        with wire(b) as w:
            assert malformed_plain(w) == AUTH
    with wire(b) as w:
        assert authenticate(w, user='alice', password=PASSWORDS['alice']).code == OK
    assert failures_metric(b, 'other', 'mechanism') == 3
    assert failures_metric(b, 'PLAIN', 'malformed') == 3
    with wire(b) as w:
        assert authenticate(w, user='nobody', password='x', mechanism='PLAIN').code == AUTH
    with wire(b) as w:
        assert authenticate(w, user='alice', password='wrong').code == AUTH  # SCRAM-SHA-512
    with wire(b) as w:
        assert authenticate(w, user='alice', password=PASSWORDS['alice']).code == SYS_TEMP
    assert failures_metric(b, 'PLAIN', 'credentials') == 1
    assert failures_metric(b, 'SCRAM-SHA-512', 'credentials') == 1
