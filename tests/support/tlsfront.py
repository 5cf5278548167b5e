"""
A TLS front for a plain-HTTP test server: terminates TLS with a certificate of the test's own CA
(optionally requiring a client certificate it signed) and relays the bytes, so a client is tested
against a real HTTPS endpoint while the server behind it stays the emulator.
"""

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def tls_front(
    target_host: str, target_port: int, cert: Path, key: Path, client_ca: Path | None = None
) -> AsyncIterator[str]:
    """``https://127.0.0.1:PORT`` relaying to the target while the context is open."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    relays: set[asyncio.Task[None]] = set()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(target_host, target_port)
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    def accept(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(relay(client_r, client_w))
        relays.add(task)
        task.add_done_callback(relays.discard)

    server = await asyncio.start_server(accept, '127.0.0.1', 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f'https://127.0.0.1:{port}'
    finally:
        server.close()
        for task in list(relays):
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
        await server.wait_closed()
