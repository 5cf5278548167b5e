"""
Where AMQP clients connect: listen addresses, the plain acceptor's backlog, and the ``amqps``
acceptor whose certificate is reloaded when its files change (SIGHUP reloads at once).
"""

import asyncio
import logging
import signal

from shoal_broker.amqp.broker import Broker
from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.security.tls import ServerTls
from shoal_broker.settings import BrokerSettings

logger = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024


def split_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a pair."""
    host, sep, port = value.rpartition(':')
    if not sep or not port.isdigit():
        raise ValueError(f'expected HOST:PORT, got {value!r}')
    return host.strip('[]') or '0.0.0.0', int(port)


async def listen_tls(
    settings: BrokerSettings, broker: Broker
) -> tuple[list[asyncio.AbstractServer], list['asyncio.Task[None]']]:
    """The ``amqps`` acceptor, if configured, and the task that reloads its certificate when
    the files change (SIGHUP reloads at once)."""
    if not settings.security.tls_listen:
        return [], []
    tls = ServerTls(settings.security)
    loop = asyncio.get_running_loop()
    host, port = split_host_port(settings.security.tls_listen)
    server = await loop.create_server(
        lambda: AmqpConnection(broker), host, port, backlog=LISTEN_BACKLOG, reuse_address=True,
        ssl=tls.context,
    )  # fmt: skip
    loop.add_signal_handler(signal.SIGHUP, lambda: tls.reload(only_if_changed=False))
    logger.info('amqps listening on %s', settings.security.tls_listen)

    async def watch() -> None:
        while True:
            await asyncio.sleep(settings.security.tls_reload_interval_seconds)
            tls.reload(only_if_changed=True)

    return [server], [asyncio.create_task(watch())]
