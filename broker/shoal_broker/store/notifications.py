"""
Reading the notification channel straight off its connection.

Every publish cycle announces its address on a Redis channel, and the replica that published is
subscribed to that channel too (its own consumers of the address): at a trickle each message
came back as a notification of its own, and redis-py's ``PubSub.get_message`` (a timeout, a
retry wrapper and a dict per message) cost 60-90 µs of broker CPU per message at 1 000 msg/s
(docs/performance.md#notifications). Here the subscribed connection's replies are fed to its own
hiredis reader and only ``message`` replies are kept.

redis-py still writes the SUBSCRIBE/UNSUBSCRIBE commands and reconnects (re-subscribing every
channel) when one of them finds the connection broken; once subscribed it never reads from the
connection itself, so this is the only reader. A channel silent for ``idle_seconds`` gets a
PING; no reply to it by the next interval means the connection is dead.
"""

from typing import Any

import redis.exceptions

from shoal_broker.store.lane import NOT_ENOUGH_DATA, read_into_parser


class NotificationReader:
    def __init__(self, pubsub: Any, idle_seconds: float) -> None:
        self._pubsub = pubsub
        self._idle_seconds = idle_seconds
        self._pinged = False

    async def messages(self) -> list[tuple[bytes, bytes]]:
        """(channel, data) of the messages that arrived next; [] after a quiet interval."""
        conn = self._pubsub.connection
        if conn is None or not conn.is_connected:
            raise redis.exceptions.ConnectionError('the notification channel is not connected')
        try:
            await read_into_parser(conn, self._idle_seconds)
        except TimeoutError:
            if self._pinged:
                raise redis.exceptions.TimeoutError(
                    'the notification channel went silent'
                ) from None
            self._pinged = True
            await self._pubsub.ping()
            return []
        self._pinged = False
        parser = conn._parser._reader
        found: list[tuple[bytes, bytes]] = []
        while (reply := parser.gets()) is not NOT_ENOUGH_DATA:
            if isinstance(reply, redis.exceptions.ConnectionError):
                raise reply
            # [b'message', channel, data]; subscribe confirmations and pongs are skipped
            if isinstance(reply, list) and len(reply) == 3 and reply[0] == b'message':
                found.append((reply[1], reply[2]))
        return found
