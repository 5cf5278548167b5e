"""
The periodic pass over everything the operator has seen: live status and drift correction.

One loop for all resources instead of a kopf timer per object, because kopf puts a finalizer on
every object that has a timer, and a Queue or SharedSubscription must carry a finalizer only when
its deletion acts on Redis. Each pass re-applies every BrokerCluster's children (drift check),
refreshes its status, and samples each queue's and subscription's numbers, writing a status only
when it changed enough (``status.worth_writing``).
"""

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from shoal_broker.errors import StoreUnavailable
from shoal_operator import clusters, deletion, entities, k8s, metrics, status
from shoal_operator.models import API_VERSION, BrokerCluster, InvalidSpec
from shoal_operator.runtime import Runtime

logger = logging.getLogger(__name__)


async def run(runtime: Runtime, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if runtime.kube is not None:
            try:
                await observe_all(runtime)
            except Exception:  # one bad pass must not end the loop
                if runtime.kube is None:  # logged out during the pass: the operator is stopping
                    logger.debug('observation pass cut short by the logout', exc_info=True)
                else:
                    logger.exception('observation pass failed')
        try:
            await asyncio.wait_for(stop.wait(), runtime.settings.observe_seconds)
        except TimeoutError:
            pass


async def observe_all(runtime: Runtime) -> None:
    started = time.monotonic()
    for body in runtime.of_kind('BrokerCluster'):
        await _cluster(runtime, body)
    for kind in ('Queue', 'SharedSubscription'):
        bodies = [
            body
            for body in runtime.of_kind(kind)
            if not (body.get('metadata') or {}).get('deletionTimestamp') and _settled(body)
        ]
        for sampled, live in await entities.sample_all(runtime, kind, bodies):
            if live is not None:
                await _entity(runtime, kind, sampled, live)
    await deletion.retry_pending(runtime)
    await deletion.settle_orphans(runtime)
    metrics.OBSERVATION_SECONDS.set(time.monotonic() - started)
    metrics.LAST_OBSERVATION.set(time.time())


async def _cluster(runtime: Runtime, body: Mapping[str, Any]) -> None:
    meta = body.get('metadata') or {}
    if meta.get('deletionTimestamp') or not _settled(body):
        return
    try:
        cluster = BrokerCluster.from_body(body, default_image=runtime.settings.broker_image)
        if not cluster.meta.paused:
            await clusters.apply_cluster(runtime, body)
        old = body.get('status') or {}
        new = await clusters.observe_cluster(runtime, body, cluster)
        await clusters.close_the_loop(runtime, body, cluster, new)
    except (InvalidSpec, k8s.ApiError, StoreUnavailable) as exc:
        logger.warning('cannot observe BrokerCluster %s/%s: %s', meta.get('namespace'),
                       meta.get('name'), exc)  # fmt: skip
        return
    patch = status.cluster_patch(old, new)
    if _changed(old, patch):
        await _patch_status(runtime, 'BrokerCluster', meta, patch)


async def _entity(runtime: Runtime, kind: str, body: Mapping[str, Any], live: dict[str, Any]
                  ) -> None:  # fmt: skip
    """Write the sampled status when it changed enough (``status.worth_writing``)."""
    meta = body.get('metadata') or {}
    at_limit = live.pop(entities.AT_LIMIT, None)
    old = body.get('status') or {}
    if at_limit is not None:
        # conditions are kopf's handlers' to write too: merge into a fresh read, not the inventory
        fresh = await runtime.api().get(API_VERSION, kind, str(meta.get('namespace')),
                                        str(meta.get('name')))  # fmt: skip
        limited = entities.limit_conditions(fresh, at_limit) if fresh else None
        if limited is not None:
            live['conditions'] = limited
    if 'conditions' in live or status.worth_writing(old, live):
        await _patch_status(runtime, kind, meta,
                            status.as_patch(old, live, optional=status.LIVE_OPTIONAL))  # fmt: skip


def _settled(body: Mapping[str, Any]) -> bool:
    """Whether kopf's handlers are done with the current generation (writing meanwhile would race
    their finalizer and status patches)."""
    meta = body.get('metadata') or {}
    observed = (body.get('status') or {}).get('observedGeneration')
    return observed is not None and observed == meta.get('generation', observed)


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    def steady(s: Mapping[str, Any]) -> dict[str, Any]:
        copy = dict(s)
        copy['redis'] = {k: v for k, v in (s.get('redis') or {}).items() if k != 'latencyMs'}
        return copy

    return steady(old) != {**steady(old), **steady(new)}


async def _patch_status(runtime: Runtime, kind: str, meta: Mapping[str, Any],
                        new: Mapping[str, Any]) -> None:  # fmt: skip
    try:
        await runtime.api().patch(
            API_VERSION,
            kind,
            str(meta.get('namespace')),
            str(meta.get('name')),
            {'status': new},
            subresource='status',
        )
    except k8s.ApiError as exc:
        logger.warning('status of %s %s/%s not written: %s', kind, meta.get('namespace'),
                       meta.get('name'), exc)  # fmt: skip
