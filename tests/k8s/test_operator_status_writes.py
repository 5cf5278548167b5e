"""A pass of the operator's observer where nothing moved writes nothing: no status patch of a
BrokerCluster, Queue or SharedSubscription (on a real API server every write is a new
resourceVersion that wakes every watcher), counted at the emulator."""

from collections.abc import Callable
from typing import Any

import rbac
from amqpclient import connect, receive_all, receiver, sender
from kubeemulator import Kube, condition, subscription_body
from processes import BrokerProcess, free_port
from proton import Message


def requests(kube: Kube) -> list[tuple[str, str]]:
    """The operator's requests so far: (method, path)."""
    return [
        (str(r.method.value).upper(), str(r.url.path))
        for r in list(kube.emulator)
        if r.headers.get('Authorization') == f'Bearer {rbac.TOKEN}'
    ]


def patches(kube: Kube) -> list[str]:
    """The operator's PATCH requests so far (status and otherwise)."""
    return [
        str(r.url.path)
        for r in list(kube.emulator)
        if str(r.method.value).upper() == 'PATCH'
        and r.headers.get('Authorization') == f'Bearer {rbac.TOKEN}'
    ]


async def test_a_pass_where_nothing_moved_writes_nothing(cluster: Kube, address: str) -> None:
    billing = f'billing-{address[-8:]}'  # subscription names are Redis-wide: one per test
    queue = {'clusterRef': {'name': 'shoal'}, 'queueName': f'{address}-q'}
    await cluster.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'}, 'spec': queue})
    await cluster.create('sharedsubscriptions', subscription_body(billing, address, maxConsumers=2))

    async def settled() -> bool:
        bodies = [await cluster.get(p, n) for p, n in
                  [('brokerclusters', 'shoal'), ('queues', 'orders'),
                   ('sharedsubscriptions', billing)]]  # fmt: skip
        return all('backlog' in (b or {}).get('status', {}) or b['kind'] == 'BrokerCluster'
                   for b in bodies) and all(condition(b, 'Ready') for b in bodies)  # fmt: skip

    await cluster.eventually(settled, 'every status written once')
    await cluster.observer_passes(2)
    before = patches(cluster)
    await cluster.observer_passes(3)
    assert patches(cluster)[len(before) :] == []


async def test_a_status_key_that_no_longer_applies_is_removed(
    cluster: Kube, broker: BrokerProcess, address: str
) -> None:
    """A merge patch never removes a key it leaves out: once the backlog drains, the oldest
    message's age goes from the stored status (it is written as null), and so does the consumer
    limit once the spec drops it."""
    limited = f'limited-{address[-8:]}'
    queue = {'clusterRef': {'name': 'shoal'}, 'queueName': f'{address}-q'}
    await cluster.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'}, 'spec': queue})
    await cluster.create('sharedsubscriptions', subscription_body(limited, address, maxConsumers=2))

    async def status_when(plural: str, name: str, probe: Callable[[dict[str, Any]], bool]) -> Any:
        body = await cluster.get(plural, name)
        return body if probe((body or {}).get('status') or {}) else None

    await cluster.eventually(lambda: status_when('queues', 'orders', lambda s: 'backlog' in s),
                             'the Queue sampled')  # fmt: skip
    conn = connect(broker.url)
    sender(conn, f'{address}-q').send(Message(body='first order'))
    await cluster.eventually(
        lambda: status_when('queues', 'orders',
                            lambda s: 'oldestMessageAgeSeconds' in s.get('backlog', {})),
        'the age of a waiting message',
    )  # fmt: skip
    assert receive_all(receiver(conn, f'{address}-q'), 1)[0].body == 'first order'
    conn.close()
    drained = await cluster.eventually(
        lambda: status_when('queues', 'orders', lambda s: s['backlog']['messages'] == 0),
        'the backlog drained',
    )
    assert 'oldestMessageAgeSeconds' not in drained['status']['backlog']
    assert drained['status']['address'] == f'{address}-q'  # what applies stays

    await cluster.eventually(
        lambda: status_when('sharedsubscriptions', limited,
                            lambda s: s.get('consumers', {}).get('max') == 2),
        'the limit in the status',
    )  # fmt: skip
    await cluster.patch('sharedsubscriptions', limited, {'spec': {'maxConsumers': None}})
    unlimited = await cluster.eventually(
        lambda: status_when('sharedsubscriptions', limited,
                            lambda s: 'max' not in s.get('consumers', {'max': 0})),
        'the limit gone from the status',
    )  # fmt: skip
    assert unlimited['status']['consumers']['active'] == 0


async def test_what_only_a_reachable_redis_tells_leaves_a_cluster_status_without_it(
    cluster: Kube,
) -> None:
    """Redis's version, latency and the declared subscriptions' count go from a BrokerCluster's
    status once its Redis no longer answers, rather than standing there as if current."""

    async def redis_status(probe: Callable[[dict[str, Any]], bool]) -> Any:
        body = await cluster.get('brokerclusters', 'shoal')
        return body if probe((body or {}).get('status') or {}) else None

    await cluster.eventually(
        lambda: redis_status(lambda s: 'serverVersion' in s.get('redis', {})
                             and 'subscriptions' in s),
        'what Redis tells in the status',
    )  # fmt: skip
    dead = f'redis://127.0.0.1:{free_port()}/0'
    await cluster.create(
        'secrets', {'metadata': {'name': 'dead'}, 'stringData': {'url': dead}}, api_version='v1'
    )
    await cluster.patch('brokerclusters', 'shoal', {'spec': {'redis': {'secretName': 'dead'}}})
    found = await cluster.eventually(
        lambda: redis_status(lambda s: s.get('redis', {}).get('connected') is False),
        'Redis unreachable in the status',
    )
    assert found['status']['redis'] == {'connected': False}
    assert 'subscriptions' not in found['status']


async def test_passes_at_rest_read_no_shared_object_per_resource_and_write_nothing(
    cluster: Kube, broker: BrokerProcess, address: str
) -> None:
    """With many resources at rest, a pass reads the BrokerCluster from the watch and its
    Secret once (not once per resource), patches no child that already holds what it should
    (the API server drops a false ``publishNotReadyAddresses``), does not delete again the
    switched-off children it found absent, and writes no status; a pass where one queue got a
    message writes that queue's status and nothing else."""
    count = 12
    for i in range(count):
        spec = {'clusterRef': {'name': 'shoal'}, 'queueName': f'{address}-{i}'}
        await cluster.create('queues', {'kind': 'Queue', 'metadata': {'name': f'q{i}'},
                                        'spec': spec})  # fmt: skip
        await cluster.create('sharedsubscriptions',
                             subscription_body(f's{i}-{address[-8:]}', address))  # fmt: skip

    async def sampled() -> bool:
        for i in range(count):
            for plural, name in (
                ('queues', f'q{i}'),
                ('sharedsubscriptions', f's{i}-{address[-8:]}'),
            ):
                body = await cluster.get(plural, name)
                if 'backlog' not in ((body or {}).get('status') or {}):
                    return False
        return True

    # 24 resources reconciled, then sampled: past the default 30 s once, with the suite's three
    # workers on two vCPUs
    await cluster.eventually(sampled, 'every resource sampled', limit=60)
    await cluster.observer_passes(2)
    before = len(requests(cluster))
    passes = 3
    await cluster.observer_passes(passes)
    at_rest = requests(cluster)[before:]
    writes = [r for r in at_rest if r[0] != 'GET']
    assert writes == []
    assert not [path for _, path in at_rest if '/brokerclusters/' in path]
    secret_reads = [path for _, path in at_rest if path.endswith('/secrets/redis')]
    assert len(secret_reads) <= passes + 2  # once per pass (a pass may be cut by the window)

    conn = connect(broker.url)
    sender(conn, f'{address}-3').send(Message(body='an order'))
    conn.close()

    async def written() -> bool:
        body = await cluster.get('queues', 'q3') or {}
        return int(((body.get('status') or {}).get('backlog') or {}).get('messages', 0)) == 1

    before = len(requests(cluster))
    await cluster.eventually(written, 'the queue holding a message written')
    await cluster.observer_passes(2)
    writes = [r for r in requests(cluster)[before:] if r[0] != 'GET']
    q3 = ('PATCH', '/apis/shoal.dev/v1alpha1/namespaces/default/queues/q3/status')
    assert set(writes) == {q3}
    assert len(writes) <= 2  # the message, then its age crossing a step (10 s) on a slow machine
