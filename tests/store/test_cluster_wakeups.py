"""
A consumer's wake-ups across a failover of its address's shard, with real brokers on the real
cluster (docs/redis-modes.md, "Wake-ups: sharded pub/sub").

A replica with a consumer of an address subscribes to the address's shard channel and lists
itself among the address's watchers (``store/watching.py``); a message another replica publishes
then wakes it. Here the consumer attaches while the primary serving the address's slot is dead and
its replica not yet promoted, so the watch is refused (the connection to the dead primary fails,
or the cluster answers that the slot has no primary): it must be tried again once the cluster has
settled, or the consumer would wait for ever on a message published by the other replica.
"""

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from amqpclient import connect, receiver, send_all
from processes import BrokerProcess
from proton import Message
from redisclusters import ClusterGroup, ClusterNode

from shoal_broker.store import keys

WAKE_SECONDS = 5.0
"""How long the consumer may take to get the message once the cluster has settled: far more
than a wake-up takes, and no consumer polls (without a wake-up it never comes)."""


@pytest.fixture
def brokers(redis_cluster: ClusterGroup) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    consuming = BrokerProcess(redis_cluster.url)
    try:
        producing = BrokerProcess(redis_cluster.url)
        try:
            yield consuming, producing
        finally:
            producing.stop()
    finally:
        consuming.stop()


def _watchers(cluster: ClusterGroup, address: str) -> set[str]:
    client = cluster.client()
    try:
        listed = client.hkeys(keys.AddressKeys.of(address).watchers)
    finally:
        client.close()
    return {w.decode() for w in listed}


@pytest.mark.timeout(90)
def test_a_watch_refused_during_a_failover_is_applied_once_the_cluster_settles(
    redis_cluster: ClusterGroup, brokers: tuple[BrokerProcess, BrokerProcess], address: str
) -> None:
    consuming, producing = brokers
    on_producer = connect(producing.url)
    send_all(on_producer, address, ['before'])  # the queue exists, its slot known to both
    on_consumer = connect(consuming.url)
    rcv = receiver(on_consumer, address, credit=1)
    assert rcv.receive(timeout=10).body == 'before'
    rcv.accept()
    rcv.close()  # the consumer replica stops watching the address
    assert consuming.replica_id not in _watchers(redis_cluster, address)

    killed: list[ClusterNode] = []
    failover = threading.Thread(
        target=lambda: killed.append(
            redis_cluster.kill_primary_of(keys.AddressKeys.of(address).tag)[0]
        )
    )
    failover.start()
    try:
        time.sleep(0.1)  # the primary is dead; its replica takes over a second or two later
        rcv = receiver(on_consumer, address, credit=1)  # watched while nobody serves the slot
    finally:
        failover.join()
    try:
        deadline = time.monotonic() + 15
        while consuming.replica_id not in _watchers(redis_cluster, address):
            assert time.monotonic() < deadline, 'the consumer replica never listed itself again'
            time.sleep(0.1)
        time.sleep(1.0)  # the consumer's own retries of its failed fetch are over by now
        producer = on_producer.create_sender(address)
        producer.send(Message(body='after'))
        assert rcv.receive(timeout=WAKE_SECONDS).body == 'after'
        rcv.accept()
    finally:
        on_consumer.close()
        on_producer.close()
        for node in killed:
            try:
                redis_cluster.restart(node)
            except redis.exceptions.RedisError:
                pass
