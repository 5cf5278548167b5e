"""
Duplicate detection (docs/redis-modes.md#duplicate-detection): a message whose id its address
stored within the window is answered accepted and dropped, on every store mode, also when the
second copy comes through another replica or inside a transaction; past the window's count or
time the id is accepted again.
"""

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from amqpclient import connect, nothing_more, receive_all, receiver, send_with_outcome, sender
from exposition import samples, value
from processes import BrokerProcess, RedisServer, wait_for
from proton import Delivery, Message
from txnclient import Controller, send_in

from shoal_broker.store import keys

Start = Callable[..., BrokerProcess]
ACCEPTED = (Delivery.ACCEPTED, None)
ON = {'SHOAL_DUPLICATE_DETECTION': 'true'}
DUPLICATES = 'shoal_messages_duplicate_total'


def message(body: Any, message_id: Any = None, **properties: Any) -> Message:
    return Message(body=body, id=message_id, properties=properties or None)


def test_the_same_message_id_is_stored_once(start_broker: Start, address: str) -> None:
    b = start_broker(env=ON)
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        first = f'ID:{uuid.uuid4()}:1:1:1-1'  # Qpid JMS's default message-id
        sent = [
            send_with_outcome(conn, snd, message('one', first)),
            send_with_outcome(conn, snd, message('again', first)),
            send_with_outcome(conn, snd, message('two', f'ID:{uuid.uuid4()}:1:1:1-2')),
            send_with_outcome(conn, snd, message('no id')),
            send_with_outcome(conn, snd, message('no id either')),
        ]
        assert sent == [ACCEPTED] * 5  # the producer must not send a duplicate again
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 4)] == ['one', 'two', 'no id', 'no id either']
        assert nothing_more(rcv)
        wait_for(lambda: value(samples(b), DUPLICATES, address=address) == 1, 10, 'the count')
    finally:
        conn.close()


def test_typed_ids_stay_apart(start_broker: Start, address: str) -> None:
    """A uuid and the string of the same uuid are two ids, as Qpid JMS keeps them apart."""
    b = start_broker(env=ON)
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        same = uuid.uuid4()
        for body, message_id in (('uuid', same), ('string', str(same)), ('uuid again', same)):
            assert send_with_outcome(conn, snd, message(body, message_id)) == ACCEPTED
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 2)] == ['uuid', 'string']
        assert nothing_more(rcv)
    finally:
        conn.close()


def test_two_producers_on_two_replicas(start_broker: Start, address: str) -> None:
    first, second = start_broker(env=ON), start_broker(env=ON)
    one, two = connect(first.url), connect(second.url)
    try:
        ids = [f'ID:{uuid.uuid4()}:1:1:1-{i}' for i in range(20)]
        left, right = sender(one, address), sender(two, address)
        for i, message_id in enumerate(ids):  # each id through both replicas, in turn
            assert send_with_outcome(one, left, message(f'a{i}', message_id)) == ACCEPTED
            assert send_with_outcome(two, right, message(f'b{i}', message_id)) == ACCEPTED
        rcv = receiver(one, address, credit=50)
        assert [m.body for m in receive_all(rcv, 20)] == [f'a{i}' for i in range(20)]
        assert nothing_more(rcv)
        assert value(samples(second), DUPLICATES, address=address) == 20
    finally:
        one.close()
        two.close()


def test_the_window_keeps_its_count(start_broker: Start, address: str, store_client: Any) -> None:
    b = start_broker(env={**ON, 'SHOAL_DUPLICATE_WINDOW': '3'})
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        for name in 'abcd':
            assert send_with_outcome(conn, snd, message(name, name)) == ACCEPTED
        assert store_client.zcard(keys.AddressKeys.of(address).duplicates) == 3
        assert send_with_outcome(conn, snd, message('d again', 'd')) == ACCEPTED  # within
        assert send_with_outcome(conn, snd, message('a again', 'a')) == ACCEPTED  # forgotten
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 5)] == ['a', 'b', 'c', 'd', 'a again']
        assert nothing_more(rcv)
    finally:
        conn.close()


def test_the_window_keeps_its_time(start_broker: Start, address: str, store_client: Any) -> None:
    b = start_broker(env={**ON, 'SHOAL_DUPLICATE_WINDOW_SECONDS': '1'})
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        assert send_with_outcome(conn, snd, message('first', 'x')) == ACCEPTED
        assert send_with_outcome(conn, snd, message('within', 'x')) == ACCEPTED
        window = keys.AddressKeys.of(address).duplicates
        wait_for(lambda: not store_client.exists(window), 10, 'the window to pass')
        assert send_with_outcome(conn, snd, message('after', 'x')) == ACCEPTED
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 2)] == ['first', 'after']
        assert nothing_more(rcv)
    finally:
        conn.close()


def test_an_application_property_as_the_id(start_broker: Start, address: str) -> None:
    b = start_broker(env={**ON, 'SHOAL_DUPLICATE_ID_PROPERTY': '_AMQ_DUPL_ID'})
    conn = connect(b.url)
    try:
        snd = sender(conn, address)
        sent = [
            message('one', 'id-1', _AMQ_DUPL_ID='order-7'),
            message('same property', 'id-2', _AMQ_DUPL_ID='order-7'),
            message('same message-id', 'id-1', _AMQ_DUPL_ID='order-8'),
            message('no property', 'id-1'),
        ]
        assert [send_with_outcome(conn, snd, m) for m in sent] == [ACCEPTED] * 4
        rcv = receiver(conn, address)
        bodies = [m.body for m in receive_all(rcv, 3)]
        assert bodies == ['one', 'same message-id', 'no property']
        assert nothing_more(rcv)
    finally:
        conn.close()


@pytest.mark.parametrize('addresses', [1, 2], ids=['one-address', 'two-addresses'])
def test_a_transactional_send_of_a_duplicate(
    start_broker: Start, address: str, addresses: int
) -> None:
    """Checked when the commit applies it: in one MULTI, or (two addresses, on a cluster on two
    slots) in each address's part of the commit record."""
    b = start_broker(env=ON)
    conn = connect(b.url)
    names = [address, f'{address}-other'][:addresses]
    try:
        senders = {name: sender(conn, name) for name in names}
        for name, snd in senders.items():
            assert send_with_outcome(conn, snd, message('plain', f'{name}-1')) == ACCEPTED
        controller = Controller(conn)
        txn = controller.declare()
        for name, snd in senders.items():
            send_in(conn, snd, txn, message('duplicate', f'{name}-1'))
            send_in(conn, snd, txn, message('new', f'{name}-2'))
            send_in(conn, snd, txn, message('new twice', f'{name}-2'))
        assert controller.discharge(txn, fail=False).remote_state == Delivery.ACCEPTED
        for name in names:
            rcv = receiver(conn, name)
            assert [m.body for m in receive_all(rcv, 2)] == ['plain', 'new']
            assert nothing_more(rcv)
        wait_for(lambda: value(samples(b), DUPLICATES, address=address) == 2, 10, 'the duplicates')
    finally:
        conn.close()


def test_off_stores_every_copy(broker: BrokerProcess, address: str, store_client: Any) -> None:
    conn = connect(broker.url)
    try:
        snd = sender(conn, address)
        for body in ('one', 'two'):
            assert send_with_outcome(conn, snd, message(body, 'same')) == ACCEPTED
        assert [m.body for m in receive_all(receiver(conn, address), 2)] == ['one', 'two']
        assert not store_client.exists(keys.AddressKeys.of(address).duplicates)
    finally:
        conn.close()


def test_a_resend_of_what_no_replica_confirmed_is_not_a_second_copy(address: str) -> None:
    """With the hold off (``SHOAL_STORE_HOLD_SECONDS=0``), in ``replicated`` durability a message
    whose WAIT timed out is released but stays in Redis; the producer's resend of it (the same
    message-id) must not store it twice."""
    primary = RedisServer()
    replica: RedisServer | None = None
    b = BrokerProcess(primary.url, env={
        **ON, 'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '200',
        'SHOAL_STORE_HOLD_SECONDS': '0',
    })  # fmt: skip
    try:
        conn = connect(b.url)
        snd = sender(conn, address)
        unconfirmed = message('written, unconfirmed', 'ID:resent-1')
        assert send_with_outcome(conn, snd, unconfirmed) == (Delivery.RELEASED, None)
        replica = RedisServer(None, '--replicaof', '127.0.0.1', str(primary.port))
        wait_for(replica.linked, 20, 'the replica')
        resent = message('resent', 'ID:resent-1')
        wait_for(lambda: send_with_outcome(conn, snd, resent) == ACCEPTED, 20, 'an accept')
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 1)] == ['written, unconfirmed']
        assert nothing_more(rcv)
        conn.close()
    finally:
        b.stop()
        if replica is not None:
            replica.stop()
        primary.stop()


def test_the_brokers_own_rewrite_of_a_held_unconfirmed_message_is_not_a_second_copy(
    address: str,
) -> None:
    """With the hold (the default), a message whose WAIT timed out is held and written again
    once a replica is back: the rewrite carries the same id, so the copy the first write left
    in Redis is the only one, and the send is answered accepted."""
    primary = RedisServer()
    started: list[RedisServer] = []
    b = BrokerProcess(
        primary.url,
        env={**ON, 'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '200'},
    )
    # the replica arrives while the send waits, held (proton's blocking send waits meanwhile)
    late = threading.Timer(2.0, lambda: started.append(
        RedisServer(None, '--replicaof', '127.0.0.1', str(primary.port))))  # fmt: skip
    try:
        conn = connect(b.url)
        snd = sender(conn, address)
        late.start()
        assert send_with_outcome(conn, snd, message('held', 'ID:held-1')) == ACCEPTED
        late.join()
        rcv = receiver(conn, address)
        assert [m.body for m in receive_all(rcv, 1)] == ['held']
        assert nothing_more(rcv)
        conn.close()
    finally:
        late.cancel()
        late.join()
        b.stop()
        for replica in started:
            replica.stop()
        primary.stop()
