"""
The metrics of what goes wrong at the door and below: failed logins (by mechanism and reason,
never the user), refused permissions, connections and links, producers held back by limits, and
the Redis connections the broker opened again (a reset, a Sentinel failover). Each one is moved by
the real event, with real clients on a real broker.
"""

import socket
import time
from pathlib import Path

import pytest
import redis as redis_lib
from amqpclient import connect, receiver, send_all, send_with_outcome, sender
from exposition import samples, value
from jmswire import jms_connect
from processes import LOOPBACK, BrokerProcess, RedisServer, wait_for
from proton import ConnectionException, Delivery, Message
from proton.utils import BlockingConnection, LinkDetached
from saslwire import AMQP_HEADER, AUTH, OK, SASL_HEADER, Wire, authenticate
from testusers import PASSWORDS, write_users

LIMIT = 'amqp:resource-limit-exceeded'
DENIED = 'amqp:unauthorized-access'
FAILURES = 'shoal_authentication_failures_total'


def _wire(broker: BrokerProcess) -> Wire:
    return Wire(socket.create_connection((LOOPBACK, broker.port), timeout=5))


def _login(broker: BrokerProcess, user: str) -> BlockingConnection:
    return BlockingConnection(
        broker.url, timeout=10, user=user, password=PASSWORDS[user], allowed_mechs='PLAIN',
        allow_insecure_mechs=True,
    )  # fmt: skip


def test_failed_logins_count_by_mechanism_and_reason_and_never_name_the_user(
    start_broker, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    users = write_users(tmp_path / 'users.json')
    b = start_broker(env={'SHOAL_USERS_FILE': str(users), 'SHOAL_ALLOW_ANONYMOUS': 'false',
                          'SHOAL_SASL_TIMEOUT_SECONDS': '1'})  # fmt: skip
    tries = [  # (mechanism asked for, user, password)
        ('PLAIN', 'alice', 'not-her-password'),
        ('SCRAM-SHA-256', 'mallory', 'whatever'),  # no such user
        ('SCRAM-SHA-512', 'alice', 'not-her-password'),
        ('ANONYMOUS', None, None),  # not offered here
        ('X-MADE-UP-BY-mallory', None, None),  # a name no broker offers
    ]
    for mechanism, user, password in tries:
        with _wire(b) as wire:
            outcome = authenticate(wire, user=user, password=password, mechanism=mechanism)
            assert outcome.code == AUTH, mechanism
    with _wire(b) as wire:  # a good login is no failure
        assert authenticate(wire, user='bob', password=PASSWORDS['bob']).code == OK
    with _wire(b) as wire:  # AMQP without SASL, and ANONYMOUS is off
        wire.sock.sendall(AMQP_HEADER)
        assert wire.closed(10)
    with _wire(b) as wire:  # a SASL header, then a frame of the wrong type
        wire.sock.sendall(SASL_HEADER + b'\x00\x00\x00\x08\x02\x00\x00\x00')
        assert wire.closed(10)
    with _wire(b) as wire:  # a SASL header, then silence past the SASL timeout
        wire.sock.sendall(SASL_HEADER)
        assert wire.closed(10)
    found = samples(b)
    expected = {
        ('PLAIN', 'credentials'): 1, ('SCRAM-SHA-256', 'credentials'): 1,
        ('SCRAM-SHA-512', 'credentials'): 1, ('ANONYMOUS', 'mechanism'): 1,
        ('other', 'mechanism'): 1, ('none', 'protocol_header'): 1, ('none', 'malformed'): 1,
        ('none', 'timeout'): 1,
    }  # fmt: skip
    counted = {
        (labels['mechanism'], labels['reason']): n
        for (name, pairs), n in found.items() if name == FAILURES and (labels := dict(pairs))
    }  # fmt: skip
    assert {k: n for k, n in counted.items() if n} == expected
    assert set(expected) < set(counted)  # the other cases are there too, at 0
    values = {v for (name, pairs) in found if name.startswith('shoal_') for _, v in pairs}
    assert not {v for v in values if 'alice' in v or 'mallory' in v or 'bob' in v}


def test_refused_permissions_count_by_operation_and_the_refused_attach_by_condition(
    start_broker, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    users = write_users(tmp_path / 'users.json')
    b = start_broker(env={'SHOAL_USERS_FILE': str(users), 'SHOAL_ALLOW_ANONYMOUS': 'false'})
    bob = _login(b, 'bob')  # may only browse orders.* and send to audit
    try:
        with pytest.raises(LinkDetached, match=DENIED):
            sender(bob, 'orders.new')
        with pytest.raises(LinkDetached, match=DENIED):
            receiver(bob, 'orders.new')
        relay = sender(bob, None)  # the anonymous relay: refused message by message
        assert send_with_outcome(bob, relay, Message(address='orders.new', body='x')) == (
            Delivery.REJECTED, DENIED)  # fmt: skip
        assert send_with_outcome(bob, relay, Message(address='audit', body='x'))[0] == (
            Delivery.ACCEPTED)  # fmt: skip
    finally:
        bob.close()
    found = samples(b)
    assert value(found, 'shoal_authorization_failures_total', operation='send') == 2
    assert value(found, 'shoal_authorization_failures_total', operation='consume') == 1
    refused = 'shoal_links_refused_total'
    assert value(found, refused, role='producer', condition=DENIED) == 1
    assert value(found, refused, role='consumer', condition=DENIED) == 1
    assert value(found, 'shoal_publishes_refused_total', reason='redis_full') == 0


def test_refused_connections_and_links_count_by_condition(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_MAX_CONNECTIONS': '2', 'SHOAL_MAX_LINKS_PER_SESSION': '1'})
    refused = 'shoal_connections_refused_total'
    holder = jms_connect(b.url, f'ID:{address}')
    with pytest.raises(ConnectionException, match='invalid-field'):
        jms_connect(b.url, f'ID:{address}')  # the ClientID is taken
    assert value(samples(b), refused, condition='amqp:invalid-field') == 1
    holder.close()
    wait_for(lambda: value(samples(b), 'shoal_connections') == 0, 10, 'the connections to end')
    first, second = connect(b.url), connect(b.url)
    with pytest.raises(ConnectionException, match=LIMIT):
        connect(b.url)
    receiver(first, address)
    with pytest.raises(LinkDetached, match=LIMIT):
        receiver(first, address)  # a second link on the session
    found = samples(b)
    assert value(found, refused, condition=LIMIT) == 1
    assert value(found, refused, condition='amqp:invalid-field') == 1
    assert value(found, 'shoal_links_refused_total', role='consumer', condition=LIMIT) == 1
    first.close()
    second.close()


def test_a_memory_ceiling_shows_its_producers_as_blocked(start_broker, address: str) -> None:  # type: ignore[no-untyped-def]
    b = start_broker(env={'SHOAL_MEMORY_CEILING_MB': '1'})  # below what the process uses
    conn = connect(b.url)
    try:
        sender(conn, address)
        sender(conn, f'{address}-2')
        blocked = 'shoal_producers_blocked'
        wait_for(lambda: value(samples(b), blocked, reason='memory_ceiling') == 2, 10,
                 'two producers blocked')  # fmt: skip
        assert value(samples(b), blocked, reason='redis_watermark') == 0
    finally:
        conn.close()


def test_the_redis_watermark_blocks_producers_and_counts_the_refused_messages(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    # 64 MiB of maxmemory with a watermark of 1 %: an empty Redis is over it, with room to spare
    redis = RedisServer(None, '--maxmemory', '64mb', '--maxmemory-policy', 'noeviction')
    try:
        b = start_broker(redis_url=redis.url, env={'SHOAL_REDIS_MEMORY_HIGH_WATERMARK': '0.01'})
        conn = connect(b.url)
        snd = sender(conn, address)
        wait_for(lambda: value(samples(b), 'shoal_producers_blocked', reason='redis_watermark')
                 == 1, 10, 'a producer blocked by the watermark')  # fmt: skip
        for _ in range(3):
            assert send_with_outcome(conn, snd, Message(body='x')) == (Delivery.REJECTED, LIMIT)
        found = samples(b)
        assert value(found, 'shoal_publishes_refused_total', reason='redis_watermark') == 3
        assert value(found, 'shoal_producers_blocked', reason='memory_ceiling') == 0
        conn.close()
    finally:
        redis.stop()


def test_refused_messages_count_an_address_limit_and_a_full_redis_apart(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    redis = RedisServer(None, '--maxmemory-policy', 'noeviction')
    admin = redis_lib.Redis.from_url(redis.url)
    try:
        limits = {'SHOAL_REDIS_MEMORY_HIGH_WATERMARK': '0', 'SHOAL_MAX_BACKLOG_PER_ADDRESS': '1'}
        b = start_broker(redis_url=redis.url, env=limits)
        conn = connect(b.url)
        snd = sender(conn, address)
        assert send_with_outcome(conn, snd, Message(body='kept'))[0] == Delivery.ACCEPTED
        assert send_with_outcome(conn, snd, Message(body='over')) == (Delivery.REJECTED, LIMIT)
        other = sender(conn, f'{address}-other')
        admin.config_set('maxmemory', 1)  # Redis refuses every write
        try:
            assert send_with_outcome(conn, other, Message(body='x')) == (Delivery.REJECTED, LIMIT)
        finally:
            admin.config_set('maxmemory', 0)
        found = samples(b)
        refused = 'shoal_publishes_refused_total'
        assert value(found, refused, reason='address_limit') == 1
        assert value(found, refused, reason='redis_full') == 1
        assert value(found, refused, reason='redis_watermark') == 0
        conn.close()
    finally:
        admin.close()
        redis.stop()


def test_redis_connections_opened_again_after_a_reset_are_counted(
    start_broker, address: str
) -> None:  # type: ignore[no-untyped-def]
    redis = RedisServer(None)
    admin = redis_lib.Redis.from_url(redis.url)
    try:
        b = start_broker(redis_url=redis.url)
        conn = connect(b.url)
        snd = sender(conn, address)
        send_all(conn, address, ['before'])
        receiver(conn, address, credit=0)  # a consumer: the broker listens for its address
        reconnects = 'shoal_redis_reconnects_total'
        assert value(samples(b), reconnects, connection='pipeline') == 0
        assert value(samples(b), reconnects, connection='notifications') == 0
        admin.client_kill_filter(_type='normal')  # every connection but this one
        admin.client_kill_filter(_type='pubsub')
        deadline = time.monotonic() + 15  # a pipeline lost in the reset is released: send again
        while time.monotonic() < deadline:
            if send_with_outcome(conn, snd, Message(body='after'))[0] == Delivery.ACCEPTED:
                break
        wait_for(lambda: value(samples(b), reconnects, connection='notifications') >= 1, 15,
                 'the notification channel subscribed again')  # fmt: skip
        assert value(samples(b), reconnects, connection='pipeline') >= 1
        assert value(samples(b), 'shoal_redis_sentinel_switches_total') == 0
        conn.close()
    finally:
        admin.close()
        redis.stop()
