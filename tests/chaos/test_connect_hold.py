"""A JMS connection opened while the store is down or failing over: its ClientID check
(sole-connection-for-container, jms-amqp-facts §1.5) waits within the hold's bound
(``SHOAL_STORE_HOLD_SECONDS``), as a held send does, and the Open is answered once the store is
back; past the bound the client reads a clear refusal, and its ClientID is not left taken."""

import threading
import time
import uuid
from pathlib import Path

import pytest
from amqpclient import receive_all, receiver, sender
from enginepeer import EnginePeer
from jmswire import JMS_DESIRED
from proton import Message, symbol
from proton.reactor import Container
from proton.utils import BlockingConnection

OUTAGE_SECONDS = 5.0


def _jms_connect(url: str, client_id: str, timeout: float) -> BlockingConnection:
    """A connection as Qpid JMS opens it with a ClientID, waiting up to ``timeout`` for the
    broker's Open."""
    container = Container()
    container.container_id = client_id
    desired = [symbol(c) for c in JMS_DESIRED]
    return BlockingConnection(
        url, timeout=timeout, container=container, desired_capabilities=desired
    )


def _jms_peer(port: int, client_id: str) -> EnginePeer:
    peer = EnginePeer(port)
    peer.connection.container = client_id
    peer.connection.desired_capabilities = [symbol(c) for c in JMS_DESIRED]
    peer.connection.open()
    return peer


def _round_trip(conn: BlockingConnection, body: str) -> str:
    queue = f'connect-hold-{uuid.uuid4().hex[:8]}'
    sender(conn, queue).send(Message(body=body))
    return str(receive_all(receiver(conn, queue, credit=1), 1)[0].body)


def _refused_as_in_use(port: int, client_id: str) -> bool:
    clash = _jms_peer(port, client_id)
    try:
        assert clash.pump(10, until=lambda: clash.remote_closed)
        return bool(clash.connection.remote_condition.name == 'amqp:invalid-field')
    finally:
        clash.close()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_client_connecting_while_redis_is_stopped_is_answered_once_it_is_back(
    cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path)
    b = cluster.broker(server.url)
    client_id = f'held-open-{uuid.uuid4().hex[:8]}'
    server.stop()
    stopped_at = time.monotonic()
    restart = threading.Timer(OUTAGE_SECONDS, lambda: cluster.restart(server))
    restart.start()
    try:
        conn = _jms_connect(b.url, client_id, timeout=30)
    finally:
        restart.join()
    opened_after = time.monotonic() - stopped_at
    try:
        assert _round_trip(conn, 'sent after a held open') == 'sent after a held open'
        assert _refused_as_in_use(b.port, client_id)  # the claim was made, and is held
    finally:
        conn.close()
    cluster.report(f'an open during a {OUTAGE_SECONDS:g} s redis stop: answered after '
                   f'{opened_after:.1f} s')  # fmt: skip
    assert opened_after >= OUTAGE_SECONDS - 0.5
    assert b.process.poll() is None


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_past_the_hold_bound_an_open_is_refused_with_a_reason_and_the_client_id_stays_free(
    cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    server = cluster.aof_redis(tmp_path)
    b = cluster.broker(server.url, env={'SHOAL_STORE_HOLD_SECONDS': '2'})
    client_id = f'refused-open-{uuid.uuid4().hex[:8]}'
    server.stop()
    stopped_at = time.monotonic()
    peer = _jms_peer(b.port, client_id)
    try:
        assert peer.pump(20, until=lambda: peer.remote_closed)
        refused_after = time.monotonic() - stopped_at
        properties = peer.connection.remote_properties or {}
        condition = peer.connection.remote_condition
    finally:
        peer.close()
    cluster.restart(server)
    # the refusal left nothing taken: the same ClientID connects once the store is back
    conn = _jms_connect(b.url, client_id, timeout=30)
    try:
        assert _round_trip(conn, 'after the refusal') == 'after the refusal'
    finally:
        conn.close()
    cluster.report(f'an open past a 2 s hold: refused after {refused_after:.1f} s with '
                   f'{condition.name}: {condition.description}')  # fmt: skip
    # Qpid JMS reads the Close's error (ResourceAllocationException), not a dropped connection
    assert properties.get(symbol('amqp:connection-establishment-failed')) is True
    assert condition.name == 'amqp:resource-limit-exceeded'
    assert 'did not answer for 2 s' in condition.description
    assert client_id in condition.description
    assert refused_after >= 2.0
    assert b.process.poll() is None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_client_connecting_during_a_sentinel_failover_is_answered_once_it_is_over(
    cluster,
) -> None:  # type: ignore[no-untyped-def]
    group = cluster.sentinels()
    b = cluster.broker(group.url, replica_id=f'connect-hold-{uuid.uuid4().hex[:4]}')
    first = _jms_connect(b.url, f'before-{uuid.uuid4().hex[:8]}', timeout=30)
    first.close()  # the broker has reached the store through the sentinels once
    client_id = f'failover-open-{uuid.uuid4().hex[:8]}'
    old = group.primary_port()
    assert old is not None
    killed_at = cluster.kill_9(group.running(old).process)
    conn = _jms_connect(b.url, client_id, timeout=60)  # Redis has no primary meanwhile
    opened_at = time.monotonic()
    try:
        _, promoted_at = group.wait_promoted(old, timeout=30)
        assert _round_trip(conn, 'sent after a failover') == 'sent after a failover'
        assert _refused_as_in_use(b.port, client_id)
    finally:
        conn.close()
    cluster.report(
        f'an open during a sentinel failover: promoted {promoted_at - killed_at:.2f} s, the open '
        f'answered {opened_at - killed_at:.2f} s after the kill'
    )
    assert opened_at - killed_at < 30
    assert b.process.poll() is None
