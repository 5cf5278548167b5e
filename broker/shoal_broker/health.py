"""
The HTTP side door: liveness, readiness and metrics for Kubernetes probes and Prometheus.

A deliberately tiny HTTP/1.1 responder on the broker's own event loop (no thread, no framework):
three GET routes, one response per connection. ``/livez`` answers while the loop turns;
``/readyz`` answers 200 only while the broker accepts AMQP connections, Redis answers a PING
and the Redis memory watermark can sample (each check is named in the JSON body, a boolean).
Figures beside the checks (numbers: the sends held through a store outage and the age of the
oldest) inform and never decide.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 5.0
Readiness = Callable[[], Awaitable[dict[str, bool | int | float]]]
"""Checks (booleans, all true when ready) and figures (numbers) for the JSON body."""


class HealthServer:
    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), REQUEST_TIMEOUT_SECONDS)
            method, path, *_ = request.split(b'\r\n', 1)[0].decode('latin-1').split(' ')
            status, content_type, body = await self._route(method, path)
            head = (
                f'HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n'
                f'Content-Length: {len(body)}\r\nConnection: close\r\n\r\n'
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except OSError as exc:
            logger.debug('health request failed: %s', exc)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method != 'GET':
            return '405 Method Not Allowed', 'text/plain', b'GET only\n'
        path = path.split('?', 1)[0]
        if path == '/livez':
            return '200 OK', 'text/plain', b'ok\n'
        if path == '/readyz':
            checks = await self._readiness()
            body = json.dumps(checks).encode() + b'\n'
            ready = all(value for value in checks.values() if isinstance(value, bool))
            status = '200 OK' if ready else '503 Service Unavailable'
            return status, 'application/json', body
        if path == '/metrics':
            return '200 OK', CONTENT_TYPE_LATEST, generate_latest()
        return '404 Not Found', 'text/plain', b'not found\n'
