"""
``shoal-operator`` (and ``python -m shoal_operator``): kopf standalone (no peering), liveness on
``:8080/healthz``, Prometheus metrics on ``:9090/metrics``, settings from ``SHOAL_OPERATOR_*``.
"""

import asyncio
import dataclasses
import logging
import os
from typing import Any

import kopf
import prometheus_client

from shoal_operator import handlers, observer
from shoal_operator.runtime import Runtime, Settings


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: the kubeconfig, read by the official client, so
    every form kubectl writes works (CA and client certificate as files, relative to the
    kubeconfig, or inline data; a bearer token or a token file; exec plugins)."""
    info = kopf.login_via_client(**kwargs)
    if info is not None and info.token and info.token != info.token.strip():
        # a token file ending in a newline (``echo $TOKEN > file``): kubectl trims it, the
        # Python client does not, and a newline in a header is refused before it is sent
        info = dataclasses.replace(info, token=info.token.strip())
    return info


async def run(
    settings: Settings,
    *,
    login: handlers.Login = login,
    stop: asyncio.Event | None = None,
    liveness: bool = True,
) -> None:
    """Run the operator until ``stop`` is set (or forever)."""
    runtime = Runtime(settings)
    registry = handlers.build_registry(runtime, login)
    stop = stop or asyncio.Event()
    stop_flag: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    watcher = asyncio.create_task(observer.run(runtime, stop))

    async def relay() -> None:
        await stop.wait()
        if not stop_flag.done():
            stop_flag.set_result(None)

    relay_task = asyncio.create_task(relay())
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            liveness_endpoint=f'http://{settings.health}/healthz' if liveness else None,
            stop_flag=stop_flag,
        )
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
        # kopf cancels its own task tree when the stop flag is set: a clean stop
    finally:
        stop.set()
        # on SIGTERM kopf cancels every task of the loop, these two included: a clean stop too
        for outcome in await asyncio.gather(watcher, relay_task, return_exceptions=True):
            if isinstance(outcome, Exception):
                raise outcome
        await runtime.close()


def main() -> None:
    level = os.environ.get('SHOAL_OPERATOR_LOG_LEVEL', 'INFO').upper()
    logging.basicConfig(level=level, format='%(asctime)s %(levelname)s %(name)s %(message)s')
    settings = Settings.from_env()
    host, _, port = settings.metrics.rpartition(':')
    prometheus_client.start_http_server(int(port), addr=host or '0.0.0.0')
    asyncio.run(run(settings))
