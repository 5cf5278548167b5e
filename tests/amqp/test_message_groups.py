"""Message groups (properties.group-id, JMSXGroupID) over two replicas on one Redis: each group's
messages go to one consumer at a time, in order, and move with their unsettled messages first
when that consumer leaves (docs/architecture.md, "Message groups")."""

import collections
import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import redis
from amqpclient import Capabilities, connect, receiver, sender
from jmswire import JmsSource, jms_connect, subscriber
from mgmtapi import Api, quoted
from processes import BrokerProcess
from proton import Message, Timeout, symbol, timestamp
from proton.utils import BlockingReceiver
from txnclient import Controller, send_in

from shoal_broker.store import keys

FIRST = 'JMSXGroupFirstForConsumer'


def grouped(group: str, seq: int) -> Message:
    return Message(body=f'{group}:{seq}', group_id=group, group_sequence=seq)


def poll(rcv: BlockingReceiver) -> Message | None:
    try:
        return rcv.receive(timeout=0.05)
    except Timeout:
        return None


@pytest.mark.timeout(120)
def test_each_group_goes_in_order_to_one_consumer_over_two_replicas(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    groups, per_group = 40, 10
    urls = [broker.url, second_broker.url]
    conns = [connect(url) for url in urls]
    receivers = [receiver(conns[i % 2], address, credit=5) for i in range(4)]
    senders = [sender(conn, address) for conn in conns]
    for seq in range(per_group):  # producers on both replicas, each with half the groups
        for g in range(groups):
            senders[g % 2].send(grouped(f'g{g}', seq))
    seen: dict[str, list[int]] = collections.defaultdict(list)
    holders: dict[str, set[int]] = collections.defaultdict(set)
    total = 0
    deadline = time.monotonic() + 90
    while total < groups * per_group and time.monotonic() < deadline:
        for index, rcv in enumerate(receivers):
            message = poll(rcv)
            if message is None:
                continue
            rcv.accept()
            group, seq = message.body.split(':')
            seen[group].append(int(seq))
            holders[group].add(index)
            total += 1
    assert total == groups * per_group
    for group, seqs in seen.items():
        assert seqs == list(range(per_group)), group
    assert all(len(h) == 1 for h in holders.values()), 'one consumer per group'
    assert len({i for h in holders.values() for i in h}) >= 2, 'groups spread over consumers'
    for conn in conns:
        conn.close()


@pytest.mark.timeout(60)
def test_a_group_moves_with_its_unsettled_messages_first_and_marked_first_for_consumer(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    here, there = connect(broker.url), connect(second_broker.url)
    snd = sender(here, address)
    first = receiver(here, address, credit=3)
    for seq in range(3):
        snd.send(grouped('acct-1', seq))
    got = [first.receive(timeout=10) for _ in range(3)]  # held unsettled
    assert [m.body for m in got] == ['acct-1:0', 'acct-1:1', 'acct-1:2']
    assert (got[0].annotations or {}).get(FIRST) is True
    assert not (got[1].annotations or {}).get(FIRST)
    other = receiver(there, address, credit=10)  # a new consumer steals nothing
    for seq in range(3, 6):
        snd.send(grouped('acct-1', seq))
    assert poll(other) is None
    first.close()  # unsettled at detach: the group moves, those go first, delivery-count + 1
    moved = [other.receive(timeout=10) for _ in range(6)]
    for _ in moved:
        other.accept()
    assert [m.body for m in moved] == [f'acct-1:{seq}' for seq in range(6)]
    # the first three were unsettled at the detach; the client may have been sent the others
    # too (it tops up credit as the application receives)
    assert [m.delivery_count for m in moved[:3]] == [1, 1, 1]
    assert all(m.delivery_count <= 1 for m in moved[3:])
    assert (moved[0].annotations or {}).get(FIRST) is True
    assert not any((m.annotations or {}).get(FIRST) for m in moved[1:])
    here.close()
    there.close()


def test_ungrouped_messages_beside_groups_flow_to_every_consumer(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    a, b = receiver(conn, address, credit=20), receiver(conn, address, credit=20)
    snd = sender(conn, address)
    for i in range(10):
        snd.send(Message(body=f'plain:{i}'))
        snd.send(grouped('one', i))
    bodies: dict[int, list[str]] = {0: [], 1: []}
    deadline = time.monotonic() + 20
    while len(bodies[0]) + len(bodies[1]) < 20 and time.monotonic() < deadline:
        for index, rcv in enumerate((a, b)):
            if (message := poll(rcv)) is not None:
                rcv.accept()
                bodies[index].append(message.body)
    everything = bodies[0] + bodies[1]
    assert sorted(everything) == sorted([f'plain:{i}' for i in range(10)] +
                                        [f'one:{i}' for i in range(10)])  # fmt: skip
    holder = [i for i in (0, 1) if any(b.startswith('one:') for b in bodies[i])]
    assert len(holder) == 1
    assert [b for b in bodies[holder[0]] if b.startswith('one:')] == [f'one:{i}' for i in range(10)]
    conn.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize('durable', [True, False], ids=['durable', 'non-durable'])
def test_a_shared_subscription_pins_groups_and_moves_one_when_its_consumer_leaves(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str, durable: bool
) -> None:
    """Two JMS consumers of one shared subscription, one on each replica: each group stays with
    one of them, in order; closing one moves its groups, unsettled first, marked for the other."""
    shared = JmsSource('topic', 'shared', 'global', durable=durable)
    name = 'ledger|global' if durable else 'ledger|global-volatile1'
    conns = [jms_connect(broker.url), jms_connect(second_broker.url)]
    subs = [subscriber(conn, address, name, shared, credit=50) for conn in conns]
    time.sleep(0.3)  # both attached before the first message
    producer = connect(broker.url)
    snd = sender(producer, address, Capabilities('topic'))
    for seq in range(10):
        for g in range(6):
            snd.send(grouped(f'k{g}', seq))
    got: dict[int, list[Message]] = {0: [], 1: []}
    deadline = time.monotonic() + 20
    while len(got[0]) + len(got[1]) < 60 and time.monotonic() < deadline:
        for index, rcv in enumerate(subs):
            if (message := poll(rcv)) is not None:
                got[index].append(message)  # left unsettled
    assert len(got[0]) + len(got[1]) == 60
    holder = {m.group_id: i for i in (0, 1) for m in got[i]}
    for index in (0, 1):
        for g in {m.group_id for m in got[index]}:
            assert [m.group_sequence for m in got[index] if m.group_id == g] == list(range(10))
            assert holder[g] == index
    leaving = 0 if got[0] else 1
    staying = 1 - leaving
    moved_groups = {m.group_id for m in got[leaving]}
    conns[leaving].close()  # its connection drops with everything unsettled
    again: list[Message] = []
    deadline = time.monotonic() + 20
    while len(again) < len(got[leaving]) and time.monotonic() < deadline:
        if (message := poll(subs[staying])) is not None:
            again.append(message)
    assert len(again) == len(got[leaving])
    for g in moved_groups:
        mine = [m for m in again if m.group_id == g]
        assert [m.group_sequence for m in mine] == list(range(10))
        assert all(m.delivery_count == 1 for m in mine)
        assert (mine[0].annotations or {}).get(FIRST) is True
    conns[staying].close()
    producer.close()


def _held_by(receivers: list[BlockingReceiver], count: int) -> dict[str, set[int]]:
    """Receive ``count`` messages over ``receivers`` (accepting each): group -> receivers."""
    holders: dict[str, set[int]] = collections.defaultdict(set)
    deadline, got = time.monotonic() + 20, 0
    while got < count and time.monotonic() < deadline:
        for index, rcv in enumerate(receivers):
            if (message := poll(rcv)) is not None:
                rcv.accept()
                holders[message.group_id].add(index)
                got += 1
    assert got == count
    return holders


@pytest.mark.timeout(60)
@pytest.mark.parametrize('rebalance', [False, True], ids=['sticky', 'rebalance'])
def test_a_new_consumer_takes_groups_only_when_the_queue_rebalances(
    start_broker: Callable[..., BrokerProcess], store_client: redis.Redis, address: str,
    rebalance: bool,
) -> None:  # fmt: skip
    store_client.hset('shoal:policies', f'queue:{address}',
                      json.dumps({'group_rebalance': rebalance}))  # fmt: skip
    b = start_broker()
    conn = connect(b.url)
    snd = sender(conn, address)
    first = receiver(conn, address, credit=20)
    for g in range(8):
        snd.send(grouped(f'r{g}', 0))
    assert _held_by([first], 8).keys() == {f'r{g}' for g in range(8)}
    second = receiver(conn, address, credit=20)  # everything settled: nothing in flight
    time.sleep(0.3)
    for g in range(8):
        snd.send(grouped(f'r{g}', 1))
    holders = _held_by([first, second], 8)
    taken = {g for g, held in holders.items() if 1 in held}
    if rebalance:
        assert taken, 'the new consumer took its share'
    else:
        assert taken == set(), 'the new consumer stole nothing'
    conn.close()


def test_shoal_queues_shows_the_active_groups_of_a_queue(
    broker: BrokerProcess, address: str, store_url: str
) -> None:
    conn = connect(broker.url)
    snd = sender(conn, address)
    rcv = receiver(conn, address, credit=20)
    for g in range(3):
        snd.send(grouped(f'a{g}', 0))
    _held_by([rcv], 3)
    done = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', store_url, 'queues', '--json'],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    [row] = [r for r in json.loads(done.stdout) if r['name'] == address]
    assert row['active_groups'] == 3
    table = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', store_url, 'queues'],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert table[0].split()[-2:] == ['ACTIVE-GROUPS', 'LAST-VALUES']
    [line] = [t for t in table if t.split()[0] == address]
    assert line.split()[-2:] == ['3', '-']  # not a last-value queue
    assert Api(broker).get(f'/queues/{quoted(address)}')['active_groups'] == 3  # the API's row
    conn.close()


def test_scheduled_messages_keep_their_group(broker: BrokerProcess, address: str) -> None:
    conn = connect(broker.url)
    a, b = receiver(conn, address, credit=20), receiver(conn, address, credit=20)
    snd = sender(conn, address)
    due = int(time.time() * 1000) + 300
    for seq in range(6):
        message = grouped('later', seq)
        message.annotations = {symbol('x-opt-delivery-time'): timestamp(due)}
        snd.send(message)
    holders = _held_by([a, b], 6)
    assert len(holders['later']) == 1
    conn.close()


def test_messages_sent_in_a_transaction_keep_their_group(
    broker: BrokerProcess, address: str
) -> None:
    conn = connect(broker.url)
    a, b = receiver(conn, address, credit=20), receiver(conn, address, credit=20)
    snd = sender(conn, address)
    controller = Controller(conn)
    txn = controller.declare()
    for seq in range(6):
        send_in(conn, snd, txn, grouped('in-txn', seq))
    controller.discharge(txn, fail=False)
    holders = _held_by([a, b], 6)
    assert len(holders['in-txn']) == 1
    conn.close()


def test_messages_moved_by_the_management_api_keep_their_group(
    broker: BrokerProcess, store_client: redis.Redis, address: str
) -> None:
    source, target = f'{address}-src', f'{address}-dst'
    conn = connect(broker.url)
    snd = sender(conn, source)
    receiver(conn, target, credit=0).close()  # the target queue exists
    for seq in range(6):
        snd.send(grouped('moved', seq))
    moved = Api(broker).post(f'/queues/{quoted(source)}/move', {'target': target})
    assert moved['moved'] == 6
    entries = store_client.xrange(keys.AddressKeys.of(target).streams[5])
    assert [fields.get(b'g') for _, fields in entries] == [b'moved'] * 6
    assert all(b'\x1f' not in fields.get(b'c', b'') for _, fields in entries)
    conn.close()
