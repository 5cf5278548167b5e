"""The broker as a process: embedded Redis, health endpoints, graceful SIGTERM, trimming."""

import glob
import json
import os
import re
import signal
import tempfile
import time

import pytest
import redis
from amqpclient import Capabilities, connect, nothing_more, receive_all, receiver, send_all, sender
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message
from proton.utils import SendException


def test_without_a_redis_url_the_broker_runs_its_own_and_keeps_messages_across_restarts(
    tmp_path, address: str
) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / 'redis-data')
    first = BrokerProcess(None, data_dir=data)
    conn = connect(first.url)
    sender(conn, address).send(Message(body='survives', durable=True))
    conn.close()
    assert first.stop() == 0
    assert (tmp_path / 'redis-data').exists()
    second = BrokerProcess(None, data_dir=data)
    try:
        conn = connect(second.url)
        assert receive_all(receiver(conn, address, credit=1), 1)[0].body == 'survives'
        conn.close()
    finally:
        assert second.stop() == 0


def test_the_embedded_redis_does_not_outlive_a_killed_broker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    broker = BrokerProcess(None, data_dir=str(tmp_path / 'redis-data'))
    match = re.search(r'embedded redis-server pid (\d+)', broker.log())
    assert match, broker.log()
    redis_pid = int(match.group(1))
    assert os.path.exists(f'/proc/{redis_pid}')
    broker.process.kill()  # no chance to stop its Redis itself
    killed_pid = broker.process.pid
    assert broker.stop() == -signal.SIGKILL
    wait_for(lambda: not _alive(redis_pid), 10, f'redis-server {redis_pid} to exit')
    # nor to remove its socket directory: the next broker with an embedded Redis does
    left = glob.glob(os.path.join(tempfile.gettempdir(), f'shoal-redis-{killed_pid}-*'))
    assert len(left) == 1, left
    after = BrokerProcess(None, data_dir=str(tmp_path / 'redis-data'))
    try:
        assert not os.path.exists(left[0])
    finally:
        assert after.stop() == 0


def test_ctrl_c_stops_the_broker_before_its_embedded_redis(tmp_path, address: str) -> None:  # type: ignore[no-untyped-def]
    # a terminal's Ctrl-C signals the whole foreground process group (e.g. `make run`): the
    # embedded Redis used to stop with the broker, so what the broker handed back on its way out
    # never arrived, and after a restart its held messages came back only once its lease had
    # lapsed, counted as failed deliveries
    data = str(tmp_path / 'redis-data')
    first = BrokerProcess(None, data_dir=data, own_session=True)
    conn = connect(first.url)
    send_all(conn, address, range(3))
    rcv = receiver(conn, address, credit=3)
    conn.wait(lambda: rcv.fetcher.has_message == 3, timeout=10)  # held, unsettled
    os.killpg(first.pid, signal.SIGINT)
    assert first.process.wait(timeout=15) == 0
    with pytest.raises(Exception, match='amqp:connection:forced'):
        conn.wait(lambda: False, timeout=5)
    assert 'could not release the lease' not in first.log(), first.log()
    first.stop()
    second = BrokerProcess(None, data_dir=data)
    try:
        conn = connect(second.url)
        again = receive_all(receiver(conn, address, credit=3), 3)
        assert sorted(m.body for m in again) == [0, 1, 2]
        # handed back (not reaped, which would count a second attempt); they went out and were
        # never settled, so the next consumer is told they may be repeats
        assert all(m.delivery_count == 1 for m in again)
        conn.close()
    finally:
        assert second.stop() == 0


def _alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[1][0] != 'Z'  # a zombie has exited
    except FileNotFoundError:
        return False


def test_health_endpoints_answer(broker: BrokerProcess) -> None:
    assert broker.http_get('/livez') == (200, b'ok\n')
    status, body = broker.http_get('/readyz')
    assert status == 200
    assert json.loads(body) == {
        'accepting': True, 'redis': True, 'store_memory_watch': True,
        'held_sends': 0, 'held_sends_oldest_seconds': 0.0,  # figures beside the checks
    }  # fmt: skip
    status, body = broker.http_get('/metrics')
    assert status == 200
    assert b'# TYPE' in body
    assert broker.http_get('/nope')[0] == 404


def test_readiness_fails_while_redis_is_down(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = RedisServer()
    b = BrokerProcess(server.url)
    try:
        server.stop()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b.http_get('/readyz')[0] == 200:
            time.sleep(0.1)
        status, body = b.http_get('/readyz')
        assert status == 503
        assert json.loads(body)['redis'] is False
        assert b.http_get('/livez')[0] == 200
    finally:
        b.stop()


def test_sigterm_closes_connections_returns_held_messages_and_exits_cleanly(
    redis_server: RedisServer, broker: BrokerProcess, address: str
) -> None:
    leaving = BrokerProcess(redis_server.url, replica_id='leaving')
    conn = connect(leaving.url)
    send_all(conn, address, range(3))
    rcv = receiver(conn, address, credit=3)
    conn.wait(lambda: rcv.fetcher.has_message == 3, timeout=10)  # held, unsettled
    started = time.monotonic()
    leaving.process.send_signal(signal.SIGTERM)
    assert leaving.process.wait(timeout=15) == 0
    assert time.monotonic() - started < 10
    with pytest.raises(Exception, match='amqp:connection:forced'):
        conn.wait(lambda: False, timeout=5)
    leaving.stop()
    other = connect(broker.url)  # the survivor serves what the leaver held
    again = receive_all(receiver(other, address, credit=3), 3)
    assert sorted(m.body for m in again) == [0, 1, 2]
    # out and never settled within the drain: returned as by a consumer that goes away
    assert all(m.delivery_count == 1 for m in again)
    other.close()


def test_consumed_entries_are_trimmed_and_unconsumed_ones_kept(
    start_broker, redis_server: RedisServer, address: str
) -> None:  # type: ignore[no-untyped-def]
    # the smallest replica id: the live replica that sorts first trims for all
    b = start_broker(env={'SHOAL_TRIM_INTERVAL_SECONDS': '0.2'}, replica_id='0-trimming')
    conn = connect(b.url)
    send_all(conn, address, range(50))
    first = receiver(conn, address, credit=40)
    receive_all(first, 40)
    topic = f'{address}-topic'
    sub = receiver(conn, topic, Capabilities('topic'), credit=10)
    sender(conn, topic, Capabilities('topic')).send(Message(body='t'))
    receive_all(sub, 1)
    client = redis.Redis.from_url(redis_server.url)
    stream, topic_stream = f'shoal:{{a:{address}}}:p:5', f'shoal:{{a:{topic}}}:p:5'
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (client.xlen(stream), client.xlen(topic_stream)) != (
        10,
        0,
    ):
        time.sleep(0.1)
    assert client.xlen(stream) == 10  # the ten not yet consumed
    assert client.xlen(topic_stream) == 0
    client.close()
    first.close()  # its prefetch may hold some of the rest: they return to the queue
    rest = receive_all(receiver(conn, address, credit=10), 10)
    assert sorted(m.body for m in rest) == list(range(40, 50))
    assert nothing_more(receiver(conn, address, credit=1))
    conn.close()


def test_during_a_redis_outage_messages_are_released_not_lost_and_service_resumes(
    address: str,
) -> None:
    """With the hold off (tests/chaos/test_store_hold.py: with it, sends wait instead)."""
    server = RedisServer()
    b = BrokerProcess(server.url, env={'SHOAL_STORE_HOLD_SECONDS': '0'})
    try:
        conn = connect(b.url)
        snd = sender(conn, address)
        snd.send(Message(body='before'))
        server.stop()
        with pytest.raises(SendException) as refused:
            snd.send(Message(body='during'))
        assert refused.value.state == Delivery.RELEASED  # the client knows it was not stored
        conn.close()
        server = RedisServer(port=server.port)  # Redis is back (empty: no AOF in this test)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and b.http_get('/readyz')[0] != 200:
            time.sleep(0.1)
        conn = connect(b.url)
        sender(conn, f'{address}-after').send(Message(body='after'))
        assert receive_all(receiver(conn, f'{address}-after', credit=1), 1)[0].body == 'after'
        conn.close()
    finally:
        b.stop()
        server.stop()
