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
