"""The store and the operator's registry on a real Redis Cluster (three primaries, three
replicas): addresses spread over the shards, the CLI's and operator's views reading their
indexes, declarations written and removed, and a transaction over three slots applied through
its commit record (docs/redis-modes.md, "Redis Cluster")."""

import collections
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from processes import LOOPBACK, RedisServer, free_port, wait_for
from redisclusters import ClusterGroup
from startedstores import started_store

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.routing.storage import QUEUE_GROUP, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys
from shoal_broker.store.commit_nodes import SWEEP_PIPELINE_COMMANDS
from shoal_broker.store.commits import MARKER_GRACE_SECONDS
from shoal_broker.store.declarations import Provisioned, Removal, SubscriptionDeclaration
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.registry import Registry


@pytest.fixture
async def store(redis_cluster: ClusterGroup) -> AsyncIterator[RedisStore]:
    async with started_store(redis_cluster.url, 'cs') as s:
        yield s


@pytest.fixture
async def registry(redis_cluster: ClusterGroup) -> AsyncIterator[Registry]:
    async with Registry.from_url(redis_cluster.url) as r:
        yield r


def spread(cluster: ClusterGroup, prefix: str, count: int) -> list[str]:
    """``count`` address names whose slots are served by at least two different primaries."""
    names = [f'{prefix}-{i}' for i in range(count)]
    owners = {cluster.owner_of_slot(cluster.keyslot(keys.AddressKeys.of(n).tag)) for n in names}
    assert len(owners) > 1
    return names


def message(body: bytes) -> OutgoingMessage:
    return OutgoingMessage(band=0, header=b'', rest=body, expiry_ms=0)


async def test_the_operator_and_the_cli_see_every_shard(
    redis_cluster: ClusterGroup, store: RedisStore, registry: Registry
) -> None:
    assert await store.ping()  # every primary answers
    used, _ = await store.upkeep.memory()  # the fullest primary's
    assert used > 0
    queues = spread(redis_cluster, f'q-{uuid.uuid4().hex[:6]}', 6)
    for n, queue in enumerate(queues):
        assert await registry.declare_queue(queue, 'ns/q') is Provisioned.CREATED
        for i in range(n + 1):
            assert await store.messages.publish(queue, AddressKind.QUEUE, message(b'%d' % i))
    found = {q.name: q.backlog for q in await registry.queues() if q.name in queues}
    assert found == {queue: n + 1 for n, queue in enumerate(queues)}

    topic = f't-{uuid.uuid4().hex[:6]}'
    key = SubscriptionKey(scope=Scope.GLOBAL, client_id='', name='watch', durable=True)
    declaration = SubscriptionDeclaration(
        key=key, topic=topic, selector=None, max_consumers=None, owner='ns/watch', generation=1
    )
    assert await registry.declare_subscription(declaration, recreate=False) is Provisioned.CREATED
    assert await store.messages.publish(topic, AddressKind.TOPIC, message(b'news'))
    [info] = [s for s in await registry.subscriptions() if s.id == key.id]
    assert (info.topic, info.backlog) == (topic, 1)

    # the operator's batched pass reads every shard in its pipelines
    queue_states, sub_states = await registry.states(queues, [key])
    assert {q: s.backlog for q, s in queue_states.items()} == found
    assert {q: s.owner for q, s in queue_states.items()} == dict.fromkeys(queues, 'ns/q')
    assert (sub_states[key.id].backlog, sub_states[key.id].owner) == (1, 'ns/watch')

    assert await registry.remove_queue(queues[0], 'ns/q', delete=True) is Removal.DELETED
    assert not (await registry.queue_state(queues[0])).exists
    assert queues[0] not in {a.name for a in await registry.addresses()}
    assert await registry.remove_subscription(key, 'ns/watch', delete=True) is Removal.DELETED
    assert key.id not in {s.id for s in await registry.subscriptions()}


async def test_a_transaction_over_three_slots_is_all_applied(
    redis_cluster: ClusterGroup, store: RedisStore
) -> None:
    source, *targets = spread(redis_cluster, f'tx-{uuid.uuid4().hex[:6]}', 4)
    for address in (source, *targets):
        await store.registry.create_address(address, AddressKind.QUEUE)
    assert await store.messages.publish(source, AddressKind.QUEUE, message(b'job'))
    [entry] = await store.messages.fetch(source, QUEUE_GROUP, 1)
    sends = [(t, AddressKind.QUEUE, message(t.encode())) for t in targets]
    await store.messages.commit(sends, [(source, QUEUE_GROUP, entry)])
    for target in targets:
        [sent] = await store.messages.fetch(target, QUEUE_GROUP, 10)
        assert sent.rest == target.encode()
    assert await store.messages.fetch(source, QUEUE_GROUP, 10) == []  # acked, not returned
    for bucket in range(keys.COMMIT_BUCKETS):  # applied everywhere: the record is forgotten
        index = keys.commit_index(store.messages.transactions.replica_id, bucket)
        assert not await store.client.exists(index)


async def test_a_trimming_pass_sweeps_the_markers_of_many_addresses_on_every_node(
    redis_cluster: ClusterGroup, store: RedisStore
) -> None:
    """The markers past their grace period whose record is gone go, in pipelines per node
    (more addresses on each node than one pipeline carries); a marker whose record is still
    there, or that is still within its grace period, stays."""
    client = store.client
    prefix = f'sw-{uuid.uuid4().hex[:6]}'
    names = [f'{prefix}-{i}' for i in range(3300)]
    markers = {name: keys.AddressKeys.of(name).commit_markers for name in names}
    per_node = collections.Counter(client.get_node_from_key(m).name for m in markers.values())
    assert len(per_node) == 3
    assert max(per_node.values()) > SWEEP_PIPELINE_COMMANDS  # more than one pipeline's worth

    now_ms = int(time.time() * 1000)
    old, recent = now_ms - int(MARKER_GRACE_SECONDS * 1000) - 60_000, now_ms - 1000
    kept_record = keys.commit_record('sweep-owner', 3, uuid.uuid4().hex)
    gone_record = keys.commit_record('sweep-owner', 5, uuid.uuid4().hex)
    await client.hset(kept_record, 'replica', 'sweep-owner')  # not completed yet
    expected: dict[str, set[bytes]] = {}
    pipe = client.pipeline()
    for i, name in enumerate(names):
        if i % 10 == 0:  # its record is still there
            fields, left = {kept_record: old, gone_record: old}, {kept_record}
        elif i % 7 == 0:  # within the grace period
            fields, left = {gone_record: recent}, {gone_record}
        else:
            fields, left = {gone_record: old}, set()
        pipe.hset(markers[name], mapping=fields)
        pipe.hset(keys.ADDRESSES, name, 'queue:sweep')  # an entry for nothing: readers skip it
        expected[name] = {field.encode() for field in left}
    await pipe.execute()
    try:
        await store.tidy_commits()
        pipe = client.pipeline()
        for name in names:
            pipe.hkeys(markers[name])
        found = dict(zip(names, [set(k) for k in await pipe.execute()], strict=True))
        assert found == expected
    finally:
        pipe = client.pipeline()
        for name in names:
            pipe.delete(markers[name])
            pipe.hdel(keys.ADDRESSES, name)
        await pipe.execute()
        await client.delete(kept_record)


async def test_a_cluster_of_one_primary_serves_the_store() -> None:
    """One primary holding every slot: redis-py answers a command sent to every primary with the
    bare reply rather than a reply per node, which the memory watermark must read alike; and
    trimming, one script call per stream, must not ask that node for more connections than its
    pool holds."""
    node = RedisServer(
        None, '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf',
        '--cluster-port', str(free_port()),  # port + 10 000, the default, may be past 65 535
    )  # fmt: skip
    client = redis.Redis(host=LOOPBACK, port=node.port)
    try:
        client.execute_command('CLUSTER', 'ADDSLOTSRANGE', 0, 16383)
        wait_for(lambda: b'cluster_state:ok' in client.execute_command('CLUSTER', 'INFO'), 10,
                 'a cluster of one primary')  # fmt: skip
        store = RedisStore.from_url(f'redis+cluster://{LOOPBACK}:{node.port}', 'one-shard')
        await store.start()
        try:
            assert await store.ping()
            used, _ = await store.upkeep.memory()
            assert used > 0
            await store.registry.create_address('solo', AddressKind.QUEUE)
            assert await store.messages.publish('solo', AddressKind.QUEUE, message(b'x'))
            fetched = await store.messages.fetch('solo', QUEUE_GROUP, 10)
            assert [entry.rest for entry in fetched] == [b'x']
            await store.messages.ack('solo', QUEUE_GROUP, fetched[0])
            # more streams on the one node than its pool has connections: trimmed all the same
            for n in range(80):
                await store.registry.create_address(f'many-{n}', AddressKind.QUEUE)
            assert await store.upkeep.trim() >= 0
            assert client.xlen(keys.AddressKeys.of('solo').streams[0]) == 0
        finally:
            await store.close()
    finally:
        client.close()
        node.stop()


async def test_stranded_entries_come_back_counted_on_a_cluster(store: RedisStore) -> None:
    address = f'stranded-{uuid.uuid4().hex[:8]}'
    await store.registry.create_address(address, AddressKind.QUEUE)
    for body in (b'a', b'b'):
        await store.messages.publish(address, AddressKind.QUEUE, message(body))
    fetched = await store.messages.fetch(address, QUEUE_GROUP, 2)
    assert await store.messages.return_stranded(address, QUEUE_GROUP, {fetched[1].key}) == 1
    again = await store.messages.fetch(address, QUEUE_GROUP, 10)
    assert [(e.rest, e.delivery_count) for e in again] == [(b'a', 1)]
