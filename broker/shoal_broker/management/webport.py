"""
The aiohttp side of the broker's HTTP port: the management API under ``/api``, the console
under ``/console``, and the probes again (``health.py``'s answers) for a connection that asked
for something else first.

``health.py`` answers the probes itself and hands every other connection here; ``app.py``
imports this module only then, so that a broker that meets only probes and Prometheus never
imports aiohttp (docs/performance.md, "Idle memory").
"""

import asyncio

from aiohttp import web

from shoal_broker import health
from shoal_broker.management import console
from shoal_broker.management.access import Access
from shoal_broker.management.operations import Operations
from shoal_broker.management.routes import Routes


def _respond(answer: health.Answer) -> web.Response:
    status, content_type, body = answer
    return web.Response(status=status, body=body, headers={'Content-Type': content_type})


class AiohttpPort:
    """An ``AppRunner`` without a site of its own: each connection handed over gets a protocol
    from its server, and ``close`` shuts those connections down."""

    def __init__(self, runner: web.AppRunner) -> None:
        self._runner = runner

    @classmethod
    async def start(
        cls, readiness: health.Readiness, operations: Operations, access: Access
    ) -> 'AiohttpPort':
        async def livez(_: web.Request) -> web.Response:
            return _respond(health.livez())

        async def readyz(_: web.Request) -> web.Response:
            return _respond(await health.readyz(readiness))

        async def metrics(_: web.Request) -> web.Response:
            return _respond(health.metrics())

        async def to_console(_: web.Request) -> web.Response:
            # relative: behind a proxy that mounts the port under a prefix, the prefix is kept
            raise web.HTTPFound('console/')

        app = web.Application()
        app.router.add_get('/livez', livez)
        app.router.add_get('/readyz', readyz)
        app.router.add_get('/metrics', metrics)
        app.add_subapp('/api', Routes(operations, access).app())
        app.router.add_get('/console', to_console)
        app.add_subapp('/console', console.app())
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False,
            keepalive_timeout=health.REQUEST_TIMEOUT_SECONDS,
        )  # fmt: skip
        await runner.setup()
        return cls(runner)

    def protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None  # set up in start
        return server()

    async def close(self) -> None:
        await self._runner.cleanup()
