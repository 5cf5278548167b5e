"""
Background pipelines packed and read by hiredis, on a connection of a client's pool.

The passes over every address (the trim pass, the backlog walk, the metric records, the commit
markers' sweep) run on the event loop that serves the clients. Through redis-py's pipeline each
call cost the loop its packing in Python, ~0.5 µs an argument (a metric record's ``XADD`` of 20
fields 22 µs, against 4.4 µs packed by hiredis), then its reply's parsing and callbacks: most of
the passes' CPU, and the length of the stretches in which the loop served nobody else
(docs/performance.md#packed-background-pipelines). Here a pipeline is packed as the lane packs
(``lane.pack``) and its replies are read by the connection's own hiredis reader, which gives error
replies as redis-py's exception classes (``MOVED``, ``NOSCRIPT`` and the rest), as a pipeline
with ``raise_on_error=False`` did.
"""

from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from shoal_broker.store.lane import NOT_ENOUGH_DATA, fresh_connection, pack, read_into_parser


async def pipeline(
    client: 'redis.asyncio.Redis', commands: Sequence[tuple[Any, ...]], *, raise_on_error: bool
) -> list[Any]:
    """The replies of ``commands``, sent as one pipeline on a connection of ``client``'s pool
    (a standalone server, a Sentinel group's primary or one cluster node), in order. An error
    reply is its exception object in its place, or with ``raise_on_error`` the first one is
    raised once every reply is read. A connection that fails is dropped, since replies owed on
    it could not be matched later, and the error raised without a retry: a background pass
    tries again at its next turn."""
    pool = client.connection_pool
    conn = await fresh_connection(pool)
    try:
        if not conn.is_connected:
            await conn.connect()
        await conn.send_packed_command(pack(commands), check_health=False)
        reader = conn._parser._reader
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = reader.gets()
            if reply is NOT_ENOUGH_DATA:
                await read_into_parser(conn, conn.socket_timeout)
            elif isinstance(reply, redis.exceptions.ConnectionError):
                raise reply
            else:
                replies.append(reply)
    except BaseException:  # a reply still owed (a cancel included): the connection is spent
        await conn.disconnect(nowait=True)
        raise
    finally:
        await pool.release(conn)
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    return replies
