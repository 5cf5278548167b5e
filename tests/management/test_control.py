"""Pause and resume, subscriptions and connections through the management API, across real
replicas on one Redis (SHOAL_TEST_STORE picks the store mode)."""

import signal
import time
import uuid
from typing import Any

from amqpclient import Capabilities, connect, flush, nothing_more, receive_all, receiver, sender
from jmswire import JmsSource, durable_detach, jms_connect, subscriber
from mgmtapi import Api, quoted
from processes import BrokerProcess, wait_for
from proton import Message
from proton.utils import ConnectionClosed

from shoal_broker.management.operations import APPLY_WAIT_SECONDS
from shoal_broker.store import keys


def test_pause_holds_delivery_on_every_replica_until_resumed(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    api = Api(broker)
    conn = connect(second_broker.url)
    snd = sender(conn, address, Capabilities('queue'))
    rcv = receiver(conn, address, credit=10)
    # answered once every replica has applied it: a send right after is held everywhere
    assert api.post(f'/queues/{quoted(address)}/pause') == {'paused': True, 'unconfirmed': []}
    assert api.get(f'/queues/{quoted(address)}')['paused'] is True
    snd.send(Message(body='held', properties={'n': 1}))
    assert nothing_more(rcv, wait=1.0)
    assert api.get(f'/queues/{quoted(address)}')['ready'] == 1
    assert api.post(f'/queues/{quoted(address)}/resume') == {'paused': False, 'unconfirmed': []}
    assert [m.body for m in receive_all(rcv, 1)] == ['held']
    conn.close()


def test_a_pause_names_the_replica_that_has_not_applied_it(
    broker: BrokerProcess, second_broker: BrokerProcess, store_client: Any, address: str
) -> None:
    api = Api(broker)
    conn = connect(second_broker.url)
    snd = sender(conn, address, Capabilities('queue'))
    rcv = receiver(conn, address, credit=10)
    second_broker.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        reply = api.post(f'/queues/{quoted(address)}/pause')
        waited = time.monotonic() - started
    finally:
        second_broker.process.send_signal(signal.SIGCONT)
    assert reply == {'paused': True, 'unconfirmed': [second_broker.replica_id]}
    assert waited >= APPLY_WAIT_SECONDS
    # the command waits for it: applied within a look once it runs again
    control = keys.replica_control(second_broker.replica_id)
    wait_for(lambda: store_client.llen(control) == 0, 10, 'the refresh carried out')
    snd.send(Message(body='held', properties={'n': 1}))
    assert nothing_more(rcv, wait=1.0)
    api.post(f'/queues/{quoted(address)}/resume')
    assert [m.body for m in receive_all(rcv, 1)] == ['held']
    conn.close()


def test_a_pause_does_not_wait_for_a_replica_whose_lease_lapsed(
    broker: BrokerProcess, second_broker: BrokerProcess, store_client: Any, address: str
) -> None:
    """A replica killed stays registered until a live one reaps it: the pause is not held up
    by it, nor reported as waiting on it."""
    conn = connect(broker.url)
    sender(conn, address, Capabilities('queue'))  # the queue exists
    conn.close()
    gone = f'gone-{uuid.uuid4().hex[:8]}'
    store_client.sadd(keys.REPLICAS, gone)  # registered, no lease: as one just killed
    try:
        assert Api(broker).post(f'/queues/{quoted(address)}/pause') == {
            'paused': True, 'unconfirmed': [],
        }  # fmt: skip
    finally:
        store_client.srem(keys.REPLICAS, gone)
    Api(broker).post(f'/queues/{quoted(address)}/resume')


def test_a_pause_outlives_a_restart(start_broker: Any, address: str) -> None:
    first = start_broker()
    api = Api(first)
    conn = connect(first.url)
    sender(conn, address, Capabilities('queue')).send(Message(body='kept'))
    conn.close()
    api.post(f'/queues/{quoted(address)}/pause')
    first.stop()
    again = start_broker()
    conn = connect(again.url)
    rcv = receiver(conn, address, credit=10)
    assert nothing_more(rcv, wait=1.0)
    Api(again).post(f'/queues/{quoted(address)}/resume')
    assert [m.body for m in receive_all(rcv, 1)] == ['kept']
    conn.close()


def test_subscription_browse_purge_and_delete(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    name = f'sub-{uuid.uuid4().hex[:8]}'
    sid = f'durable:global:*:{name}'
    source = JmsSource('topic', 'shared', 'global', durable=True)
    conn = jms_connect(broker.url)
    rcv = subscriber(conn, address, f'{name}|global', source, credit=0)
    pub = sender(connect(broker.url), address, Capabilities('topic'))
    for n in range(3):
        pub.send(Message(body=n, properties={'n': n}))
    api = Api(second_broker)
    listed = api.get('/subscriptions', search=name)
    assert listed['total'] == 1
    assert listed['items'][0]['id'] == sid
    shown = api.get(f'/subscriptions/{quoted(sid)}/messages', selector='n > 0')
    assert [m['body']['text'] for m in shown['messages']] == ['1', '2']
    assert api.post(f'/subscriptions/{quoted(sid)}/pause')['paused'] is True
    assert api.get(f'/subscriptions/{quoted(sid)}')['paused'] is True
    assert api.post(f'/subscriptions/{quoted(sid)}/resume')['paused'] is False
    status, refused = api.call('DELETE', f'/subscriptions/{quoted(sid)}')
    assert status == 409, refused  # a consumer is attached
    assert api.post(f'/subscriptions/{quoted(sid)}/purge') == {'purged': 3, 'in_flight': 0}
    assert api.get(f'/subscriptions/{quoted(sid)}')['backlog'] == 0
    durable_detach(rcv)
    conn.close()
    assert api.call('DELETE', f'/subscriptions/{quoted(sid)}') == (200, {'deleted': sid})
    assert api.call('GET', f'/subscriptions/{quoted(sid)}')[0] == 404


def test_connections_are_listed_and_closed_from_any_replica(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    client_id = f'victim-{uuid.uuid4().hex[:8]}'
    conn = jms_connect(second_broker.url, client_id)
    rcv = receiver(conn, address, credit=1)
    api = Api(broker)

    def mine() -> list[dict[str, Any]]:
        return [c for c in api.get('/connections') if c['container_id'] == client_id]

    wait_for(lambda: len(mine()) == 1, 10, 'the connection listed')
    found = mine()[0]
    assert found['replica'] == second_broker.replica_id
    assert found['links'] >= 1
    missing = api.call('DELETE', f'/connections/{second_broker.replica_id}/999999999')
    assert missing[0] == 404
    assert api.call('DELETE', f'/connections/{found["replica"]}/{found["id"]}')[0] == 200
    closed: list[str] = []

    def gone() -> bool:
        try:
            flush(conn)
            rcv.receive(timeout=0.2)
        except ConnectionClosed as exc:
            closed.append(str(exc))
            return True
        except Exception:
            return False
        return False

    wait_for(gone, 10, 'the connection closed')
    assert 'forced' in closed[0]
    wait_for(lambda: not mine(), 15, 'the connection unlisted')


def test_rates_come_from_the_replicas_metric_records(start_broker: Any, address: str) -> None:
    b = start_broker(env={'SHOAL_METRICS_INTERVAL_SECONDS': '0.5'})
    conn = connect(b.url)
    snd = sender(conn, address, Capabilities('queue'))
    for n in range(5):
        snd.send(Message(body=n))
    receive_all(receiver(conn, address, credit=5), 5)
    api = Api(b)

    def rates() -> dict[str, Any]:
        found: dict[str, Any] = api.get(f'/queues/{quoted(address)}')['rates']
        return found

    seen: list[dict[str, Any]] = []

    def delivering() -> bool:
        seen[:] = [rates()]
        return bool(seen[0]['delivered_per_second'] > 0)

    wait_for(delivering, 15, 'a delivery rate')
    per_replica = seen[0]['delivered_per_second_per_replica']
    # another replica on the store (the module's broker) records every queue it knows, at 0
    assert per_replica[b.replica_id] > 0
    assert all(rate == 0 for replica, rate in per_replica.items() if replica != b.replica_id)
    conn.close()
