"""A broker started on a Redis written by an older version (the address registry as the one
record of each address, named subscriptions in a SET, no epochs) lays the keys out under its lock
and finds every queue, subscription and message (docs/redis-modes.md, "The key layout")."""

import os
import uuid

import pytest
import redis
from amqpclient import connect, receive_all, receiver, send_all
from jmswire import JmsSource, durable_detach, jms_connect, subscriber
from olderlayout import back_to_the_older_layout
from processes import RedisServer

from shoal_broker.store import keys
from shoal_broker.store.layout import LOCK

pytestmark = pytest.mark.skipif(
    os.environ.get('SHOAL_TEST_STORE', 'standalone') == 'cluster',
    reason='an older layout reaches a cluster only by import (test_cluster_migration.py)',
)


def test_a_broker_lays_out_an_older_redis_and_finds_everything(
    start_broker, redis_server: RedisServer, address: str
) -> None:  # type: ignore[no-untyped-def]
    queue, topic = f'{address}-q', f'{address}-t'
    app = f'app-{uuid.uuid4().hex[:8]}'
    subscription_id = f'durable:client:{app}:kept'
    older = start_broker()
    conn = connect(older.url)
    send_all(conn, queue, range(3))
    conn.close()
    jms = jms_connect(older.url, app)
    durable = subscriber(jms, topic, 'kept', JmsSource('topic', durable=True))
    durable_detach(durable)
    jms.close()
    conn = connect(older.url)
    send_all(conn, topic, range(10, 13))
    conn.close()
    assert older.stop() == 0

    client = redis.Redis.from_url(redis_server.url)
    try:
        back_to_the_older_layout(client, {queue: 'queue', topic: 'topic'}, subscription_id)
        assert not client.exists(keys.AddressKeys.of(queue).meta)

        newer = start_broker()
        for address_, kind in ((queue, b'queue'), (topic, b'topic')):
            k = keys.AddressKeys.of(address_)
            assert client.hget(k.meta, 'kind') == kind
            epoch = client.hget(k.meta, 'epoch')
            assert client.hget(keys.ADDRESSES, address_) == kind + b':' + epoch
        epoch = client.hget(keys.SubscriptionKeys.of(subscription_id).definition, 'epoch')
        assert epoch
        assert client.hget(keys.SUBSCRIPTION_INDEX, subscription_id) == epoch
        assert not client.exists(LOCK)

        conn = connect(newer.url)
        assert sorted(m.body for m in receive_all(receiver(conn, queue), 3)) == [0, 1, 2]
        conn.close()
        jms = jms_connect(newer.url, app)
        durable = subscriber(jms, topic, 'kept', JmsSource('topic', durable=True))
        assert sorted(m.body for m in receive_all(durable, 3)) == [10, 11, 12]
        jms.close()
    finally:
        client.close()
