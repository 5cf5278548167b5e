"""Brokers on a ``redis+sentinel://`` URL: they find the primary through the sentinels, serve
queues, and after a failover (the sentinels' ``SENTINEL FAILOVER``, the old primary still up)
follow the new primary for the message path, the wake-ups between replicas and ``shoal``."""

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from amqpclient import connect, nothing_more, receive_all, receiver, send_all
from exposition import samples, value
from processes import LOOPBACK, BrokerProcess, broker
from sentinels import SERVICE, SentinelGroup


@pytest.fixture(scope='module')
def group() -> Iterator[SentinelGroup]:
    g = SentinelGroup()
    yield g
    g.stop()


def test_a_broker_on_a_sentinel_url_serves_a_queue(group: SentinelGroup, address: str) -> None:
    with _broker(group) as b:
        conn = connect(b.url)
        send_all(conn, address, range(20))
        rcv = receiver(conn, address, credit=50)
        assert [m.body for m in receive_all(rcv, 20)] == list(range(20))
        assert nothing_more(rcv)
        conn.close()
    primary = group.primary_port()
    assert primary is not None
    client = redis.Redis(host=LOOPBACK, port=primary)
    try:  # the messages went through the primary the sentinels name
        assert client.hexists('shoal:addresses', address)
    finally:
        client.close()


def test_passwords_for_the_servers_and_for_the_sentinels(address: str) -> None:
    protected = SentinelGroup(password='s3rv3r', sentinel_password='s3nt1nel')
    try:
        with broker(protected.url) as b:
            conn = connect(b.url)
            send_all(conn, address, range(5))
            rcv = receiver(conn, address, credit=10)
            assert [m.body for m in receive_all(rcv, 5)] == list(range(5))
            conn.close()
    finally:
        protected.stop()


def test_shoal_reads_the_cluster_through_the_sentinels(group: SentinelGroup, address: str) -> None:
    with _broker(group) as b:
        conn = connect(b.url)
        send_all(conn, address, range(3))
        conn.close()
        out = subprocess.run(
            [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', group.url, 'queues'],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    assert address in out.stdout, out


@pytest.mark.timeout(90)
def test_after_a_failover_both_replicas_follow_the_new_primary(
    group: SentinelGroup, address: str
) -> None:
    """The old primary stays up and becomes a replica: nothing fails on its own, so only the
    ``+switch-master`` announcement (or a READONLY reply) tells the brokers to move."""
    with _broker(group) as a, _broker(group) as b:
        consumer_conn = connect(b.url)
        rcv = receiver(consumer_conn, address, credit=50)
        producer_conn = connect(a.url)
        send_all(producer_conn, address, ['before'])
        assert [m.body for m in receive_all(rcv, 1)] == ['before']
        old = group.primary_port()
        assert old is not None
        _failover(group)
        new, promoted_at = group.wait_promoted(old, timeout=30)
        # every broker connection (pipelines, notification channel, cold path) leaves the old
        # primary, which is still up and would keep answering reads and pub/sub
        # (a generous bound, not a timed assertion: without following they never leave)
        assert _eventually(lambda: not _broker_clients(old), timeout=20), _broker_clients(old)
        left = time.monotonic() - promoted_at
        sys.stderr.write(
            f'[sentinel] broker connections left the old primary {left:.2f} s after the promotion\n'
        )
        group.wait_linked(old, timeout=30)  # the old primary now replicates the new one
        # published on a, woken on b by the notification channel on the new primary
        send_all(producer_conn, address, ['after'])
        assert [m.body for m in receive_all(rcv, 1, timeout=10)] == ['after']
        client = redis.Redis(host=LOOPBACK, port=new)
        try:
            assert client.xlen(f'shoal:{{a:{address}}}:p:5') >= 1  # written to the new primary
        finally:
            client.close()
        producer_conn.close()
        consumer_conn.close()
        assert 'switched shoal to' in a.log()
        assert 'switched shoal to' in b.log()
        for replica in (a, b):  # one switch, however many of its pools followed it
            assert value(samples(replica), 'shoal_redis_sentinel_switches_total') == 1
        # a's pipelines left the demoted primary and carried 'after' on a new connection
        assert value(samples(a), 'shoal_redis_reconnects_total', connection='pipeline') >= 1


def _broker_clients(port: int) -> list[dict[str, Any]]:
    """Clients of the Redis on ``port`` other than the sentinels and this test."""
    client = redis.Redis(host=LOOPBACK, port=port)
    try:
        own = client.client_id()
        return [
            {k: c[k] for k in ('addr', 'age', 'cmd')} for c in client.client_list()
            if c['id'] != str(own) and not c['name'].startswith('sentinel-')
        ]  # fmt: skip
    finally:
        client.close()


def _eventually(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _failover(group: SentinelGroup) -> None:
    port, _ = group.sentinels[0]
    client = redis.Redis(host=LOOPBACK, port=port)
    try:
        client.sentinel_failover(SERVICE)
    finally:
        client.close()


def _broker(group: SentinelGroup) -> contextlib.AbstractContextManager[BrokerProcess]:
    return broker(group.url)
