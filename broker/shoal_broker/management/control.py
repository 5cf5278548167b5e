"""
The replica's side of the management API: it lists its client connections in Redis, carries out
the commands any replica's API left for it (close a connection, read the pause flags again), and
reads the pause flags with the policies.

Commands travel through a LIST per replica rather than pub/sub: a replica that is busy, or
briefly cut off from Redis, still finds them when it next looks (every second).
"""

import asyncio
import json
import logging
import time
from typing import Any

from shoal_broker.amqp.broker import Broker
from shoal_broker.errors import StoreUnavailable
from shoal_broker.metrics.registry import BACKGROUND_FAILURES
from shoal_broker.store.management import StoreAdmin

logger = logging.getLogger(__name__)

CONTROL_INTERVAL_SECONDS = 1.0
"""How often a replica looks for commands and lists its connections."""

CONNECTIONS_TTL_SECONDS = 10
"""A replica's connection list expires this long after its last refresh (it died)."""

MAX_LISTED_CONNECTIONS = 10_000
"""Connections one replica lists at most (the list is one Redis value)."""

FORCED = 'amqp:connection:forced'


def connection_rows(broker: Broker) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for conn in list(broker.connections)[:MAX_LISTED_CONNECTIONS]:
        identity = conn.identity
        rows.append({
            'id': str(conn.id), 'peer': conn.peer, 'container_id': conn.container_id,
            'user': identity.name if identity is not None else None, 'links': len(conn.links),
        })  # fmt: skip
    rows.sort(key=lambda r: int(str(r['id'])))
    return rows


class Control:
    """Runs on every replica next to its AMQP node."""

    def __init__(self, admin: StoreAdmin, broker: Broker, replica_id: str) -> None:
        self.admin = admin
        self.broker = broker
        self.replica_id = replica_id
        self._listed = ''
        self._listed_at = -float(CONNECTIONS_TTL_SECONDS)

    async def refresh_pauses(self) -> None:
        paused = await self.admin.paused()
        self.broker.nodes.apply_pauses(frozenset(paused))

    async def once(self) -> None:
        # written when it changed, else before it expires: a large list is no write every second
        listed = json.dumps(connection_rows(self.broker))
        if (
            listed != self._listed
            or time.monotonic() - self._listed_at > CONNECTIONS_TTL_SECONDS / 2
        ):
            await self.admin.publish_connections(self.replica_id, listed, CONNECTIONS_TTL_SECONDS)
            self._listed, self._listed_at = listed, time.monotonic()
        # carried out, then removed: the API that sent them waits for an empty list (a pause
        # answered is in effect here), and a refresh cut off by Redis is done again next time
        commands = await self.admin.waiting_commands(self.replica_id)
        refresh = False
        for command in commands:
            verb, _, argument = command.partition(' ')
            if verb == 'close':
                self.close(argument)
            elif verb == 'refresh':
                refresh = True  # one read of the flags answers every refresh waiting
            else:
                logger.warning('unknown management command %r', command)
        if refresh:
            await self.refresh_pauses()
        if commands:
            await self.admin.commands_done(self.replica_id, len(commands))

    def close(self, connection_id: str) -> None:
        for conn in list(self.broker.connections):
            if str(conn.id) == connection_id:
                logger.info('closing connection %s (%s) for an operator', conn.id, conn.peer)
                self.broker.connecting.close_one(conn, FORCED, 'closed by an operator')
                return
        logger.info('connection %s to close is gone already', connection_id)

    async def run_forever(self) -> None:
        """Look for commands every second; read the pause flags every few seconds too (a
        command lost with a Redis failover is then made up for)."""
        pauses_read = 0.0
        while True:
            try:
                await self.once()
                if time.monotonic() - pauses_read >= 5 * CONTROL_INTERVAL_SECONDS:
                    await self.refresh_pauses()
                    pauses_read = time.monotonic()
            except StoreUnavailable as exc:
                BACKGROUND_FAILURES.labels('management').inc()
                logger.error('management commands not read: %s', exc)
            await asyncio.sleep(CONTROL_INTERVAL_SECONDS)
