"""
Every Lua script of the store runs on one hash slot of a Redis Cluster: the checklist of the key
layout (docs/redis-modes.md#the-key-layout).

Each script runs on a real cluster of three primaries and three replicas with the KEYS its caller
passes, built through store/keys.py, sent to the node serving the first key's slot: Redis itself
answers CROSSSLOT when they span slots. A script added to lua/ without a case here fails
``test_every_script_has_a_case``.
"""

import re
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pytest
import redis
from redisclusters import ClusterGroup

from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.store import keys, layout, scripts
from shoal_broker.store.fetch_command import fetch_call
from shoal_broker.store.replicas import renewal_keys

ADDRESS = 'orders'
TOPIC = 'prices'
GROUP = QUEUE_GROUP
SUBSCRIPTION = 'durable:client:app-1:watch'
REPLICA = 'replica-a'
A = keys.AddressKeys.of(ADDRESS)
T = keys.AddressKeys.of(TOPIC)
S = keys.SubscriptionKeys.of(SUBSCRIPTION)
RECORD = keys.commit_record(REPLICA, 3, 'c0ffee')
B = keys.BANDS - 5
"""The default priority's band (4), which the single-priority fast paths serve."""
MESSAGE = (b'\x00Sp\xc0\x01\x00', b'\x00Sw\xa1\x02hi', '0', '')
"""One message as the publishing scripts take it: header, rest, expiry, origin."""
BIG = (MESSAGE[0], b'\xfe' + b'0' * 32, '0', '')
"""A big message as they take it: its rest a stub (store/bodies.py), indexed by the script."""
BODY_A, BODY_T = A.body('0' * 32), T.body('0' * 32)
"""Its body's key, which the script deletes if it refuses the message."""


@dataclass(frozen=True)
class Case:
    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]


def now_ms() -> int:
    return int(time.time() * 1000)


CASES = [
    # an address and its subscriptions: the queue's group first, so the later ones find it
    Case('create_address', (A.meta, *A.streams, A.groups), ('queue', GROUP, 'e1')),
    Case('create_group', (*A.streams, A.groups), (GROUP, '0')),
    Case('create_group', (*T.streams, T.groups), (SUBSCRIPTION, '$')),
    # the message path
    Case('publish', (A.streams[B], A.groups, A.watchers, A.levels, A.body_index, BODY_A),
         ('queue', A.notify, REPLICA, *MESSAGE, *BIG)),
    Case('publish', (T.streams[B], T.groups, T.watchers, T.levels, T.body_index, BODY_T),
         ('topic', T.notify, REPLICA, *BIG)),
    Case('publish_limited', (A.streams[B], A.groups, *A.streams, A.watchers, A.levels,
                             A.body_index, BODY_A),
         ('queue', 1, 'drop-oldest', A.notify, REPLICA, *MESSAGE, *BIG)),
    Case('publish_claim', (A.streams[B], A.groups, A.body_index, BODY_A),
         (GROUP, REPLICA, 0, *MESSAGE, *BIG)),
    Case('publish_unique', (A.streams[B], A.groups, A.watchers, A.duplicates, *A.streams,
                            A.levels),
         ('queue', A.notify, REPLICA, 100, 60_000, 100, 'reject-publish', *MESSAGE, 'sID:1')),
    Case('publish_last', (A.streams[B], A.groups, A.watchers, A.duplicates, *A.streams,
                          A.last_values, A.last_value_order, A.levels),
         ('queue', A.notify, REPLICA, 100, 60_000, 100, 'reject-publish', GROUP, B, *MESSAGE,
          'sID:3', 'sdevice-1')),
    Case('fetch', *fetch_call(ADDRESS, GROUP, REPLICA, 10, consumers=1)),
    Case('fetch', *fetch_call(ADDRESS, GROUP, REPLICA, 10, consumers=1, read_default=False)),
    Case('browse', (A.streams[B],), (GROUP, '0-0', 10)),
    Case('backlog', (*A.streams, A.levels, A.returned(GROUP)), (GROUP,)),
    Case('notify', (A.watchers,), (A.notify, REPLICA)),
    Case('schedule', (A.scheduled, A.scheduled_messages),
         (now_ms(), f'{now_ms()}-m1', 0, *MESSAGE[:2], '0', '')),
    Case('release_due', (A.scheduled, A.scheduled_messages, *A.streams, A.groups, A.levels),
         (now_ms() + 60_000, 100, 'queue')),
    Case('reclaim', (A.streams[B], A.returned(GROUP), A.delivery_counts(GROUP)),
         (GROUP, 'replica-dead', 0, 100, '1')),
    Case('reclaim', (A.streams[B], A.returned(GROUP), A.delivery_counts(GROUP)),
         (GROUP, 'replica-dead', 0, 100, '1', 200, 2.0, 86_400_000)),
    Case('reclaim', (A.streams[B], A.returned(GROUP), A.delivery_counts(GROUP),
                     A.group_parked(GROUP)),
         (GROUP, 'replica-dead', 0, 100, '1', 200, 2.0, 86_400_000)),
    Case('release_later', (A.returned(GROUP), A.delivery_counts(GROUP)),
         ('0|000000000000001-0000000000', '0|1-0', '1', 200)),
    Case('release_behind', (A.returned(GROUP),),
         ('5|000000000000002-0000000000', '5|000000000000003-0000000000')),
    Case('trim', (A.streams[B], A.levels, A.body_index), (1000,)),
    # exclusive (single active) consumers: the line, the fetch gated on it, leaving and reaping
    Case('exclusive_join', (A.line(GROUP),), (f'{REPLICA}|c1|rx|1',)),
    Case('fetch', *fetch_call(ADDRESS, GROUP, REPLICA, 10, line_member=f'{REPLICA}|c1|rx|1')),
    Case('exclusive_leave', (A.line(GROUP), *A.streams, A.returned(GROUP)),
         (f'{REPLICA}|c1|rx|1', GROUP, REPLICA, A.notify)),
    Case('exclusive_reap', (A.line(GROUP),), ('replica-dead', A.notify)),
    # message groups: a replica's groups dropped (its last consumer left, or it was reaped)
    Case('groups_drop', (A.group_owners(GROUP), A.group_parked(GROUP), A.group_held(GROUP),
                         A.returned(GROUP)), (REPLICA, A.notify)),
    Case('groups_forget', (A.group_owners(GROUP), A.group_held(GROUP)), (REPLICA, 'g1', 'g2')),
    # named subscriptions (JMS) and their declarations (the operator)
    Case('join', (S.definition, S.consumers),
         ('c1', REPLICA, SUBSCRIPTION, '1', '1', 'client', 'app-1', 'watch', TOPIC, '', '0', 0,
          'e1')),
    Case('leave', (S.definition, S.consumers), ('c1', SUBSCRIPTION)),
    Case('unsubscribe', (S.definition, S.consumers), ('c1', SUBSCRIPTION)),
    Case('reap_consumers', (S.definition, S.consumers), ('replica-dead', SUBSCRIPTION)),
    Case('provision_subscription', (S.definition, S.consumers),
         (SUBSCRIPTION, 'watch', 'client', 'app-1', '1', TOPIC, '', '', 'ns/watch', '1', '0',
          'e2')),
    Case('deprovision_subscription', (S.definition, S.consumers),
         (SUBSCRIPTION, 'ns/watch', 'delete')),
    Case('delete_group',
         (*T.streams, T.groups, T.returned(SUBSCRIPTION), T.delivery_counts(SUBSCRIPTION),
          T.shares(SUBSCRIPTION), T.delivered(SUBSCRIPTION)),
         (SUBSCRIPTION,)),
    # ClientIDs and the replicas' liveness
    Case('release_client', (keys.CLIENTS,), ('app-1', f'{REPLICA}|1')),
    Case('release_clients', (keys.CLIENTS,), ('replica-dead',)),
    Case('renew_lease', renewal_keys(REPLICA), ('token', 5000, REPLICA)),
    # cross-shard commits (store/commits.py) and the indexes kept outside the scripts
    Case('commit_record', (RECORD, keys.commit_index(REPLICA, 3)), ('replica', REPLICA, 'n', 0)),
    Case('commit_apply', (A.commit_markers, *A.streams, A.groups, A.watchers, A.duplicates,
                          A.levels),
         (RECORD, 'queue', A.notify, REPLICA, 0, 0)),
    Case('commit_apply', (A.commit_markers, *A.streams, A.groups, A.watchers, A.duplicates,
                          A.levels),
         (f'{RECORD}:2', 'queue', A.notify, REPLICA, '1:100:60000', 0, 0, *MESSAGE, 'sID:2')),
    Case('commit_forget', (RECORD, keys.commit_index(REPLICA, 3)), ()),
    Case('index_forget', (keys.ADDRESSES,), ('gone', 'queue:e1')),
    Case('delete_address', (A.meta, A.body_index, *layout.address_keys(ADDRESS, [GROUP])), ()),
    # the management API's browse, move, retry, delete and purge (store/management.py)
    Case('manage_page', (A.streams[B], A.returned(GROUP)), (GROUP, 0, '0-0', 10, 100)),
    Case('manage_copy', (A.streams[B], A.groups, *A.streams, A.watchers, A.imports, A.levels),
         ('queue', 0, A.notify, 'elsewhere|0|1-1', *MESSAGE)),
    Case('manage_remove', (A.streams[B], A.returned(GROUP), A.delivery_counts(GROUP)),
         (GROUP, 0, '1-1')),
    Case('manage_purge', (*A.streams, A.returned(GROUP), A.delivery_counts(GROUP)), (GROUP,)),
    # the two-band layout moved forward at start (store/layout.py)
    Case('relayout_bands',
         (*A.two_bands, *A.streams, A.groups, A.levels, A.scheduled, A.scheduled_messages,
          A.last_values, A.last_value_order, A.returned(GROUP), A.delivery_counts(GROUP)),
         (GROUP,)),
]  # fmt: skip


def _lua_names() -> set[str]:
    """Every script the store runs: the files of lua/ that no other file includes."""
    names = {p.name[:-4] for p in resources.files('shoal_broker.store').joinpath('lua').iterdir()}
    included = set()
    for name in names:
        text = resources.files('shoal_broker.store').joinpath('lua', f'{name}.lua').read_text()
        included |= set(re.findall(r'^--! include (\w+)', text, re.MULTILINE))
    return names - included


@pytest.fixture
def cluster(redis_cluster: ClusterGroup) -> ClusterGroup:
    return redis_cluster


def _run(cluster: ClusterGroup, case: Case) -> Any:
    """EVAL on the node serving the first key's slot (a plain client: no client-side check)."""
    node = cluster.node(cluster.owner_of_slot(cluster.keyslot(case.keys[0])))
    client = node.client()
    try:
        return client.eval(scripts.source(case.script), len(case.keys), *case.keys, *case.args)
    finally:
        client.close()


def test_every_script_has_a_case() -> None:
    assert {case.script for case in CASES} == _lua_names()


@pytest.mark.parametrize(
    'case', [pytest.param(case, id=f'{case.script}-{i}') for i, case in enumerate(CASES)]
)
def test_the_script_runs_on_one_slot(cluster: ClusterGroup, case: Case) -> None:
    _run(cluster, case)  # Redis answers CROSSSLOT (ClusterCrossSlotError) for keys of two slots
    assert len({cluster.keyslot(key) for key in case.keys}) == 1


def test_a_commit_over_two_addresses_is_not_one_transaction(cluster: ClusterGroup) -> None:
    """A MULTI/EXEC over addresses on two slots is refused: why a transaction over several
    slots goes through a commit record on a cluster (store/transactions.py, docs/redis-modes.md)."""
    node = cluster.node(cluster.owner_of_slot(cluster.keyslot(A.streams[B])))
    client = node.client()
    try:
        pipe = client.pipeline(transaction=True)
        pipe.xack(A.streams[B], GROUP, '0-1')
        pipe.xack(T.streams[0], SUBSCRIPTION, '0-1')
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            pipe.execute()
        # the other address's slot is on another node (MOVED) or on this one (CROSSSLOT)
        assert isinstance(refused.value, redis.exceptions.MovedError) or (
            'CROSSSLOT' in str(refused.value)
        )
    finally:
        client.close()


def test_the_cluster_clients_reach_every_node(cluster: ClusterGroup) -> None:
    """The ``redis+cluster://`` URL's sync client (the lease thread's) finds all three primaries
    from one seed and follows MOVED to the right one."""
    from shoal_broker.store import connect

    seed = cluster.nodes[-1]
    client = connect.sync_cluster_client(f'redis+cluster://127.0.0.1:{seed.port}')
    try:
        assert len(client.get_primaries()) == 3
        for address in ('a', 'b', 'c', 'd'):
            key = keys.AddressKeys.of(address).groups
            client.sadd(key, GROUP)
            assert client.smembers(key) == {GROUP.encode()}
    finally:
        client.close()
