"""
The broker with rhea (npm), an AMQP 1.0 client independent of proton, and across the two clients.

Each rhea run is ``tests/rhea/client.js`` in a subprocess: bounded by its own timeout, it prints
one JSON line of results. ``make node-deps`` (part of ``make test``) installs rhea.
"""

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from amqpclient import connect, nothing_more, receive_all, receiver, sender
from processes import BrokerProcess, RedisServer
from proton import Message, symbol

RHEA_DIR = Path(__file__).resolve().parent.parent / 'rhea'
CLIENT_TIMEOUT_MS = 20_000


def _command(args: dict[str, Any]) -> list[str]:
    node = shutil.which('node')
    if node is None:
        pytest.fail('node is not installed: run `make node-deps` (make test installs it)')
    if not (RHEA_DIR / 'node_modules' / 'rhea').is_dir():
        pytest.fail(f'rhea is not installed in {RHEA_DIR / "node_modules"}: run `make node-deps`')
    return [node, 'client.js', json.dumps({'timeout_ms': CLIENT_TIMEOUT_MS, **args})]


def _result(stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    assert returncode == 0, f'rhea client exited {returncode}\nstdout: {stdout}\nstderr: {stderr}'
    assert len(lines) == 1, f'rhea client printed {len(lines)} lines\nstdout: {stdout}'
    result: dict[str, Any] = json.loads(lines[0])
    assert result['ok'] is True, result
    return result


def rhea(broker: BrokerProcess, mode: str, **args: Any) -> dict[str, Any]:
    """Run the rhea client to completion against ``broker``; its parsed result."""
    done = subprocess.run(
        _command({'port': broker.port, 'mode': mode, **args}),
        cwd=RHEA_DIR,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_MS / 1000 + 10,
        check=False,
    )
    return _result(done.stdout, done.stderr, done.returncode)


def start_rhea(broker: BrokerProcess, mode: str, **args: Any) -> subprocess.Popen[str]:
    """Start the rhea client in the background; finish it with ``rhea_result``."""
    return subprocess.Popen(
        _command({'port': broker.port, 'mode': mode, **args}),
        cwd=RHEA_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rhea_result(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        stdout, stderr = process.communicate(timeout=CLIENT_TIMEOUT_MS / 1000 + 10)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    return _result(stdout, stderr, process.returncode)


ACCEPTED = {'outcome': 'accepted'}


def test_rhea_round_trips_a_hundred_messages_in_order_with_properties_and_annotations(
    broker: BrokerProcess, address: str
) -> None:
    result = rhea(broker, 'roundtrip', address=address, count=100)
    assert result['outcomes'] == [ACCEPTED] * 100
    assert result['bodies'] == [f'm{i}' for i in range(100)]
    assert result['delivery_counts'] == [0] * 100
    assert result['properties'] == [{'i': i} for i in range(100)]
    for i, annotations in enumerate(result['annotations']):
        assert annotations['x-opt-rhea-test'] == 'rhea'
        assert annotations['x-opt-rhea-index'] == i


def test_rhea_presettled_both_ways_is_handed_over_in_order_without_redis(
    broker: BrokerProcess, redis_server: RedisServer, address: str
) -> None:
    """rhea's pre-settled sender and receiver on one connection: the messages go from producer
    to consumer on the broker (subscriptions.py, take), in order and intact."""
    result = rhea(broker, 'roundtrip', address=address, count=200, presettled=True)
    assert result['bodies'] == [f'm{i}' for i in range(200)]
    assert result['properties'] == [{'i': i} for i in range(200)]
    assert [a['x-opt-rhea-index'] for a in result['annotations']] == list(range(200))
    client = redis.Redis.from_url(redis_server.url)
    try:
        stored = int(client.xinfo_stream(f'shoal:{{a:{address}}}:p:5')['entries-added'])
    finally:
        client.close()
    assert stored < 200  # a receiver waiting with credit took them without the store


def test_messages_sent_by_rhea_are_received_by_proton(broker: BrokerProcess, address: str) -> None:
    result = rhea(broker, 'send', address=address, count=20)
    assert result['outcomes'] == [ACCEPTED] * 20
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=50)
    messages = receive_all(rcv, 20)
    assert [m.body for m in messages] == [f'm{i}' for i in range(20)]
    assert [m.properties for m in messages] == [{'i': i} for i in range(20)]
    for i, m in enumerate(messages):
        assert m.annotations[symbol('x-opt-rhea-test')] == 'rhea'
        assert m.annotations[symbol('x-opt-rhea-index')] == i
        assert m.delivery_count == 0
    assert nothing_more(rcv)
    conn.close()


def test_messages_sent_by_proton_are_received_by_rhea(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    for i in range(20):
        snd.send(
            Message(
                body=f'p{i}',
                properties={'i': i},
                annotations={symbol('x-opt-proton-index'): i},
            )
        )
    conn.close()
    result = rhea(broker, 'receive', address=address, count=20, linger_ms=300)
    assert result['bodies'] == [f'p{i}' for i in range(20)]
    assert result['delivery_counts'] == [0] * 20
    assert result['properties'] == [{'i': i} for i in range(20)]
    assert [a['x-opt-proton-index'] for a in result['annotations']] == list(range(20))
    assert result['extra'] == []


def test_a_rhea_producer_and_consumer_on_two_replicas_see_every_message_exactly_once(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    consumer = start_rhea(second_broker, 'receive', address=address, count=100, linger_ms=500)
    produced = rhea(broker, 'send', address=address, count=100)
    consumed = rhea_result(consumer)
    assert produced['outcomes'] == [ACCEPTED] * 100
    assert sorted(consumed['bodies'], key=lambda b: int(b[1:])) == [f'm{i}' for i in range(100)]
    assert consumed['bodies'] == [f'm{i}' for i in range(100)], 'one producer: order is kept'
    assert consumed['extra'] == []
    conn = connect(broker.url)
    assert nothing_more(receiver(conn, address, credit=10))
    conn.close()


def test_rhea_drain_on_an_empty_queue_is_answered_quickly_with_nothing(
    broker: BrokerProcess, address: str
) -> None:
    result = rhea(broker, 'drain', address=address)
    assert result['drained_ms'] < 1000
    assert result['received'] == 0
    assert result['credit'] == 0


def test_rhea_drain_on_a_queue_with_fewer_messages_than_credit_delivers_them_then_answers(
    broker: BrokerProcess, address: str
) -> None:
    assert rhea(broker, 'send', address=address, count=3)['outcomes'] == [ACCEPTED] * 3
    result = rhea(broker, 'drain', address=address)
    assert result['drained_ms'] < 1000
    assert result['bodies'] == ['m0', 'm1', 'm2']
    assert result['credit'] == 0


def test_a_temporary_queue_works_from_rhea(broker: BrokerProcess) -> None:
    result = rhea(broker, 'temporary')
    assert result['address']
    assert result['body'] == 'mtemporary'
