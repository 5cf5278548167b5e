"""The ``shoal`` introspection CLI, run as a real command against what real brokers put in Redis."""

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from amqpclient import Capabilities, connect, receive_all, send_all, sender
from jmswire import JmsSource, jms_connect, subscriber
from processes import BrokerProcess, RedisServer, free_port
from proton import Message

ENV_REDIS_URL = 'SHOAL_REDIS_URL'


def shoal(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_REDIS_URL, 'XDG_RUNTIME_DIR')}
    env['SHOAL_DATA_DIR'] = f'{os.devnull}/shoal'  # never a `make run` broker's data
    if env_url is not None:
        env[ENV_REDIS_URL] = env_url
    return subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', *args],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def listed(redis_url: str, command: str) -> list[dict[str, Any]]:
    done = shoal('--redis-url', redis_url, command, '--json')
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return rows


def one(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, rows)
    return found[0]


def test_shoal_lists_queues_subscriptions_and_clients_from_redis(
    broker: BrokerProcess, second_broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    queue, topic, name = f'{address}-q', f'{address}-t', f'{address}-sub'
    client_id = f'admin-client-{uuid.uuid4().hex[:8]}'
    pub = connect(broker.url)
    send_all(pub, queue, ['one', 'two', 'three'], Capabilities('queue'))
    # a shared durable subscription with a selector and one consumer on each replica
    source = JmsSource('topic', 'shared', 'global', durable=True, selector='a = 1')
    on_a, on_b = jms_connect(broker.url), jms_connect(second_broker.url)
    rcv_a = subscriber(on_a, topic, f'{name}|global', source, credit=0)
    subscriber(on_b, topic, f'{name}|global', source, credit=0)
    holder = jms_connect(broker.url, client_id)
    to_topic = sender(pub, topic, Capabilities('topic'))
    for n in range(4):
        to_topic.send(Message(body=n, properties={'a': 1}))

    addresses = listed(redis_server.url, 'addresses')
    assert one(addresses, name=queue)['kind'] == 'queue'
    assert one(addresses, name=topic)['kind'] == 'topic'

    q = one(listed(redis_server.url, 'queues'), name=queue)
    assert (q['backlog'], q['ready'], q['in_flight']) == (3, 3, 0)

    sub = one(listed(redis_server.url, 'subscriptions'), name=name)
    assert sub['kind'] == 'shared durable'
    assert (sub['durable'], sub['shared'], sub['no_local']) == (True, True, False)
    assert (sub['namespace'], sub['scope'], sub['client_id']) == ('global', 'global', '')
    assert (sub['topic'], sub['selector']) == (topic, 'a = 1')
    assert sub['consumers'] == {'replica-a': 1, 'replica-b': 1}
    assert sub['backlog'] == 4  # nobody had credit: all four wait

    assert [m.body for m in receive_all(rcv_a, 1)] == [0]  # one consumed (and acknowledged)
    sub = one(listed(redis_server.url, 'subscriptions'), name=name)
    assert sub['backlog'] == 3

    clients = listed(redis_server.url, 'clients')
    assert one(clients, client_id=client_id)['replica'] == 'replica-a'

    for command, expected in [
        ('addresses', [queue, topic]),
        ('queues', [queue]),
        ('subscriptions', [name, topic, 'shared durable', 'a = 1', 'replica-a=1,replica-b=1']),
        ('clients', [client_id, 'replica-a']),
    ]:
        done = shoal('--redis-url', redis_server.url, command)
        assert done.returncode == 0, done.stderr
        header = done.stdout.splitlines()[0]
        assert header.split()[0] in ('NAME', 'CLIENT-ID')
        for text in expected:
            assert text in done.stdout, (command, text, done.stdout)

    for conn in (holder, on_a, on_b, pub):
        conn.close()


def test_a_queue_backlog_counts_messages_at_a_consumer_as_in_flight(
    broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    conn = connect(broker.url)
    send_all(conn, address, range(3), Capabilities('queue'))
    rcv = conn.create_receiver(address, credit=2, name=f'r-{uuid.uuid4().hex[:8]}')
    rcv.receive(timeout=10)  # received, not settled: the broker holds it for this consumer
    q = one(listed(redis_server.url, 'queues'), name=address)
    assert q['backlog'] == 3
    assert q['ready'] + q['in_flight'] == 3
    assert q['in_flight'] >= 1
    conn.close()


def test_the_url_comes_from_shoal_redis_url_when_not_given(redis_server: RedisServer) -> None:
    done = shoal('clients', '--json', env_url=redis_server.url)
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)


def test_unreachable_redis_exits_1_with_a_message() -> None:
    done = shoal('--redis-url', f'redis://127.0.0.1:{free_port()}/0', 'queues')
    assert done.returncode == 1
    assert 'Redis unreachable' in done.stderr
    assert done.stdout == ''


@pytest.mark.parametrize('env_url', [None, ''])
def test_no_redis_url_exits_2_with_a_message(env_url: str | None) -> None:
    done = shoal('queues', env_url=env_url)
    assert done.returncode == 2
    assert ENV_REDIS_URL in done.stderr
    assert '--redis-url' in done.stderr
