"""
The web console's files, served at ``/console`` on the broker's HTTP port beside ``/api``.

The console is static HTML, CSS and JavaScript modules shipped inside the package (the
``console/`` folder next to this module): no build step, nothing fetched from the network. It
reads and writes through the management API with the user's own credentials, so it has no
authority of its own: these files are public, and every request they make is checked by
``routes.py`` as any other API call.
"""

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

ASSETS = Path(__file__).with_name('console')
"""The console's HTML, CSS and JavaScript modules (package data)."""

POLICY = {
    # only the console's own files and the API of the same origin; no inline script or style
    'Content-Security-Policy': (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    'X-Content-Type-Options': 'nosniff',
    'Referrer-Policy': 'no-referrer',
    'Cache-Control': 'no-cache',
}
"""Headers of every console file."""


@web.middleware
async def _headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    response.headers.update(POLICY)
    return response


async def _index(_: web.Request) -> web.FileResponse:
    return web.FileResponse(ASSETS / 'index.html')


def app() -> web.Application:
    """The console, to mount under ``/console`` (``health.HealthServer``)."""
    console = web.Application(middlewares=[_headers])
    console.router.add_get('/', _index)
    console.router.add_static('/', ASSETS, show_index=False, follow_symlinks=False)
    return console
