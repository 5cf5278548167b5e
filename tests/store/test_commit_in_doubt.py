"""
A cross-shard commit whose outcome the broker cannot learn (docs/redis-modes.md, "Transactions
across shards"), on the real cluster with a real broker and a real AMQP client.

Each test moves one message from a source queue to two queues on other hash slots in one
transaction, breaks the commit record's write or its confirmation at the moment of the discharge,
and then checks what the client and the queues see:

- the broker closes the client's connection and never answers the discharge (a rollback answer
  could be false, and a "committed" one could be too);
- afterwards the transaction is all or nothing: the message is in both target queues once and not
  back in the source, or in neither and back in the source;
- nothing accepted before it is lost.

How the outcome is made unknowable, in ``replicated`` durability (a write counts once its shard's
replica confirms it with ``WAIT``):

- every replica is stopped (SIGSTOP): the record is written on its primary but no replica confirms
  it, nor its deletion (a failover could bring either back);
- the record is seen written, then its primary pauses writes (``CLIENT PAUSE WRITE``) and every
  connection to it is cut (``CLIENT KILL``) again and again: the record's reply is lost and its
  deletion never runs, so the record stays, written, past the broker's settle time.

On one Redis server (standalone, Sentinel) the commit is one ``MULTI``/``EXEC``, with the same
doubt when its replica does not confirm it: applied on the primary, lost only by a failover.
"""

import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from amqpclient import connect, receiver, send_all, sender, take_all
from processes import LOOPBACK, BrokerProcess, RedisServer, wait_for
from proton import ConnectionException
from redis.crc import key_slot
from redisclusters import ClusterGroup, ClusterNode
from txnclient import Controller, accept_in, send_in

from shoal_broker.store import keys

REPLICATED = {
    'SHOAL_DURABILITY': 'replicated',
    'SHOAL_REPLICATION_TIMEOUT_MS': '1500',
    'SHOAL_TRIM_INTERVAL_SECONDS': '1',  # the committer's own leftover records, completed soon
    # the in-doubt rule itself: with a hold, a commit first waits up to its bound for the outcome
    # (tests/chaos/test_store_hold.py) and meets this rule only past it
    'SHOAL_STORE_HOLD_SECONDS': '0',
}
EARLIER = 4
"""Messages accepted into the source before the transaction: none of them may be lost."""
QUIET_SECONDS = 2.0
"""A queue is drained once nothing comes for this long (once the broker knows the outcome)."""
SETTLED_SECONDS = 30.0
"""Bound on the broker learning a commit's outcome once Redis is whole again."""
CUT_SECONDS = 7.0
"""How long the record's primary refuses the broker: longer than the broker's settle time (5 s)
for the record's deletion."""
CLOSED_SECONDS = 20.0
"""Bound on the broker closing the connection of a discharge it cannot answer: ~7 s alone (the
replication timeout, then the settle time), past 10 s once beside the suite's three workers on
two vCPUs."""


def _on_other_slots(stem: str) -> tuple[str, str, str]:
    """A source queue and two target queues, each on a hash slot of its own."""
    names: list[str] = []
    slots: set[int] = set()
    for i in range(1000):
        name = f'{stem}-{i}'
        slot = key_slot(keys.AddressKeys.of(name).tag.encode())
        if slot not in slots:
            names.append(name)
            slots.add(slot)
        if len(names) == 3:
            return names[0], names[1], names[2]
    raise AssertionError('no three slots')


def _replicas(cluster: ClusterGroup) -> list[ClusterNode]:
    primaries = cluster.primaries()
    return [node for node in cluster.nodes if node.running and node not in primaries]


def _indexes(cluster: ClusterGroup, replica_id: str) -> dict[ClusterNode, list[str]]:
    """The commit record indexes of ``replica_id`` (one per bucket), by the primary holding
    them (asked while every node answers: a stopped one would not)."""
    found: dict[ClusterNode, list[str]] = {}
    for bucket in range(keys.COMMIT_BUCKETS):
        index = keys.commit_index(replica_id, bucket)
        owner = cluster.node(cluster.owner_of_slot(key_slot(index.encode())))
        found.setdefault(owner, []).append(index)
    return found


def _records(indexes: dict[ClusterNode, list[str]]) -> dict[ClusterNode, list[bytes]]:
    """The commit records listed in ``indexes``, by the primary holding them."""
    found: dict[ClusterNode, list[bytes]] = {}
    for node, names in indexes.items():
        client = node.client(1.0)
        try:
            records = [r for index in names for r in client.smembers(index)]
        finally:
            client.close()
        if records:
            found[node] = records
    return found


@pytest.fixture
def replicated_broker(redis_cluster: ClusterGroup) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(redis_cluster.url, env=REPLICATED)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def thaw(redis_cluster: ClusterGroup) -> Iterator[list[ClusterNode]]:
    """Nodes a test stops (SIGSTOP): resumed at the end, the cluster ok again after."""
    stopped: list[ClusterNode] = []
    yield stopped
    for node in stopped:
        node.process.send_signal(signal.SIGCONT)
    for node in redis_cluster.primaries():
        client = node.client(1.0)
        try:
            client.execute_command('CLIENT', 'UNPAUSE')
        finally:
            client.close()
    redis_cluster.wait_ok()


def _move_in_doubt(
    broker: BrokerProcess, source: str, left: str, right: str, break_commit: Callable[[], None]
) -> None:
    """Take the source's first message and send it to both targets in one transaction, call
    ``break_commit`` just before the discharge, and check that the discharge is never answered
    and the connection closed."""
    conn = connect(broker.url)
    control = Controller(conn)
    rcv = receiver(conn, source, credit=1)
    to_left, to_right = sender(conn, left), sender(conn, right)
    txn = control.declare()
    body = rcv.receive(timeout=10).body
    accept_in(rcv, txn)
    send_in(conn, to_left, txn, body)
    send_in(conn, to_right, txn, body)
    break_commit()
    answered = None
    with pytest.raises(ConnectionException):
        answered = control.discharge(txn, fail=False, timeout=CLOSED_SECONDS)
    assert answered is None, f'the discharge was answered: {answered.remote_state}'
    conn.close()


def _wait_for_the_outcome(broker: BrokerProcess) -> None:
    wait_for(lambda: 'a commit in doubt is' in broker.log(), SETTLED_SECONDS, 'the outcome')


def _all_or_nothing(
    broker: BrokerProcess, source: str, left: str, right: str, before: list[object]
) -> str:
    """Drain the three queues; assert that the transaction moving ``before[0]`` is all or
    nothing and that every message of ``before`` is somewhere; returns which it was."""
    conn = connect(broker.url)
    try:
        back = take_all(conn, source, QUIET_SECONDS)
        moved, also = take_all(conn, left, QUIET_SECONDS), take_all(conn, right, QUIET_SECONDS)
    finally:
        conn.close()
    body = before[0]
    assert sorted(back, key=str) == sorted(set(back), key=str), f'the source twice: {back}'
    assert moved == also, f'half applied: left {moved}, right {also}'
    if moved:
        assert moved == [body], f'applied twice or wrong: {moved}'
        assert body not in back, f'applied and back in the source as well: {back}'
        assert sorted(back, key=str) == sorted(before[1:], key=str), f'lost: {back}'
        return 'all'
    assert sorted(back, key=str) == sorted(before, key=str), f'lost: {back}, sent {before}'
    return 'nothing'


@pytest.mark.timeout(90)
def test_a_commit_no_replica_confirms_closes_the_connection_and_is_all_or_nothing(
    redis_cluster: ClusterGroup,
    replicated_broker: BrokerProcess,
    thaw: list[ClusterNode],
    address: str,
) -> None:
    source, left, right = _on_other_slots(address)
    before = [f'{address}-{n}' for n in range(EARLIER)]
    conn = connect(replicated_broker.url)
    send_all(conn, source, before)
    conn.close()

    def stop_every_replica() -> None:
        for node in _replicas(redis_cluster):
            node.process.send_signal(signal.SIGSTOP)
            thaw.append(node)

    _move_in_doubt(replicated_broker, source, left, right, stop_every_replica)
    assert 'transaction outcome unknown' in replicated_broker.log()
    for node in thaw:
        node.process.send_signal(signal.SIGCONT)
    redis_cluster.wait_ok()
    _wait_for_the_outcome(replicated_broker)
    # the record's deletion ran on its primary (only its confirmation failed): once the
    # replicas confirm it, the broker knows nothing was applied and returns the acked message
    assert _all_or_nothing(replicated_broker, source, left, right, before) == 'nothing'
    assert 'a commit in doubt is found not applied' in replicated_broker.log()
    assert not _records(_indexes(redis_cluster, replicated_broker.replica_id)), 'a record left'


@pytest.mark.timeout(90)
def test_a_commit_record_written_and_cut_off_closes_the_connection_and_is_all_or_nothing(
    redis_cluster: ClusterGroup,
    replicated_broker: BrokerProcess,
    thaw: list[ClusterNode],
    address: str,
) -> None:
    source, left, right = _on_other_slots(address)
    before = [f'{address}-{n}' for n in range(EARLIER)]
    conn = connect(replicated_broker.url)
    send_all(conn, source, before)
    conn.close()
    cut: dict[str, object] = {}
    indexes = _indexes(redis_cluster, replicated_broker.replica_id)
    cutter = threading.Thread(target=_cut_the_record_off, args=(indexes, cut))

    def stop_replicas_and_cut() -> None:
        for node in _replicas(redis_cluster):  # the record's WAIT waits: the window to cut in
            node.process.send_signal(signal.SIGSTOP)
            thaw.append(node)
        cutter.start()

    try:
        _move_in_doubt(replicated_broker, source, left, right, stop_replicas_and_cut)
    finally:
        cutter.join()
    assert cut.get('cut'), f'the record was never seen written: {cut}'
    assert cut.get('kept'), f'the record went while cut off: {cut}'
    assert 'transaction outcome unknown' in replicated_broker.log()
    for node in thaw:
        node.process.send_signal(signal.SIGCONT)
    redis_cluster.wait_ok()
    _wait_for_the_outcome(replicated_broker)
    # the record stayed written: the broker finds it once Redis answers, and completes it
    assert _all_or_nothing(replicated_broker, source, left, right, before) == 'all'
    assert 'a commit in doubt is applied after all' in replicated_broker.log()
    assert not _records(_indexes(redis_cluster, replicated_broker.replica_id)), 'a record left'


def _cut_the_record_off(indexes: dict[ClusterNode, list[str]], cut: dict[str, object]) -> None:
    """Once the broker's record is written (its WAIT still waiting, the replicas stopped), the
    record's primary pauses writes and cuts every connection for ``CUT_SECONDS``: the record's
    reply is lost with its connection, and each attempt to delete it is cut before it runs.
    Sets ``cut['cut']`` once it started, ``cut['kept']`` when the record was still there at the
    end, ``cut['error']`` to what Redis answered if it failed."""
    deadline = time.monotonic() + 10
    holders: dict[ClusterNode, list[bytes]] = {}
    try:
        while not holders and time.monotonic() < deadline:
            holders = _records(indexes)
        if not holders:
            return
        (node,) = holders
        client = node.client(1.0)
        try:
            client.execute_command('CLIENT', 'PAUSE', int(CUT_SECONDS * 1000) + 2000, 'WRITE')
            cut['cut'] = True
            until = time.monotonic() + CUT_SECONDS
            while time.monotonic() < until:
                client.execute_command('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
                time.sleep(0.02)
            cut['kept'] = bool(client.exists(*holders[node]))
            client.execute_command('CLIENT', 'UNPAUSE')
        finally:
            client.close()
    except redis.exceptions.RedisError as exc:
        cut['error'] = repr(exc)


@pytest.mark.timeout(60)
def test_a_one_server_commit_no_replica_confirms_closes_the_connection_and_is_applied(
    address: str,
) -> None:
    primary = RedisServer()
    replica = RedisServer(None, '--replicaof', LOOPBACK, str(primary.port))
    broker = None
    try:
        wait_for(replica.linked, 10, 'the replica linked to its primary')
        broker = BrokerProcess(primary.url, env=REPLICATED)
        source, left, right = _on_other_slots(address)
        before = [f'{address}-{n}' for n in range(EARLIER)]
        conn = connect(broker.url)
        send_all(conn, source, before)
        conn.close()
        _move_in_doubt(
            broker, source, left, right, lambda: replica.process.send_signal(signal.SIGSTOP)
        )
        assert 'transaction outcome unknown' in broker.log()
        replica.process.send_signal(signal.SIGCONT)
        # applied on the primary, where it stays (no failover): its acks are not returned
        assert _all_or_nothing(broker, source, left, right, before) == 'all'
    finally:
        if broker is not None:
            broker.stop()
        replica.process.send_signal(signal.SIGCONT)
        replica.stop()
        primary.stop()
