"""A pass of the operator's observer where nothing moved writes nothing: no status patch of a
BrokerCluster, Queue or SharedSubscription (on a real API server every write is a new
resourceVersion that wakes every watcher), counted at the emulator."""

import rbac
from kubeemulator import Kube, condition, subscription_body


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
