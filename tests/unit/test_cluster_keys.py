"""The Redis Cluster key layout (store/keys.py, docs/redis-modes.md): what one script touches
together hashes to one slot."""

import pytest
from redis.crc import key_slot

from shoal_broker.store import keys


def slots(*names: str) -> set[int]:
    return {key_slot(name.encode()) for name in names}


@pytest.mark.parametrize('address', ['orders', 'a:b}{c', 'jms.topic.prices', ''])
def test_an_address_keeps_all_its_keys_and_its_channel_on_one_slot(address: str) -> None:
    k = keys.AddressKeys.of(address)
    group = 'durable:client:app:watch'
    assert len(slots(
        *k.streams, k.groups, k.notify, k.scheduled, k.scheduled_messages, k.watchers, k.meta,
        k.commit_markers, k.transaction_marker('c0ffee'), k.returned(group), k.shares(group),
        k.delivered(group), k.delivery_counts(group),
    )) == 1  # fmt: skip


def test_a_replicas_liveness_is_on_one_slot_and_replicas_spread() -> None:
    r = keys.ReplicaKeys.of('replica-a')
    assert len(slots(r.lease, r.reaping, r.joined)) == 1
    spread = slots(*(keys.ReplicaKeys.of(f'replica-{n}').lease for n in range(20)))
    assert len(spread) > 1


def test_a_commit_record_shares_its_buckets_index_and_buckets_spread() -> None:
    for bucket in range(keys.COMMIT_BUCKETS):
        record = keys.commit_record('replica-a', bucket, 'c0ffee')
        assert slots(record) == slots(keys.commit_index('replica-a', bucket))
    assert len(slots(*(keys.commit_index('replica-a', b) for b in range(keys.COMMIT_BUCKETS)))) > 1
