"""A committing replica killed (SIGKILL) at whatever moment its timer falls on, while it runs one
transaction after another: each moves a message from a source queue to two other queues (on
different hash slots of a Redis Cluster, where the commit goes through a commit record:
docs/redis-modes.md, "Transactions across shards"). Once the dead replica is reaped, every
transaction is all or nothing as consumers on another replica see it: its message is in both
queues and not back in the source, or in neither and back in the source; none is in a queue
twice, and every commit the client was told of is there."""

import signal
import threading

from amqpclient import connect, receiver, send_all, sender, take_all
from processes import BrokerProcess, wait_for
from proton import Delivery
from redis.crc import key_slot
from txnclient import Controller, accept_in, send_in

from shoal_broker.store import keys

FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}
MESSAGES = 300
"""Per round: more than a killed replica gets through before its timer fires."""
KILL_AFTER_SECONDS = (0.3, 0.6, 0.9)
"""One round each, the victim killed that long after it starts committing."""
SETTLE_SECONDS = 20.0
"""Bound on draining one queue, and on the dead replica's reaping."""
QUIET_SECONDS = 1.0
"""A queue is drained once nothing comes for this long (the dead replica is reaped by then:
what it held is back, its decided commits applied)."""


def _on_two_slots(stem: str) -> tuple[str, str]:
    """Two queue names whose keys live on different hash slots."""
    first = f'{stem}-a'
    slot = key_slot(keys.AddressKeys.of(first).tag.encode())
    second = next(
        f'{stem}-b{i}'
        for i in range(100)
        if key_slot(keys.AddressKeys.of(f'{stem}-b{i}').tag.encode()) != slot
    )
    return first, second


def _commit_until_killed(url: str, source: str, left: str, right: str) -> set[int]:
    """Move messages in transactions until the broker dies; the bodies of those whose commit
    was answered "accepted"."""
    committed: set[int] = set()
    try:
        conn = connect(url)
        control = Controller(conn)
        rcv = receiver(conn, source, credit=1)
        to_left, to_right = sender(conn, left), sender(conn, right)
        for _ in range(MESSAGES):
            txn = control.declare()
            body = rcv.receive(timeout=5).body
            accept_in(rcv, txn)
            send_in(conn, to_left, txn, body)
            send_in(conn, to_right, txn, body)
            if control.discharge(txn, fail=False).remote_state == Delivery.ACCEPTED:
                committed.add(body)
    except Exception:
        pass
    return committed


def test_each_transaction_of_a_killed_committer_is_all_or_nothing(
    start_broker, store_client, address: str
) -> None:  # type: ignore[no-untyped-def]
    survivor: BrokerProcess = start_broker(env=FAST_LEASE)
    conn = connect(survivor.url)
    for n, delay in enumerate(KILL_AFTER_SECONDS):
        source = f'{address}-{n}-in'
        left, right = _on_two_slots(f'{address}-{n}')
        send_all(conn, source, range(MESSAGES))
        doomed: BrokerProcess = start_broker(env=FAST_LEASE)
        timer = threading.Timer(delay, doomed.process.send_signal, (signal.SIGKILL,))
        timer.start()
        committed = _commit_until_killed(doomed.url, source, left, right)
        timer.join()
        doomed.process.wait(timeout=5)
        # what the dead replica held comes back once it is reaped, and its reaper completes its
        # decided commits before that; the replica index forgets it last
        dead = doomed.replica_id
        wait_for(
            lambda dead=dead: not store_client.sismember(keys.REPLICAS, dead),
            SETTLE_SECONDS,
            f'{dead} reaped',
        )
        found = {
            name: take_all(conn, name, QUIET_SECONDS, credit=50, limit=SETTLE_SECONDS)
            for name in (source, left, right)
        }
        moved, also, back = set(found[left]), set(found[right]), set(found[source])
        assert sorted(found[left]) == sorted(moved), 'a send applied twice'
        assert sorted(found[right]) == sorted(also), 'a send applied twice'
        assert moved == also, f'half applied: {sorted(moved ^ also)}'
        assert not moved & back, f'moved and back as well: {sorted(moved & back)}'
        assert moved | back == set(range(MESSAGES)), (
            f'lost: {sorted(set(range(MESSAGES)) - moved - back)}'
        )
        assert committed <= moved, f'answered committed, not applied: {committed - moved}'
    conn.close()
