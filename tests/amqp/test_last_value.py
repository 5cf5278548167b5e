"""
Last-value queues (docs/architecture.md#last-value-queues): per key value, a queue keeps only the
newest message it has not delivered; a delivered message, settled or not, is never replaced (the
new one is kept beside it). Declared by address pattern (SHOAL_LAST_VALUE_ADDRESSES) or by a
Queue's ``lastValue{}`` (its policy, as the operator files it).
"""

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from amqpclient import (
    connect,
    nothing_more,
    receive_all,
    receiver,
    send_with_outcome,
    sender,
    take_all,
)
from exposition import samples, value
from processes import BrokerProcess, wait_for
from proton import Delivery, Message
from proton.utils import BlockingConnection, BlockingSender
from txnclient import Controller, send_in

from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.store import keys

ACCEPTED = (Delivery.ACCEPTED, None)
KEY = '_AMQ_LVQ_NAME'
REPLACED = 'shoal_messages_replaced_total'
KEYS_ = 100
UPDATES = 10_000


def lvq_env(address: str) -> dict[str, str]:
    return {'SHOAL_LAST_VALUE_ADDRESSES': f'{address},other-*'}


def update(key: int | None, producer: str, seq: int, prop: str = KEY) -> Message:
    properties = {} if key is None else {prop: f'k{key}'}
    return Message(body={'key': key, 'producer': producer, 'seq': seq}, properties=properties)


def send_many(conn: BlockingConnection, snd: BlockingSender, messages: list[Message]) -> None:
    """Send without waiting for each disposition (as much as the credit allows); then wait until
    every one is settled, accepted."""
    link, sent, pending = snd.link, 0, []
    deadline = time.monotonic() + 50
    while sent < len(messages):
        assert time.monotonic() < deadline, 'sending took too long'
        conn.wait(lambda: link.credit > 0, timeout=20, msg='credit')
        for _ in range(min(link.credit, len(messages) - sent)):
            delivery = link.delivery(f'{sent}')
            link.send(messages[sent].encode())
            link.advance()
            pending.append(delivery)
            sent += 1
    conn.wait(lambda: all(d.remote_state for d in pending), timeout=40, msg='dispositions')
    assert {d.remote_state for d in pending} == {Delivery.ACCEPTED}
    for d in pending:
        d.settle()


def bodies(conn: BlockingConnection, address: str, count: int) -> list[dict[str, Any]]:
    rcv = receiver(conn, address, credit=200)
    found = [m.body for m in receive_all(rcv, count)]
    assert nothing_more(rcv, 0.5)
    rcv.close()
    return found


@pytest.mark.timeout(120)
def test_ten_thousand_updates_leave_the_newest_per_key(
    start_broker: Any, address: str, store_client: Any
) -> None:
    b = start_broker(env=lvq_env(address))
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        send_many(conn, snd, [update(i % KEYS_, 'a', i) for i in range(UPDATES)])
        assert store_client.xlen(keys.AddressKeys.of(address).streams[5]) == KEYS_
        got = bodies(conn, address, KEYS_)
        newest = {key: UPDATES - KEYS_ + key for key in range(KEYS_)}
        assert {m['key']: m['seq'] for m in got} == newest
        assert [m['seq'] for m in got] == sorted(m['seq'] for m in got)  # in store order
        wait_for(lambda: value(samples(b), REPLACED, address=address) == UPDATES - KEYS_, 10,
                 'the replaced count')  # fmt: skip
        # the keys the queue read past are swept by the next publishes (up to 18 each)
        k = keys.AddressKeys.of(address)
        assert store_client.hlen(k.last_values) == KEYS_
        for key in range(KEYS_, KEYS_ + 10):
            assert send_with_outcome(conn, snd, update(key, 'a', key)) == ACCEPTED
        assert store_client.hlen(k.last_values) == 10
        assert store_client.zcard(k.last_value_order) == 10
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_two_producers_on_two_replicas(start_broker: Any, address: str, store_client: Any) -> None:
    """Concurrent updates through two replicas: one message per key is left, the last of one of
    the producers for that key (each producer's later update replaces its earlier one in store
    order). Then updates one after the other, alternating replicas, on half the keys: each of
    those keys keeps exactly the one the store accepted last."""
    first, second = start_broker(env=lvq_env(address)), start_broker(env=lvq_env(address))
    one, two = connect(first.url), connect(second.url)
    try:
        per = UPDATES // 2
        work = {
            'a': (one, sender(one, address), [update(i % KEYS_, 'a', i) for i in range(per)]),
            'b': (two, sender(two, address), [update(i % KEYS_, 'b', i) for i in range(per)]),
        }
        failures: list[BaseException] = []

        def run(name: str) -> None:
            try:
                send_many(*work[name])
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(n,)) for n in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures
        assert not any(t.is_alive() for t in threads)
        last = {n: {m.body['key']: m.body['seq'] for m in msgs} for n, (_, _, msgs) in work.items()}
        final = {}
        for key in range(KEYS_ // 2):  # one after the other: the store order is the send order
            name = 'ab'[key % 2]
            conn, snd, _ = work[name]
            for seq in (per + key, per + KEYS_ + key):
                assert send_with_outcome(conn, snd, update(key, name, seq)) == ACCEPTED
            final[key] = (name, per + KEYS_ + key)
        assert store_client.xlen(keys.AddressKeys.of(address).streams[5]) == KEYS_
        got = bodies(one, address, KEYS_)
        survivors = {m['key']: (m['producer'], m['seq']) for m in got}
        assert sorted(survivors) == list(range(KEYS_))
        for key, (name, seq) in survivors.items():
            if key in final:
                assert (name, seq) == final[key]
            else:
                assert seq == last[name][key]
        sent = UPDATES + KEYS_  # the second part sent two updates to each of half the keys

        def replaced() -> float:
            return sum(value(samples(b), REPLACED, address=address) for b in (first, second))

        wait_for(lambda: replaced() == sent - KEYS_, 10, 'every update but the last replaced')
    finally:
        one.close()
        two.close()


def test_a_delivered_unsettled_message_is_not_replaced(start_broker: Any, address: str) -> None:
    """The update is kept beside the message a consumer holds; released, that one comes again."""
    b = start_broker(env=lvq_env(address))
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        assert send_with_outcome(conn, snd, update(1, 'a', 1)) == ACCEPTED
        rcv = receiver(conn, address, credit=1)
        assert rcv.receive(timeout=10).body['seq'] == 1  # delivered, unsettled
        assert send_with_outcome(conn, snd, update(1, 'a', 2)) == ACCEPTED
        rcv.release()
        rcv.close()
        again = receiver(conn, address, credit=10)
        assert sorted(m.body['seq'] for m in receive_all(again, 2)) == [1, 2]
        assert nothing_more(again)
        assert (REPLACED, (('address', address),)) in samples(b)
        assert value(samples(b), REPLACED, address=address) == 0
    finally:
        conn.close()


def test_messages_without_the_key_are_kept_and_a_queue_declares_its_own_property(
    start_broker: Any, address: str, store_client: Any
) -> None:
    b = start_broker()
    policy = EntityPolicy(last_value=True, last_value_property='device')
    store_client.hset(keys.POLICIES, f'queue:{address}', policy.to_json())
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        probe = update(0, 'a', -1, 'device')

        def replaced() -> bool:  # the policy reaches the replica within its refresh
            assert send_with_outcome(conn, snd, probe) == ACCEPTED
            return value(samples(b), REPLACED, address=address) >= 1

        wait_for(replaced, 15, 'the declared policy')
        assert take_all(conn, address, 0.5)[-1]['seq'] == -1  # the probes: a clean start
        sent = [update(None, 'a', 0), update(1, 'a', 1, 'device'), update(None, 'a', 2),
                update(1, 'a', 3, 'device'), update(1, 'a', 4)]  # fmt: skip
        for m in sent:  # the last one keys by the default property: not this queue's
            assert send_with_outcome(conn, snd, m) == ACCEPTED
        got = [m['seq'] for m in bodies(conn, address, 4)]
        assert got == [0, 2, 3, 4]
        assert store_client.hlen(keys.AddressKeys.of(address).last_values) <= 2
    finally:
        store_client.hdel(keys.POLICIES, f'queue:{address}')
        conn.close()


def test_off_keeps_every_update(broker: BrokerProcess, address: str, store_client: Any) -> None:
    conn = connect(broker.url)
    try:
        snd = sender(conn, address)
        for seq in range(3):
            assert send_with_outcome(conn, snd, update(1, 'a', seq)) == ACCEPTED
        assert [m['seq'] for m in bodies(conn, address, 3)] == [0, 1, 2]
        assert not store_client.exists(keys.AddressKeys.of(address).last_values)
    finally:
        conn.close()


def test_sends_in_a_transaction_are_stored_unreplaced(start_broker: Any, address: str) -> None:
    """A transaction's sends are applied by the commit's own scripts: kept, none replaced."""
    b = start_broker(env=lvq_env(address))
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        controller = Controller(conn)
        txn = controller.declare()
        for seq in (1, 2):
            send_in(conn, snd, txn, update(1, 'a', seq))
        assert controller.discharge(txn, fail=False).remote_state == Delivery.ACCEPTED
        assert send_with_outcome(conn, snd, update(1, 'a', 3)) == ACCEPTED
        assert [m['seq'] for m in bodies(conn, address, 3)] == [1, 2, 3]
    finally:
        conn.close()


def test_shoal_queues_shows_how_many_keys_a_last_value_queue_holds(
    start_broker: Any, address: str, store_url: str
) -> None:
    b = start_broker(env=lvq_env(address))
    conn = connect(b.url)
    snd = sender(conn, address)
    for seq in range(6):
        snd.send(update(seq % 3, 'p', seq))
    snd.send(update(None, 'p', 6))  # no key: kept, not counted
    conn.close()
    done = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', store_url, 'queues', '--json'],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    [row] = [r for r in json.loads(done.stdout) if r['name'] == address]
    assert (row['backlog'], row['last_values']) == (4, 3)
    table = subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--redis-url', store_url, 'queues'],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert table[0].split()[-1] == 'LAST-VALUES'
    [line] = [t for t in table if t.split()[0] == address]
    assert line.split()[-1] == '3'
