"""
The broker's HTTP port: liveness, readiness and metrics for Kubernetes probes and Prometheus,
and the management API mounted under ``/api`` with its web console under ``/console``
(``management/``).

The probes and the metrics are answered here, by a small HTTP/1.1 front on the broker's own
event loop (no thread). Every other request (the API, the console, an unknown path, a method
or a header the front does not take) is handed over with its connection, bytes already read
included, to the aiohttp application of ``management/webport.py``, made on the first such
request. aiohttp and what it imports (yarl, multidict, attrs, the email and mimetypes modules)
are ~12 MiB of RSS, a fifth of an idle broker, which a broker that meets only probes and
Prometheus never needs (docs/performance.md, "Idle memory"). A connection handed over stays
with aiohttp, which answers the probes the same way (``readyz``, ``metrics``).

``/livez`` answers while the loop turns; ``/readyz`` answers 200 only while the broker accepts
AMQP connections, Redis answers a PING and the Redis memory watermark can sample (each check is
named in the JSON body, a boolean). Figures beside the checks (numbers: the sends held through
a store outage and the age of the oldest) inform and never decide.
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, cast

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 5.0
"""A client that has not sent its request head by then (or its next one, kept alive) is dropped."""
MAX_HEAD_BYTES: Final = 8 * 1024
"""A longer request head is not a probe: it goes to aiohttp, which answers it (or refuses it)."""
MAX_REQUESTS_PER_CONNECTION: Final = 1000
"""The front closes a kept-alive connection after this many answers (the client reconnects)."""
BUFFER_BYTES: Final = 64 * 1024
"""Reading pauses while this much waits (pipelined requests, a body on its way to aiohttp)."""
TEXT: Final = 'text/plain; charset=utf-8'
JSON: Final = 'application/json'
PROBES: Final = frozenset({'/livez', '/readyz', '/metrics'})

Readiness = Callable[[], Awaitable[dict[str, bool | int | float]]]
"""Checks (booleans, all true when ready) and figures (numbers) for the JSON body."""
Answer = tuple[int, str, bytes]
"""A status, a content type and a body."""


class WebPort(Protocol):
    """The aiohttp side (``management/webport.py``): a protocol per connection handed over."""

    def protocol(self) -> asyncio.BaseProtocol: ...

    async def close(self) -> None: ...


def livez() -> Answer:
    return 200, TEXT, b'ok\n'


async def readyz(readiness: Readiness) -> Answer:
    checks = await readiness()
    ready = all(v for v in checks.values() if isinstance(v, bool))
    return 200 if ready else 503, JSON, json.dumps(checks).encode() + b'\n'


def metrics() -> Answer:
    return 200, CONTENT_TYPE_LATEST, generate_latest()


class HealthServer:
    """The port's listener. ``web_port`` makes the aiohttp side; None: probes only (the rest
    is answered 404)."""

    def __init__(
        self, readiness: Readiness, web_port: Callable[[], Awaitable[WebPort]] | None = None
    ) -> None:
        self.readiness = readiness
        self._make_web_port = web_port
        self._web_port: asyncio.Future[WebPort] | None = None
        self._server: asyncio.Server | None = None
        self.fronts: set[_Front] = set()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Front(self), host, port, reuse_address=True
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def web_port(self) -> WebPort | None:
        """The aiohttp side, made by the first caller and shared (None: there is none)."""
        if self._make_web_port is None:
            return None
        if self._web_port is None:
            self._web_port = asyncio.ensure_future(self._make_web_port())
        return await asyncio.shield(self._web_port)

    async def answer(self, path: str) -> Answer:
        if path == '/livez':
            return livez()
        if path == '/readyz':
            return await readyz(self.readiness)
        return metrics()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for front in list(self.fronts):
            front.close()
        if self._web_port is not None:
            if self._web_port.done() and self._web_port.exception() is None:
                await self._web_port.result().close()
            elif not self._web_port.done():
                self._web_port.cancel()


class Probe:
    """A request the front answers itself: GET or HEAD of a probe path, no body, no upgrade."""

    __slots__ = ('head_only', 'keep_alive', 'path')

    def __init__(self, path: str, head_only: bool, keep_alive: bool) -> None:
        self.path = path
        self.head_only = head_only
        self.keep_alive = keep_alive

    @classmethod
    def parse(cls, head: bytes) -> 'Probe | None':
        """The probe ``head`` (request line and header fields, no blank line) asks for, or
        None when it is anything else, which aiohttp then answers."""
        lines = head.decode('latin-1').split('\r\n')
        parts = lines[0].split(' ')
        if len(parts) != 3:
            return None
        method, path, version = parts
        if method not in ('GET', 'HEAD') or path not in PROBES or version != 'HTTP/1.1':
            return None
        keep_alive = True
        for line in lines[1:]:
            name, colon, value = line.partition(':')
            name = name.lower()
            if not colon or name != name.strip() or name in _HANDED_OVER:
                return None  # malformed, folded, or a field the front does not take
            if name == 'content-length' and value.strip() != '0':
                return None
            if name == 'connection' and 'close' in value.lower():
                keep_alive = False
        return cls(path, method == 'HEAD', keep_alive)


_HANDED_OVER: Final = frozenset({'transfer-encoding', 'upgrade', 'expect'})
_REASONS: Final = {200: 'OK', 404: 'Not Found', 500: 'Internal Server Error',
                   503: 'Service Unavailable'}  # fmt: skip


def response(answer: Answer, *, head_only: bool, keep_alive: bool) -> bytes:
    status, content_type, body = answer
    lines = [
        f'HTTP/1.1 {status} {_REASONS[status]}',
        f'Content-Type: {content_type}',
        f'Content-Length: {len(body)}',
    ]
    if not keep_alive:
        lines.append('Connection: close')
    return ('\r\n'.join(lines) + '\r\n\r\n').encode('latin-1') + (b'' if head_only else body)


class _Front(asyncio.Protocol):
    """One connection: request heads read and answered in turn until one is not a probe, then
    the connection is aiohttp's."""

    def __init__(self, server: HealthServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._busy = False  # answering, or handing over: bytes wait in the buffer
        self._paused = False
        self._answered = 0
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._server.fronts.add(self)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._server.fronts.discard(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > BUFFER_BYTES and self._transport is not None and not self._paused:
            self._transport.pause_reading()
            self._paused = True
        if not self._busy:
            self._next()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _next(self) -> None:
        end = self._buffer.find(b'\r\n\r\n')
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                self._start(self._hand_over())
            return
        probe = Probe.parse(bytes(self._buffer[:end]))
        if probe is None:
            self._start(self._hand_over())
            return
        del self._buffer[: end + 4]
        self._start(self._answer(probe))

    def _start(self, work: Awaitable[None]) -> None:
        self._busy = True
        self._disarm()
        self._task = asyncio.ensure_future(work)

    async def _answer(self, probe: Probe) -> None:
        try:
            answer = await self._server.answer(probe.path)
        except Exception:
            logger.exception('HTTP %s failed', probe.path)
            answer, probe.keep_alive = (500, TEXT, b'internal error\n'), False
        self._answered += 1
        keep_alive = probe.keep_alive and self._answered < MAX_REQUESTS_PER_CONNECTION
        if self._transport is None:
            return
        self._transport.write(response(answer, head_only=probe.head_only, keep_alive=keep_alive))
        if not keep_alive:
            self._transport.close()
            return
        self._busy = False
        self._resume()
        self._arm()
        if self._buffer:
            self._next()

    async def _hand_over(self) -> None:
        try:
            web_port = await self._server.web_port()
        except Exception:
            logger.exception('the HTTP port could not make its web application')
            web_port = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if web_port is None:
            missing = (404, TEXT, b'not found\n')
            transport.write(response(missing, head_only=False, keep_alive=False))
            transport.close()
            return
        protocol = web_port.protocol()
        self._server.fronts.discard(self)
        self._transport = None
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._buffer:
            cast(asyncio.Protocol, protocol).data_received(bytes(self._buffer))
            self._buffer.clear()
        if self._paused:
            transport.resume_reading()

    def _resume(self) -> None:
        if self._paused and self._transport is not None and len(self._buffer) <= BUFFER_BYTES:
            self._transport.resume_reading()
            self._paused = False

    def _arm(self) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT_SECONDS, self.close)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
