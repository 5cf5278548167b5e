"""
A one-slot commit (one ``MULTI``/``EXEC``) whose connection dies with the ``EXEC``'s outcome
(``store/transactions.py``), on a real Redis with a real broker and AMQP transaction client.

A proxy between the broker and Redis (``execcut.ExecCutter``) catches the commit's ``EXEC``:

- it lets it run, sees in Redis that the transaction's sends landed, then resets the connection
  before the reply gets back: the client must not be told "rolled back" (it would do its work
  again, its sends twice), and each message is on its queue exactly once, nothing lost (in
  ``memory`` durability, and in ``replicated`` with a replica confirming it);
- it does the same and also keeps Redis out of the broker's reach for longer than the broker
  asks (its settle time): the connection closes unanswered, and once Redis is back the broker
  learns the commit was applied and keeps its acks;
- it resets the connection just before the ``EXEC`` reaches Redis: nothing ran, so the commit is
  tried again within the store hold and answered committed, each message once; with the hold
  off the answer is "rolled back" and the acknowledged message comes back.

And a commit nothing breaks, in ``replicated`` durability: confirmed, answered committed.
"""

import threading
from collections.abc import Iterator

import pytest
import redis
from amqpclient import connect, receiver, send_all, sender, take_all
from execcut import ExecCutter
from processes import LOOPBACK, BrokerProcess, RedisServer, wait_for
from proton import ConnectionException, Delivery
from txnclient import Controller, accept_in, send_in

from shoal_broker.store import keys

EARLIER = 3
"""Messages in the source before the transaction takes the first: none may be lost."""
MOVED = ('moved-1', 'moved-2')
"""What the transaction sends to the target."""
QUIET_SECONDS = 2.0
"""A queue is drained once nothing comes for this long."""
OUT_OF_REACH_SECONDS = 7.0
"""Longer than the broker asks for a lost commit's marker before it gives up (5 s)."""


@pytest.fixture
def cut_broker(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[RedisServer, ExecCutter, BrokerProcess]]:
    """A broker reaching its Redis through the cutter; ``replicated`` (indirect parameter): in
    that durability, the Redis with a replica of its own; ``no-hold``: memory durability with
    the store hold off (SHOAL_STORE_HOLD_SECONDS=0)."""
    durability = getattr(request, 'param', 'memory')
    env = {'SHOAL_DURABILITY': durability}
    if durability == 'no-hold':
        env = {'SHOAL_DURABILITY': 'memory', 'SHOAL_STORE_HOLD_SECONDS': '0'}
    server = RedisServer()
    replica = None
    cutter = ExecCutter(server.port)
    broker = None
    try:
        if durability == 'replicated':
            replica = RedisServer(None, '--replicaof', LOOPBACK, str(server.port))
            wait_for(replica.linked, 10, 'the replica linked to its primary')
        broker = BrokerProcess(cutter.url, env=env)
        yield server, cutter, broker
    finally:
        if broker is not None:
            broker.stop()
        cutter.close()
        if replica is not None:
            replica.stop()
        server.stop()


def _seeded(
    broker: BrokerProcess, address: str, count: int = EARLIER
) -> tuple[str, str, list[str]]:
    """The transaction's source and target addresses, with ``count`` messages in the source."""
    source, target = f'{address}-in', f'{address}-out'
    before = [f'{address}-{n}' for n in range(count)]
    conn = connect(broker.url)
    send_all(conn, source, before)
    conn.close()
    return source, target, before


def _drained(broker: BrokerProcess, source: str, target: str) -> tuple[list[object], list[object]]:
    """What the target and the source hold, taken until nothing comes for a while."""
    conn = connect(broker.url)
    try:
        return take_all(conn, target, QUIET_SECONDS), take_all(conn, source, QUIET_SECONDS)
    finally:
        conn.close()


def _committed_once(
    broker: BrokerProcess, source: str, target: str, taken: object, before: list[str]
) -> None:
    """The transaction took the source's first message and sent each of ``MOVED`` once."""
    moved, back = _drained(broker, source, target)
    assert sorted(moved, key=str) == sorted(MOVED), f'not each once: {moved}'
    assert taken == before[0]
    assert sorted(back, key=str) == sorted(before[1:], key=str), f'lost or back: {back}'


def _commit_caught(
    broker: BrokerProcess,
    cutter: ExecCutter,
    source: str,
    target: str,
    *,
    run: bool | None,
    while_caught: threading.Thread | None = None,
) -> tuple[object, Delivery | None]:
    """Take the source's first message and send ``MOVED`` to the target in one transaction,
    its ``EXEC`` caught unless ``run`` is None; returns the message taken and the discharge's
    answer (None: the connection closed unanswered)."""
    conn = connect(broker.url)
    try:
        control = Controller(conn)
        rcv = receiver(conn, source, credit=1)
        snd = sender(conn, target)
        txn = control.declare()
        body = rcv.receive(timeout=10).body
        accept_in(rcv, txn)
        for moved in MOVED:
            send_in(conn, snd, txn, moved)
        if run is not None:
            cutter.arm(run=run)
        if while_caught is not None:
            while_caught.start()
        try:
            return body, control.discharge(txn, fail=False)
        except ConnectionException:
            return body, None
    finally:
        if while_caught is not None:
            while_caught.join()
        conn.close()


def _lose_the_reply(
    server: RedisServer,
    cutter: ExecCutter,
    broker: BrokerProcess,
    address: str,
    out_of_reach: float,
) -> Delivery | None:
    """Commit a transaction whose EXEC runs and whose reply is lost; assert that each message
    is on its queue once and nothing lost; returns the discharge's answer."""
    source, target, before = _seeded(broker, address)
    landed: dict[str, object] = {}
    direct = redis.Redis.from_url(server.url, socket_timeout=2)
    stream = keys.AddressKeys.of(target).streams[5]

    def cut_once_applied() -> None:
        """Once the EXEC reached Redis and its sends are there, lose its reply."""
        try:
            assert cutter.exec_sent.wait(10), 'the EXEC never came'
            wait_for(lambda: direct.xlen(stream) == len(MOVED), 10, 'the EXEC applied')
            landed['applied'] = True
        finally:
            cutter.cut(out_of_reach)

    try:
        taken, answer = _commit_caught(
            broker, cutter, source, target, run=True,
            while_caught=threading.Thread(target=cut_once_applied),
        )  # fmt: skip
    finally:
        direct.close()
    assert landed.get('applied'), 'the EXEC was not seen applied'
    assert answer is None or answer.remote_state == Delivery.ACCEPTED, (
        f'a commit applied in Redis was answered {answer.remote_state}: {answer.remote.condition}'
    )
    if answer is None:
        wait_for(lambda: 'a commit in doubt is' in broker.log(), 30, 'the outcome learnt')
    _committed_once(broker, source, target, taken, before)
    return answer


@pytest.mark.timeout(60)
@pytest.mark.parametrize('cut_broker', ['memory', 'replicated'], indirect=True)
def test_a_commit_whose_exec_reply_is_lost_is_not_answered_rolled_back(
    cut_broker: tuple[RedisServer, ExecCutter, BrokerProcess], address: str
) -> None:
    answer = _lose_the_reply(*cut_broker, address, out_of_reach=0.0)
    assert answer is not None, 'the discharge was not answered'
    assert answer.remote_state == Delivery.ACCEPTED, answer.remote_state
    assert 'a commit whose reply was lost is found applied' in cut_broker[2].log()


@pytest.mark.timeout(90)
def test_a_lost_exec_reply_with_redis_out_of_reach_closes_the_connection_unanswered(
    cut_broker: tuple[RedisServer, ExecCutter, BrokerProcess], address: str
) -> None:
    broker = cut_broker[2]
    answer = _lose_the_reply(*cut_broker, address, out_of_reach=OUT_OF_REACH_SECONDS)
    assert answer is None, f'the discharge was answered: {answer.remote_state}'
    assert 'transaction outcome unknown' in broker.log()
    assert 'a commit in doubt is applied after all' in broker.log()


@pytest.mark.timeout(60)
def test_a_commit_cut_before_its_exec_ran_is_committed_again_within_the_hold(
    cut_broker: tuple[RedisServer, ExecCutter, BrokerProcess], address: str
) -> None:
    _, cutter, broker = cut_broker
    source, target, before = _seeded(broker, address)
    taken, answer = _commit_caught(broker, cutter, source, target, run=False)
    assert cutter.exec_dropped.is_set(), 'the EXEC was not caught'
    assert answer is not None, 'the discharge was not answered'
    assert answer.remote_state == Delivery.ACCEPTED, answer.remote.condition
    assert 'commit not applied' in broker.log()  # tried again
    _committed_once(broker, source, target, taken, before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize('cut_broker', ['no-hold'], indirect=True)
def test_a_commit_cut_before_its_exec_ran_is_rolled_back_and_returns_its_acks(
    cut_broker: tuple[RedisServer, ExecCutter, BrokerProcess], address: str
) -> None:
    _, cutter, broker = cut_broker
    source, target, before = _seeded(broker, address)
    _, answer = _commit_caught(broker, cutter, source, target, run=False)
    assert cutter.exec_dropped.is_set(), 'the EXEC was not caught'
    assert answer is not None, 'the discharge was not answered'
    assert answer.remote_state == Delivery.REJECTED, answer.remote_state
    assert answer.remote.condition.name == 'amqp:transaction:rollback'
    moved, back = _drained(broker, source, target)
    assert moved == [], f'a rolled back send is there: {moved}'
    assert sorted(back, key=str) == sorted(before, key=str), f'lost: {back}, sent {before}'


@pytest.mark.timeout(60)
@pytest.mark.parametrize('cut_broker', ['replicated'], indirect=True)
def test_a_replicated_commit_confirmed_by_its_replica_is_answered_committed(
    cut_broker: tuple[RedisServer, ExecCutter, BrokerProcess], address: str
) -> None:
    _, cutter, broker = cut_broker
    source, target, before = _seeded(broker, address, 1)
    taken, answer = _commit_caught(broker, cutter, source, target, run=None)
    assert answer is not None, 'the discharge was not answered'
    assert answer.remote_state == Delivery.ACCEPTED, answer.remote.condition
    moved, back = _drained(broker, source, target)
    assert (taken, sorted(moved, key=str), back) == (before[0], sorted(MOVED), [])


@pytest.mark.timeout(60)
def test_an_exec_redis_reads_only_after_the_broker_asked_for_it_is_not_applied_twice(
    cut_broker: tuple[RedisServer, ExecCutter, BrokerProcess], address: str
) -> None:
    """The broker closes a commit's connection while the EXEC sits unread in a live Redis (as a
    +switch-master or a socket_timeout does), learns from the missing marker that nothing ran,
    commits again within the hold, and only then does Redis read the first EXEC: it must not
    apply (the marker read fenced it), or the transaction's sends are there twice."""
    _, cutter, broker = cut_broker
    source, target, before = _seeded(broker, address)
    cutter.arm_late()
    taken, answer = _commit_caught(broker, cutter, source, target, run=None)
    assert cutter.late_kept.is_set(), 'the EXEC was not kept'
    assert answer is not None, 'the discharge was not answered'
    assert answer.remote_state == Delivery.ACCEPTED, answer.remote.condition
    assert 'commit not applied' in broker.log()  # tried again
    cutter.release_late()  # Redis reads the first EXEC only now
    _committed_once(broker, source, target, taken, before)
