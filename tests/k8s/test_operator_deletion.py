"""Deletion orders a user meets, with the chart's namespaced RBAC: ``kubectl delete -f app.yaml``
removes the Secret naming Redis, the BrokerCluster, its Queue and its SharedSubscription at once,
in file order; deleting their namespace removes the operator's Role there before anything else.
Both finish, and ``deletionPolicy: Delete`` is honoured (the operator acts with the Redis it last
reached the cluster through), so the same names are free for another namespace afterwards."""

import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import rbac
import redis
from amqpclient import connect, receive_all, receiver, sender
from kubeemulator import Kube, cluster_body, condition, subscription_body
from processes import BrokerProcess
from proton import Message

from shoal_broker.routing.jms_subscriptions import Scope, SubscriptionKey
from shoal_broker.store import keys
from shoal_broker.store.declarations import SubscriptionDeclaration
from shoal_broker.store.layout import kind_of
from shoal_broker.store.registry import Registry


def definition_key(name: str) -> str:
    return keys.SubscriptionKeys.of(f'durable:global:*:{name}').definition


async def ready(kube: Kube, plural: str, name: str, namespace: str = 'default') -> Any:
    body = await kube.get(plural, name, namespace=namespace)
    found = condition(body, 'Ready')
    return found if found.get('status') == 'True' else None


async def _declare_app(
    kube: Kube, store_url: str, address: str, billing: str, subscription_policy: str
) -> None:
    """The app: Redis's Secret, a BrokerCluster, a Queue (Delete) and a SharedSubscription."""
    await kube.redis_secret(store_url)
    await kube.create('brokerclusters', cluster_body())
    queue = {
        'clusterRef': {'name': 'shoal'},
        'queueName': f'{address}-q',
        'deletionPolicy': 'Delete',
    }
    await kube.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'}, 'spec': queue})
    await kube.create(
        'sharedsubscriptions',
        subscription_body(billing, address, deletionPolicy=subscription_policy),
    )
    await kube.eventually(lambda: ready(kube, 'queues', 'orders'), 'the Queue Ready')
    await kube.eventually(lambda: ready(kube, 'sharedsubscriptions', billing), 'the sub Ready')


async def test_kubectl_delete_of_a_whole_app_honours_delete(
    operator: Kube, store_url: str, rds: redis.Redis, address: str
) -> None:
    kube = operator
    billing = f'billing-{uuid.uuid4().hex[:8]}'
    app = [
        ('secrets', 'redis', 'v1'),
        ('brokerclusters', 'shoal', None),
        ('queues', 'orders', None),
        ('sharedsubscriptions', billing, None),
    ]
    await _declare_app(kube, store_url, address, billing, 'Delete')
    assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-q')) == 'queue'
    assert rds.exists(definition_key(billing))

    await _delete_and_wait(kube, app)  # kubectl delete -f app.yaml: one after the other

    # Without a finalizer the policy is carried out on the DELETED event, so after the objects
    # have left the API server
    async def deleted_from_redis() -> bool:
        queue_gone = rds.hget(keys.ADDRESSES, f'{address}-q') is None
        return queue_gone and not rds.exists(definition_key(billing))

    await kube.eventually(deleted_from_redis, 'the Queue and the subscription deleted from Redis')

    # the same subscription declared from another namespace on the same Redis is not a Conflict
    secret = {'metadata': {'name': 'redis', 'namespace': 'elsewhere'},
              'stringData': {'url': store_url}}  # fmt: skip
    await kube.create('secrets', secret, api_version='v1')
    other = cluster_body()
    other['metadata']['namespace'] = 'elsewhere'
    await kube.create('brokerclusters', other)
    again = subscription_body(billing, address)
    again['metadata']['namespace'] = 'elsewhere'
    await kube.create('sharedsubscriptions', again)
    await kube.eventually(
        lambda: ready(kube, 'sharedsubscriptions', billing, 'elsewhere'), 'billing Ready elsewhere'
    )
    assert rds.hget(definition_key(billing), 'owner') == f'elsewhere/{billing}'


async def test_deleting_the_namespace_after_the_operators_role_finishes_and_honours_delete(
    operator: Kube, store_url: str, rds: redis.Redis, address: str
) -> None:
    kube = operator
    billing = f'billing-{uuid.uuid4().hex[:8]}'
    await _declare_app(kube, store_url, address, billing, 'DeleteIfEmpty')
    for plural, name in [('queues', 'orders'), ('sharedsubscriptions', billing)]:
        body = await kube.get(plural, name) or {}
        assert not body['metadata'].get('finalizers'), 'nothing may hold the namespace'

    await kube.observer_passes(2)  # the operator idle: no write of its own is cut in half
    # the namespace controller: the operator's Role (and so its access) goes first, then the rest
    kube.emulator.forbidden_token = rbac.TOKEN
    kube.emulator.forbidden = frozenset({'default'})
    content = [('sharedsubscriptions', billing, None), ('queues', 'orders', None),
               ('brokerclusters', 'shoal', None), ('secrets', 'redis', 'v1')]  # fmt: skip
    await _delete_and_wait(kube, content)

    async def removed() -> bool:
        return rds.hget(keys.ADDRESSES, f'{address}-q') is None and not rds.exists(
            definition_key(billing)
        )

    await kube.eventually(removed, 'both removed from Redis')


async def test_a_declaration_whose_resource_is_gone_is_released(
    cluster: Kube, store_url: str, rds: redis.Redis, address: str
) -> None:
    """What no operator could carry out (deleted without a finalizer while it was down) is found
    in Redis: the declarations of resources that no longer exist are released, so their names
    are free; a declaration whose resource exists, or lives in a namespace the operator does not
    watch, is left alone."""
    ghost = f'ghost-{uuid.uuid4().hex[:8]}'
    registry = Registry.from_url(store_url)
    try:
        await registry.declare_queue(f'{address}-q', f'default/{ghost}')
        await registry.declare_queue(f'{address}-other', f'unwatched/{ghost}')
        key = SubscriptionKey(name=ghost, scope=Scope.GLOBAL, client_id='', durable=True)
        await registry.declare_subscription(SubscriptionDeclaration(
            key=key, topic=address, selector=None, max_consumers=None,
            owner=f'default/{ghost}', generation=1), recreate=False)  # fmt: skip
    finally:
        await registry.close()
    await cluster.create('queues', {'kind': 'Queue', 'metadata': {'name': 'orders'},
                                    'spec': {'clusterRef': {'name': 'shoal'},
                                             'queueName': f'{address}-live'}})  # fmt: skip
    await cluster.eventually(lambda: ready(cluster, 'queues', 'orders'), 'the live Queue Ready')

    async def released() -> bool:
        return (
            rds.hget(keys.PROVISIONED, keys.provisioned_queue(f'{address}-q')) is None
            and rds.hget(keys.PROVISIONED, keys.provisioned_subscription(key.id)) is None
        )

    await cluster.eventually(released, 'both orphans released')
    assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-q')) == 'queue'  # released, not deleted
    assert rds.exists(definition_key(ghost))
    assert rds.hget(keys.PROVISIONED, keys.provisioned_queue(f'{address}-other')) == (
        f'unwatched/{ghost}'
    )
    assert rds.hget(keys.PROVISIONED, keys.provisioned_queue(f'{address}-live')) == 'default/orders'


def queue_body(name: str, queue: str, policy: str) -> dict[str, Any]:
    spec = {'clusterRef': {'name': 'shoal'}, 'queueName': queue, 'deletionPolicy': policy}
    return {'kind': 'Queue', 'metadata': {'name': name}, 'spec': spec}


async def test_an_operator_restart_honours_the_deletion_policy_of_what_was_deleted_meanwhile(
    kube: Kube,
    restartable: Callable[[], AbstractAsyncContextManager[Kube]],
    store_url: str,
    rds: redis.Redis,
    broker: BrokerProcess,
    address: str,
) -> None:
    """Resources deleted while no operator runs (no finalizer holds them) are dealt with by the
    next operator as their deletion policy, filed with the declaration in Redis, asks: Delete
    removes the Queue and the SharedSubscription, Retain keeps them and frees their names,
    DeleteIfEmpty keeps a queue holding a message declared until it is consumed."""
    suffix = address[-8:]
    queues = {'gone': 'Delete', 'kept': 'Retain', 'full': 'DeleteIfEmpty'}
    subs = {f'gone-{suffix}': 'Delete', f'kept-{suffix}': 'Retain'}
    await kube.redis_secret(store_url)
    await kube.create('brokerclusters', cluster_body())
    async with restartable():
        for name, policy in queues.items():
            await kube.create('queues', queue_body(name, f'{address}-{name}', policy))
        for name, policy in subs.items():
            await kube.create(
                'sharedsubscriptions', subscription_body(name, address, deletionPolicy=policy)
            )
        for plural, names in (('queues', queues), ('sharedsubscriptions', subs)):
            for name in names:
                await kube.eventually(lambda p=plural, n=name: ready(kube, p, n), f'{name} Ready')
    conn = connect(broker.url)
    sender(conn, f'{address}-full').send(Message(body='waiting'))
    conn.close()
    for plural, names in (('queues', queues), ('sharedsubscriptions', subs)):
        for name in names:
            await kube.delete(plural, name)
            assert await kube.get(plural, name) is None  # no finalizer: gone at once
    assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-gone')) == 'queue'  # nobody acted on it yet

    def declared(field: str) -> bool:
        return rds.hget(keys.PROVISIONED, field) is not None

    sub_field = keys.provisioned_subscription
    async with restartable():

        async def settled() -> bool:
            return (
                rds.hget(keys.ADDRESSES, f'{address}-gone') is None
                and not rds.exists(definition_key(f'gone-{suffix}'))
                and not declared(keys.provisioned_queue(f'{address}-kept'))
                and not declared(sub_field(f'durable:global:*:kept-{suffix}'))
            )

        await kube.eventually(settled, 'Delete carried out, Retain released')
        assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-kept')) == 'queue'
        assert rds.exists(definition_key(f'kept-{suffix}'))
        assert rds.hget(definition_key(f'kept-{suffix}'), 'owner') is None
        await kube.observer_passes(2)
        assert declared(keys.provisioned_queue(f'{address}-full'))  # a message waits in it
        assert kind_of(rds.hget(keys.ADDRESSES, f'{address}-full')) == 'queue'

        conn = connect(broker.url)
        assert [m.body for m in receive_all(receiver(conn, f'{address}-full'), 1)] == ['waiting']
        conn.close()

        async def emptied_and_deleted() -> bool:
            return rds.hget(keys.ADDRESSES, f'{address}-full') is None

        await kube.eventually(emptied_and_deleted, 'the DeleteIfEmpty queue deleted once empty')
    assert not rds.hgetall(keys.DELETION_POLICIES).keys() & {
        keys.provisioned_queue(f'{address}-{name}') for name in queues
    }


async def test_the_filed_deletion_policy_follows_the_resource_and_force_delete(
    cluster: Kube, rds: redis.Redis, address: str
) -> None:
    """The policy filed in Redis is the resource's own, rewritten when it changes;
    ``shoal.dev/force-delete`` files Retain, as it leaves Redis alone on a live deletion too."""
    field = keys.provisioned_queue(f'{address}-q')
    await cluster.create('queues', queue_body('orders', f'{address}-q', 'Delete'))

    def filed(policy: str) -> Callable[[], Any]:
        async def probe() -> bool:
            return rds.hget(keys.DELETION_POLICIES, field) == policy

        return probe

    await cluster.eventually(filed('Delete'), 'Delete filed')
    await cluster.patch('queues', 'orders', {'spec': {'deletionPolicy': 'DeleteIfEmpty'}})
    await cluster.eventually(filed('DeleteIfEmpty'), 'DeleteIfEmpty filed')
    force = {'metadata': {'annotations': {'shoal.dev/force-delete': 'true'}}}
    await cluster.patch('queues', 'orders', force)
    await cluster.eventually(filed('Retain'), 'Retain filed for a forced deletion')


async def _delete_and_wait(kube: Kube, objects: list[tuple[str, str, str | None]]) -> None:
    """Delete each (plural, name, apiVersion or None for Shoal's own) in turn, then wait until
    the API server has none of them."""
    for plural, name, api_version in objects:
        if api_version:
            await kube.delete(plural, name, api_version=api_version)
        else:
            await kube.delete(plural, name)
    for plural, name, api_version in objects:

        async def gone(p: str = plural, n: str = name, a: str | None = api_version) -> bool:
            found = await (kube.get(p, n, api_version=a) if a else kube.get(p, n))
            return found is None

        await kube.eventually(gone, f'{plural}/{name} gone')
