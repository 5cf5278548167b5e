"""
Big bodies a replica wrote or read lately (``store/bodies.RecentBodies``): a fetch of one asks
Redis only whether it is still there (``EXISTS``), not for its bytes (``MGET``); another replica
reads it as before; and a body gone from Redis is not delivered from memory. Watched on the
Redis node of the address's slot (``MONITOR``), in every store mode.
"""

import uuid
from typing import Any

from amqpclient import connect, nothing_more, receive_all, receiver, send_all
from fetchscript import CommandsOn
from processes import BrokerProcess

from shoal_broker.store import keys


def body(size: int) -> str:
    seed = uuid.uuid4().hex
    return (seed * (size // len(seed) + 1))[:size]


def body_reads(commands: list[str], address: str) -> tuple[int, int]:
    """The ``MGET``s and ``EXISTS`` of ``address``'s bodies among ``commands`` (no script reads
    a body)."""
    prefix = keys.AddressKeys.of(address).body('')
    mine = [c for c in commands if prefix in c]
    return sum(c.startswith('MGET ') for c in mine), sum(c.startswith('EXISTS ') for c in mine)


def test_a_body_written_here_is_not_read_back_from_redis_here(
    broker: BrokerProcess, second_broker: BrokerProcess, store_client: Any, address: str
) -> None:
    watch = CommandsOn(store_client, keys.AddressKeys.of(address).body('any'))
    try:
        payloads = [body(256 * 1024) for _ in range(2)]
        conn = connect(broker.url)
        send_all(conn, address, payloads)
        watch.since_last()
        rcv = receiver(conn, address, credit=5)
        assert [m.body for m in receive_all(rcv, 2)] == payloads
        assert body_reads(watch.since_last(), address) == (0, 2)
        conn.close()

        # another replica never had it: it reads the body itself, once
        later = body(256 * 1024)
        send_all(connect(broker.url), address, [later]).connection.close()
        watch.since_last()
        other = connect(second_broker.url)
        assert [m.body for m in receive_all(receiver(other, address, credit=5), 1)] == [later]
        assert body_reads(watch.since_last(), address) == (1, 0)
        other.close()
    finally:
        watch.close()


def test_a_body_gone_from_redis_is_not_delivered_from_memory(
    broker: BrokerProcess, store_client: Any, address: str
) -> None:
    """A body deleted with its entry between a fetch and the body's read (a move, a trim after
    a purge; here by hand) leaves its message out, as when the body is read from Redis."""
    gone, kept = body(64 * 1024), body(64 * 1024)
    conn = connect(broker.url)
    send_all(conn, address, [gone, kept])
    stored = list(store_client.scan_iter(match=keys.AddressKeys.of(address).body('*')))
    assert len(stored) == 2
    [key] = [k for k in stored if gone.encode() in store_client.get(k)]
    store_client.delete(key)
    rcv = receiver(conn, address, credit=5)
    assert [m.body for m in receive_all(rcv, 1)] == [kept]
    assert nothing_more(rcv)
    conn.close()
