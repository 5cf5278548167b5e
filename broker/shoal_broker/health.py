"""
The broker's HTTP port: liveness, readiness and metrics for Kubernetes probes and Prometheus,
and the management API mounted under ``/api`` with its web console under ``/console``
(``management/``).

aiohttp on the broker's own event loop (no thread). ``/livez`` answers while the loop turns;
``/readyz`` answers 200 only while the broker accepts AMQP connections, Redis answers a PING
and the Redis memory watermark can sample (each check is named in the JSON body, a boolean).
Figures beside the checks (numbers: the sends held through a store outage and the age of the
oldest) inform and never decide.
"""

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 5.0
"""A client that has not sent its request head by then is dropped."""
Readiness = Callable[[], Awaitable[dict[str, bool | int | float]]]
"""Checks (booleans, all true when ready) and figures (numbers) for the JSON body."""


class HealthServer:
    def __init__(
        self,
        readiness: Readiness,
        api: web.Application | None = None,
        console: web.Application | None = None,
    ) -> None:
        self._readiness = readiness
        self._app = web.Application()
        self._app.router.add_get('/livez', self._livez)
        self._app.router.add_get('/readyz', self._readyz)
        self._app.router.add_get('/metrics', self._metrics)
        if api is not None:
            self._app.add_subapp('/api', api)
        if console is not None:
            self._app.router.add_get('/console', self._to_console)
            self._app.add_subapp('/console', console)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(
            self._app, access_log=None, handle_signals=False,
            keepalive_timeout=REQUEST_TIMEOUT_SECONDS,
        )  # fmt: skip
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await self._site.start()

    @property
    def port(self) -> int:
        assert self._runner is not None
        return int(self._runner.addresses[0][1])

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _livez(self, _: web.Request) -> web.Response:
        return web.Response(text='ok\n')

    async def _readyz(self, _: web.Request) -> web.Response:
        checks = await self._readiness()
        return web.Response(
            body=json.dumps(checks).encode() + b'\n', content_type='application/json',
            status=200 if all(v for v in checks.values() if isinstance(v, bool)) else 503,
        )  # fmt: skip

    async def _to_console(self, _: web.Request) -> web.Response:
        # relative: behind a proxy that mounts the port under a prefix, the prefix is kept
        raise web.HTTPFound('console/')

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={'Content-Type': CONTENT_TYPE_LATEST})
