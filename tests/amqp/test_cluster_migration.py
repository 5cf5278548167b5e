"""A standalone deployment moved to Redis Cluster the way docs/redis-modes.md says ("When to move
to Cluster, and how"): brokers on a standalone redis-server leave every kind of state behind, are
stopped (SIGTERM, as a scale to zero; one of them killed, as a pod that did not stop in time),
``redis-cli --cluster import`` copies the keys into an empty cluster of three primaries, and
brokers on the ``redis+cluster://`` URL deliver every message exactly once where it belongs: the
stored ones, each subscription's, the ones that were out at a consumer (with their delivery
counts) and the delayed ones (not before their time); the declarations are known there."""

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from amqpclient import connect, nothing_more, receiver, send_all, sender
from jmswire import JmsSource, durable_detach, jms_connect, subscriber
from processes import LOOPBACK, BrokerProcess, RedisServer
from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver
from redisclusters import ClusterGroup

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.store import keys
from shoal_broker.store.declarations import Provisioned, SubscriptionDeclaration
from shoal_broker.store.registry import Registry

FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}
"""The crashed replica's lease lapses soon after the cluster's brokers start, so they reap it."""

DELAY_SECONDS = 8.0
"""How far ahead the delayed messages are due: past the stop, the import and the new brokers'
start, so they are still held in the cluster's schedule when it takes over."""

SHARED = JmsSource('topic', 'shared', 'global', durable=True)
EXCLUSIVE = JmsSource('topic', durable=True)


@pytest.fixture
def standalone() -> Iterator[RedisServer]:
    """The deployment's own Redis, holding nothing but what its brokers write."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def empty_cluster() -> Iterator[ClusterGroup]:
    """A new cluster of three primaries with a replica each: the import's target."""
    cluster = ClusterGroup()
    yield cluster
    cluster.stop()


def import_into(cluster: ClusterGroup, source: RedisServer) -> subprocess.CompletedProcess[str]:
    """The documented command, as an operator types it."""
    binary = shutil.which('redis-cli')
    assert binary, 'redis-cli is not installed (make test installs it)'
    return subprocess.run(
        [binary, '--cluster', 'import', f'{LOOPBACK}:{cluster.seed.port}',
         '--cluster-from', f'{LOOPBACK}:{source.port}', '--cluster-copy'],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def shoal(redis_url: str, command: str) -> list[dict[str, Any]]:
    """The ``shoal`` CLI's view (JSON rows)."""
    done = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', redis_url, command, '--json'],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return rows


def hold(
    conn: BlockingConnection, address: str, count: int, *options: Any, name: str | None = None
) -> list[tuple[Any, int]]:
    """Attach a consumer, give it exactly ``count`` credit (the blocking client's own flow
    control would hand out more as messages arrive) and settle none of what it receives:
    (body, delivery-count) of each."""
    rcv = conn.create_receiver(
        address, credit=0, name=name or f'held-{uuid.uuid4().hex[:8]}', options=list(options)
    )
    rcv.link.flow(count)
    conn.wait(lambda: rcv.fetcher.has_message == count, timeout=10, msg='the held deliveries')
    return [(m.body, m.delivery_count) for m in (rcv.fetcher.pop() for _ in range(count))]


def take(rcv: BlockingReceiver, count: int, timeout: float = 10) -> list[tuple[Any, int]]:
    """Receive and accept ``count`` messages: (body, delivery-count) of each."""
    got = []
    for _ in range(count):
        message = rcv.receive(timeout=timeout)
        got.append((message.body, message.delivery_count))
        rcv.accept()
    return got


def delayed(body: str, due_ms: int) -> Message:
    return Message(body=body, annotations={'x-opt-delivery-time': due_ms})


def persistent_keys(client: redis.Redis) -> set[bytes]:
    """Every key without a TTL (a lease may lapse while it is being copied)."""
    return {key for key in client.scan_iter(count=1000) if client.ttl(key) == -1}


async def declare(url: str, queue: str, topic: str, subscription: SubscriptionKey) -> None:
    """What the operator writes for a Queue and a SharedSubscription resource."""
    async with Registry.from_url(url) as registry:
        assert await registry.declare_queue(queue, 'shop/idle') is Provisioned.CREATED
        declaration = SubscriptionDeclaration(
            key=subscription, topic=topic, selector=None, max_consumers=None,
            owner='shop/audit', generation=1,
        )  # fmt: skip
        outcome = await registry.declare_subscription(declaration, recreate=False)
        assert outcome is Provisioned.CREATED


async def declared_view(url: str, queue: str) -> tuple[dict[str, str], bool, str]:
    async with Registry.from_url(url) as registry:
        state = await registry.queue_state(queue)
        return await registry.declared(), state.exists, state.owner


def test_a_standalone_deployment_imported_into_a_cluster_delivers_everything_once(
    standalone: RedisServer, empty_cluster: ClusterGroup
) -> None:
    prefix = f'mig-{uuid.uuid4().hex[:8]}'
    stored, idle, returned, held, crashed, later, topic = (
        f'{prefix}-{name}'
        for name in ('stored', 'idle', 'returned', 'held', 'crashed', 'later', 'news')
    )  # fmt: skip
    app = f'{prefix}-app'
    audit = SubscriptionKey(name=f'{prefix}-audit', scope=Scope.GLOBAL, client_id='', durable=True)
    shared_name, kept_name = f'{prefix}-shared', f'{prefix}-kept'

    # -- the standalone deployment: two replicas, and a third that will crash --------------------
    first = BrokerProcess(standalone.url, replica_id=f'{prefix}-a', env=FAST_LEASE)
    second = BrokerProcess(standalone.url, replica_id=f'{prefix}-b', env=FAST_LEASE)
    doomed = BrokerProcess(standalone.url, replica_id=f'{prefix}-c', env=FAST_LEASE)
    new: list[BrokerProcess] = []
    try:
        asyncio.run(declare(standalone.url, idle, topic, audit))
        jms = jms_connect(first.url, app)
        durable_detach(subscriber(jms, topic, kept_name, EXCLUSIVE))
        durable_detach(subscriber(jms, topic, f'{shared_name}|global', SHARED))
        jms.close()

        producer = connect(first.url)
        to_stored = sender(producer, stored)
        for body, priority in (('s0', 4), ('s1', 9), ('s2', 4), ('s3', 9), ('s4', 4)):
            to_stored.send(Message(body=body, priority=priority))
        send_all(producer, topic, [f't{n}' for n in range(4)])
        send_all(producer, returned, [f'r{n}' for n in range(4)])
        send_all(producer, held, [f'h{n}' for n in range(3)])
        send_all(producer, crashed, [f'k{n}' for n in range(2)])
        due_ms = int((time.time() + DELAY_SECONDS) * 1000)
        sender(producer, later).send(delayed('late-q', due_ms))
        sender(producer, topic).send(delayed('late-t', due_ms))
        producer.close()

        # a consumer that got r0 and r1 and went away without settling them, twice for r0
        for credit in (2, 1):
            gone = connect(second.url)
            assert len(hold(gone, returned, credit)) == credit
            gone.close()

        # deliveries out at consumers when their brokers stop: h0-h2 and two of the shared
        # subscription's on the replica that stops cleanly, k0 and k1 on the one that crashes
        at_second = connect(second.url)
        assert len(hold(at_second, held, 3)) == 3
        at_second_jms = jms_connect(second.url)
        shared_out = hold(at_second_jms, topic, 2, SHARED, name=f'{shared_name}|global')
        assert shared_out == [('t0', 0), ('t1', 0)]
        at_doomed = connect(doomed.url)
        assert len(hold(at_doomed, crashed, 2)) == 2

        # -- scale to zero: SIGTERM, and the crashed one gets no chance to clean up ------------
        assert first.stop() == 0
        assert second.stop() == 0
        doomed.process.send_signal(signal.SIGKILL)
        doomed.stop()
        for conn in (at_second, at_second_jms, at_doomed):
            try:
                conn.close()
            except Exception:  # the broker is gone: nothing to say goodbye to
                pass

        # -- the import, as documented ---------------------------------------------------------
        source = redis.Redis.from_url(standalone.url)
        before = persistent_keys(source)
        source.close()
        done = import_into(empty_cluster, standalone)
        assert done.returncode == 0, done.stdout + done.stderr
        copied = empty_cluster.client()
        try:
            missing = {key for key in before if not copied.exists(key)}
            assert not missing, sorted(missing)
            # still scheduled: no broker has run since they were stored
            for address in (later, topic):
                assert copied.zcard(keys.AddressKeys.of(address).scheduled) == 1
        finally:
            copied.close()

        # -- the brokers on the cluster URL ----------------------------------------------------
        url = empty_cluster.url
        new.append(BrokerProcess(url, replica_id=f'{prefix}-x', env=FAST_LEASE))
        new.append(BrokerProcess(url, replica_id=f'{prefix}-y', env=FAST_LEASE))
        x, y = new

        queues = {row['name']: row for row in shoal(url, 'queues')}
        assert queues[stored]['backlog'] == 5
        assert queues[idle]['backlog'] == 0
        assert queues[returned]['backlog'] == 4
        assert queues[held]['backlog'] == 3
        subscriptions = {row['id']: row for row in shoal(url, 'subscriptions')}
        shared_id = SubscriptionKey(shared_name, Scope.GLOBAL, '', True).id
        kept_id = SubscriptionKey(kept_name, Scope.CLIENT, app, True).id
        assert {shared_id, kept_id, audit.id} <= set(subscriptions)
        assert subscriptions[kept_id]['kind'] == 'exclusive durable'
        assert subscriptions[shared_id]['kind'] == 'shared durable'
        assert all(subscriptions[i]['topic'] == topic for i in (shared_id, kept_id, audit.id))
        declared, exists, owner = asyncio.run(declared_view(url, idle))
        assert (exists, owner) == (True, 'shop/idle')
        assert declared[keys.provisioned_queue(idle)] == 'shop/idle'
        assert declared[keys.provisioned_subscription(audit.id)] == 'shop/audit'

        on_x, on_y = connect(x.url), connect(y.url)
        consumers = {
            stored: receiver(on_x, stored, credit=10),
            idle: receiver(on_y, idle, credit=10),
            returned: receiver(on_y, returned, credit=10),
            held: receiver(on_x, held, credit=10),
            crashed: receiver(on_y, crashed, credit=10),
            later: receiver(on_x, later, credit=10),
        }
        jms_x, jms_y = jms_connect(x.url, app), jms_connect(y.url)
        kept = subscriber(jms_x, topic, kept_name, EXCLUSIVE)
        shared = subscriber(jms_y, topic, f'{shared_name}|global', SHARED)
        audited = subscriber(jms_y, topic, f'{audit.name}|global', SHARED)

        # the high-priority band first, each band in order
        assert take(consumers[stored], 5) == [
            ('s1', 0), ('s3', 0), ('s0', 0), ('s2', 0), ('s4', 0)
        ]
        # returned once (r1) or twice (r0) as a failed delivery; the rest never delivered
        assert take(consumers[returned], 4) == [('r0', 2), ('r1', 1), ('r2', 0), ('r3', 0)]
        # handed back by a replica shutting down: not a failed delivery
        assert sorted(take(consumers[held], 3)) == [('h0', 0), ('h1', 0), ('h2', 0)]
        # the crashed replica's: returned by the cluster's reaper once its lease lapsed
        assert sorted(take(consumers[crashed], 2)) == [('k0', 1), ('k1', 1)]
        assert take(kept, 4) == [(f't{n}', 0) for n in range(4)]
        assert sorted(take(shared, 4)) == [('t0', 0), ('t1', 0), ('t2', 0), ('t3', 0)]
        assert take(audited, 4) == [(f't{n}', 0) for n in range(4)]

        # the delayed ones, at their time and not before
        for rcv in (consumers[later], kept, shared, audited):
            message = rcv.receive(timeout=DELAY_SECONDS + 10)
            arrived_ms = time.time() * 1000
            rcv.accept()
            assert (message.body, message.delivery_count) in (('late-q', 0), ('late-t', 0))
            assert arrived_ms >= due_ms

        # nothing more anywhere: each message came exactly once
        for rcv in (*consumers.values(), kept, shared, audited):
            assert nothing_more(rcv)
        for conn in (on_x, on_y, jms_x, jms_y):
            conn.close()
    finally:
        for broker in (first, second, doomed, *new):
            broker.stop()
