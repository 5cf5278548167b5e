"""A standalone deployment moved to Redis Cluster the way docs/redis-modes.md says ("When to move
to Cluster, and how"): brokers on a standalone redis-server leave every kind of state behind and
are stopped (SIGTERM, as a scale to zero; one of them killed, as a pod that did not stop in time);
``redis-cli --cluster import ... --cluster-copy`` copies the keys into an empty cluster of three
primaries; brokers on the ``redis+cluster://`` URL then deliver every message exactly once where
it belongs: the stored ones, each subscription's, those that were out at a consumer (with their
delivery counts) and the delayed ones (not before their time), and the CLI and the operator's
registry know the declarations. Both Redis deployments require a password, as in production.
A Redis still in the older layout, imported as it is, is laid out by the brokers on the cluster."""

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
from olderlayout import back_to_the_older_layout
from processes import LOOPBACK, BrokerProcess, RedisServer
from proton import ConnectionException, Message
from proton.utils import BlockingConnection, BlockingReceiver
from redisclusters import ClusterGroup

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.store import keys
from shoal_broker.store.declarations import Provisioned, SubscriptionDeclaration
from shoal_broker.store.registry import Registry

PASSWORD = 'migrate-me'

FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}
"""The crashed replica's lease lapses soon after the cluster's brokers start, so they reap it."""

DELAY_SECONDS = 5.0
"""How far ahead the delayed messages are due: past the brokers' stop, so the import finds them
still in the schedule."""

SHARED = JmsSource('topic', 'shared', 'global', durable=True)
EXCLUSIVE = JmsSource('topic', durable=True)


class Names:
    """Fresh names for everything the deployment holds, and its replicas."""

    def __init__(self) -> None:
        prefix = f'mig-{uuid.uuid4().hex[:8]}'
        self.stored, self.idle, self.returned, self.held, self.crashed, self.later = (
            f'{prefix}-{queue}'
            for queue in ('stored', 'idle', 'returned', 'held', 'crashed', 'later')
        )  # fmt: skip
        self.news = f'{prefix}-news'
        """The topic, with the subscriptions ``kept``, ``shared`` and ``audit``."""
        self.app, self.crasher = f'{prefix}-app', f'{prefix}-crasher'
        """ClientIDs: the owner of ``kept``, and a connection on the replica that crashes."""
        self.kept, self.shared = f'{prefix}-kept', f'{prefix}-shared'
        self.audit = SubscriptionKey(f'{prefix}-audit', Scope.GLOBAL, '', True)
        """The declared shared subscription (a SharedSubscription resource)."""
        self.kept_id = SubscriptionKey(self.kept, Scope.CLIENT, self.app, True).id
        self.shared_id = SubscriptionKey(self.shared, Scope.GLOBAL, '', True).id
        self.replicas = [f'{prefix}-{replica}' for replica in 'abcxy']
        """Three on the standalone Redis, then two on the cluster."""


@pytest.fixture
def standalone() -> Iterator[RedisServer]:
    """The deployment's own Redis, holding nothing but what its brokers write."""
    server = RedisServer(None, '--requirepass', PASSWORD)
    yield server
    server.stop()


@pytest.fixture
def empty_cluster() -> Iterator[ClusterGroup]:
    """A new cluster of three primaries (replicas change nothing in an import), then given the
    password."""
    cluster = ClusterGroup(replicas_per_primary=0)
    try:
        for node in cluster.nodes:
            client = node.client()
            client.config_set('requirepass', PASSWORD)
            client.close()
        yield cluster
    finally:
        cluster.stop()


def with_password(url: str) -> str:
    scheme, _, rest = url.partition('://')
    return f'{scheme}://:{PASSWORD}@{rest}'


def import_into(
    cluster: ClusterGroup, source: RedisServer, *extra: str
) -> subprocess.CompletedProcess[str]:
    """The documented command (the cluster's password in REDISCLI_AUTH)."""
    binary = shutil.which('redis-cli')
    assert binary, 'redis-cli is not installed (make test installs it)'
    return subprocess.run(
        [binary, '--cluster', 'import', f'{LOOPBACK}:{cluster.seed.port}',
         '--cluster-from', f'{LOOPBACK}:{source.port}', '--cluster-from-pass', PASSWORD,
         '--cluster-copy', *extra],
        env={'REDISCLI_AUTH': PASSWORD}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def shoal(redis_url: str, command: str) -> dict[str, dict[str, Any]]:
    """The ``shoal`` CLI's view: rows by id (subscriptions) or name."""
    done = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', redis_url, command, '--json'],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {row.get('id', row.get('name')): row for row in json.loads(done.stdout)}


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


def ended(conn: BlockingConnection) -> str:
    """Let the client see its connection end (its broker is gone): how it ended."""
    with pytest.raises(ConnectionException) as end:
        conn.wait(lambda: False, timeout=5)
    return str(end.value)


def persistent_keys(url: str) -> set[bytes]:
    """Every key without a TTL (a lease may lapse while it is being copied)."""
    client = redis.Redis.from_url(url)
    try:
        return {key for key in client.scan_iter(count=1000) if client.ttl(key) == -1}
    finally:
        client.close()


async def declare(url: str, names: Names) -> None:
    """What the operator writes for a Queue and a SharedSubscription resource."""
    async with Registry.from_url(url) as registry:
        assert await registry.declare_queue(names.idle, 'shop/idle') is Provisioned.CREATED
        declaration = SubscriptionDeclaration(
            key=names.audit, topic=names.news, selector=None, max_consumers=None,
            owner='shop/audit', generation=1,
        )  # fmt: skip
        outcome = await registry.declare_subscription(declaration, recreate=False)
        assert outcome is Provisioned.CREATED


async def declared_view(url: str, queue: str) -> tuple[dict[str, str], bool, str]:
    """The operator's view: every declaration, and whether the queue exists and whose it is."""
    async with Registry.from_url(url) as registry:
        state = await registry.queue_state(queue)
        return await registry.declared(), state.exists, state.owner


def leave_state_behind(names: Names, url: str, first: BrokerProcess) -> None:
    """Stored messages on a queue (both priority bands) and on three subscriptions of a topic
    (exclusive durable, shared durable, declared), a declared queue with nothing on it, two
    deliveries a consumer gave back unsettled (one of them twice)."""
    asyncio.run(declare(url, names))
    jms = jms_connect(first.url, names.app)
    durable_detach(subscriber(jms, names.news, names.kept, EXCLUSIVE))
    durable_detach(subscriber(jms, names.news, f'{names.shared}|global', SHARED))
    jms.close()

    producer = connect(first.url)
    to_stored = sender(producer, names.stored)
    for body, priority in (('s0', 4), ('s1', 9), ('s2', 4), ('s3', 9), ('s4', 4)):
        to_stored.send(Message(body=body, priority=priority))
    send_all(producer, names.news, [f't{n}' for n in range(4)])
    send_all(producer, names.returned, [f'r{n}' for n in range(4)])
    send_all(producer, names.held, [f'h{n}' for n in range(3)])
    send_all(producer, names.crashed, [f'k{n}' for n in range(2)])
    producer.close()

    # a consumer that got r0 and r1 and went away without settling them, then r0 once more
    for count in (2, 1):
        gone = connect(first.url)
        assert [body for body, _ in hold(gone, names.returned, count)] == ['r0', 'r1'][:count]
        gone.close()


def send_delayed(names: Names, broker: BrokerProcess) -> int:
    """A delayed message to a queue and one to the topic; returns when they are due (ms since
    the epoch)."""
    due_ms = int((time.time() + DELAY_SECONDS) * 1000)
    conn = connect(broker.url)
    for address, body in ((names.later, 'late-q'), (names.news, 'late-t')):
        sender(conn, address).send(Message(body=body, annotations={'x-opt-delivery-time': due_ms}))
    conn.close()
    return due_ms


def test_a_standalone_deployment_imported_into_a_cluster_delivers_everything_once(
    standalone: RedisServer, empty_cluster: ClusterGroup
) -> None:
    names = Names()
    source_url = with_password(standalone.url)
    first, second, doomed = (
        BrokerProcess(source_url, replica_id=replica, env=FAST_LEASE)
        for replica in names.replicas[:3]
    )
    on_cluster: list[BrokerProcess] = []
    try:
        leave_state_behind(names, source_url, first)

        # out at consumers when their brokers stop: h0-h2 and two of the shared subscription's
        # on a replica that stops cleanly, k0 and k1 (and a ClientID) on the one that crashes
        at_second, at_second_jms = connect(second.url), jms_connect(second.url)
        assert len(hold(at_second, names.held, 3)) == 3
        shared_out = hold(at_second_jms, names.news, 2, SHARED, name=f'{names.shared}|global')
        assert shared_out == [('t0', 0), ('t1', 0)]
        at_doomed = jms_connect(doomed.url, names.crasher)
        assert len(hold(at_doomed, names.crashed, 2)) == 2

        due_ms = send_delayed(names, first)  # last: still scheduled when the brokers stop

        # -- scale to zero: SIGTERM; the last one is killed before it can clean up ------------
        assert first.stop() == 0
        assert second.stop() == 0
        for conn in (at_second, at_second_jms):
            assert 'amqp:connection:forced' in ended(conn)
        doomed.process.send_signal(signal.SIGKILL)
        doomed.stop()
        assert 'disconnected' in ended(at_doomed)

        # -- the import, as documented -----------------------------------------------------------
        before = persistent_keys(source_url)
        done = import_into(empty_cluster, standalone)
        assert done.returncode == 0, done.stdout + done.stderr
        # run again (as after one that stopped part-way): refused key by key, unless replacing
        again = import_into(empty_cluster, standalone)
        assert again.returncode != 0
        assert 'BUSYKEY' in again.stdout + again.stderr
        done = import_into(empty_cluster, standalone, '--cluster-replace')
        assert done.returncode == 0, done.stdout + done.stderr
        copied = redis.cluster.RedisCluster(
            host=LOOPBACK, port=empty_cluster.seed.port, password=PASSWORD
        )
        try:
            missing = {key for key in before if not copied.exists(key)}
            assert not missing, sorted(missing)
            # still scheduled: no broker has run since they were stored
            for address in (names.later, names.news):
                assert copied.zcard(keys.AddressKeys.of(address).scheduled) == 1
        finally:
            copied.close()

        # -- the brokers on the cluster URL -----------------------------------------------------
        url = with_password(empty_cluster.url)
        for replica in names.replicas[3:]:
            on_cluster.append(BrokerProcess(url, replica_id=replica, env=FAST_LEASE))
        x, y = on_cluster

        queues = shoal(url, 'queues')
        backlogs = [queues[q]['backlog'] for q in (names.stored, names.idle, names.returned)]
        assert backlogs == [5, 0, 4]
        held = queues[names.held]
        assert (held['backlog'], held['in_flight']) == (3, 0)  # handed back at the stop
        subscriptions = shoal(url, 'subscriptions')
        assert subscriptions[names.kept_id]['kind'] == 'exclusive durable'
        assert subscriptions[names.shared_id]['kind'] == 'shared durable'
        assert subscriptions[names.audit.id]['kind'] == 'shared durable'
        for sid in (names.kept_id, names.shared_id, names.audit.id):
            assert subscriptions[sid]['topic'] == names.news
        declared, exists, owner = asyncio.run(declared_view(url, names.idle))
        assert (exists, owner) == (True, 'shop/idle')
        assert declared[keys.provisioned_queue(names.idle)] == 'shop/idle'
        assert declared[keys.provisioned_subscription(names.audit.id)] == 'shop/audit'

        on_x, on_y = connect(x.url), connect(y.url)
        queue = {
            address: receiver(conn, address, credit=10)
            for address, conn in ((names.stored, on_x), (names.idle, on_y),
                                  (names.returned, on_y), (names.held, on_x),
                                  (names.crashed, on_y), (names.later, on_x))
        }  # fmt: skip
        jms_x, jms_y = jms_connect(x.url, names.app), jms_connect(y.url)
        kept = subscriber(jms_x, names.news, names.kept, EXCLUSIVE)
        shared = subscriber(jms_y, names.news, f'{names.shared}|global', SHARED)
        audited = subscriber(jms_y, names.news, f'{names.audit.name}|global', SHARED)

        # the high-priority band first, each band in order
        stored = take(queue[names.stored], 5)
        assert stored == [('s1', 0), ('s3', 0), ('s0', 0), ('s2', 0), ('s4', 0)]
        # given back unsettled: a failed delivery each time (r0 twice)
        assert take(queue[names.returned], 4) == [('r0', 2), ('r1', 1), ('r2', 0), ('r3', 0)]
        # out and unsettled when their replica stopped: returned as by a consumer that goes away
        assert sorted(take(queue[names.held], 3)) == [('h0', 1), ('h1', 1), ('h2', 1)]
        # the crashed replica's: returned by the cluster's reaper once its lease lapsed
        assert sorted(take(queue[names.crashed], 2)) == [('k0', 1), ('k1', 1)]
        jms_connect(x.url, names.crasher).close()  # and its ClientID released
        assert take(kept, 4) == [(f't{n}', 0) for n in range(4)]
        assert sorted(take(shared, 4)) == [('t0', 1), ('t1', 1), ('t2', 0), ('t3', 0)]
        assert take(audited, 4) == [(f't{n}', 0) for n in range(4)]

        # the delayed ones, at their time and not before
        for rcv, body in ((queue[names.later], 'late-q'), (kept, 'late-t'), (shared, 'late-t'),
                          (audited, 'late-t')):  # fmt: skip
            assert take(rcv, 1, timeout=DELAY_SECONDS + 10) == [(body, 0)]
            assert time.time() * 1000 >= due_ms

        # each message came exactly once
        for rcv in (*queue.values(), kept, shared, audited):
            assert nothing_more(rcv)
        for conn in (on_x, on_y, jms_x, jms_y):
            conn.close()
    finally:
        for broker in (first, second, doomed, *on_cluster):
            broker.stop()


def test_a_redis_still_in_the_older_layout_is_laid_out_by_the_brokers_on_the_cluster(
    standalone: RedisServer, empty_cluster: ClusterGroup
) -> None:
    names = Names()
    source_url = with_password(standalone.url)
    older = BrokerProcess(source_url, replica_id=names.replicas[0])
    try:
        conn = connect(older.url)
        send_all(conn, names.stored, ['s0', 's1'])
        conn.close()
        jms = jms_connect(older.url, names.app)
        durable_detach(subscriber(jms, names.news, names.kept, EXCLUSIVE))
        jms.close()
        conn = connect(older.url)
        send_all(conn, names.news, ['t0', 't1'])
        conn.close()
    finally:
        stopped = older.stop()
    assert stopped == 0
    client = redis.Redis.from_url(source_url)
    try:
        layout = {names.stored: 'queue', names.news: 'topic'}
        back_to_the_older_layout(client, layout, names.kept_id)
    finally:
        client.close()

    done = import_into(empty_cluster, standalone)
    assert done.returncode == 0, done.stdout + done.stderr
    url = with_password(empty_cluster.url)
    newer = BrokerProcess(url, replica_id=names.replicas[3])
    try:
        copied = redis.cluster.RedisCluster(
            host=LOOPBACK, port=empty_cluster.seed.port, password=PASSWORD
        )
        try:
            for address, kind in layout.items():
                meta = keys.AddressKeys.of(address).meta
                epoch = copied.hget(meta, 'epoch')
                assert copied.hget(meta, 'kind') == kind.encode()
                assert copied.hget(keys.ADDRESSES, address) == f'{kind}:'.encode() + epoch
            definition = keys.SubscriptionKeys.of(names.kept_id).definition
            epoch = copied.hget(definition, 'epoch')
            assert epoch
            assert copied.hget(keys.SUBSCRIPTION_INDEX, names.kept_id) == epoch
            assert not copied.exists(keys.SUBSCRIPTIONS)  # no older replica is left
        finally:
            copied.close()
        conn = connect(newer.url)
        stored = receiver(conn, names.stored, credit=10)
        assert take(stored, 2) == [('s0', 0), ('s1', 0)]
        jms = jms_connect(newer.url, names.app)
        kept = subscriber(jms, names.news, names.kept, EXCLUSIVE)
        assert take(kept, 2) == [('t0', 0), ('t1', 0)]
        assert nothing_more(stored)
        assert nothing_more(kept)
        conn.close()
        jms.close()
    finally:
        newer.stop()
