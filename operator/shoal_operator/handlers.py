"""
Kopf wiring only: decorators, kwargs, and translating outcomes into kopf's terms (status patches,
retries, events). The work is in ``clusters``, ``entities`` and ``deletion``, the decisions in the
pure modules they call.

Handlers are registered into a registry built per operator run (``build_registry``), so the
process entry point and the tests each run their own operator with their own login.
"""

import logging
from collections.abc import Callable
from typing import Any

import kopf

from shoal_broker.store.declarations import Provisioned
from shoal_operator import clusters, deletion, entities, k8s, metrics, status
from shoal_operator.models import GROUP, VERSION, BrokerCluster, InvalidSpec
from shoal_operator.runtime import Runtime

Login = Callable[..., kopf.ConnectionInfo | None]
KOPF_PREFIX = f'kopf.{GROUP}'
ENTITIES = {'queues': 'Queue', 'sharedsubscriptions': 'SharedSubscription'}
WAITING = 'waiting: '
"""Prefix of the TemporaryError message of an expected wait (consumers attached, the cluster
not there yet, Redis down), as opposed to a failure."""


class ExpectedWaits(logging.Filter):
    """kopf logs every TemporaryError as "Handler ... failed temporarily" at ERROR (and so posts
    it as an Event of type Error on every retry); an expected wait is INFO: the resource's
    condition and one Warning Event already say why."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if f'failed temporarily: {WAITING}' in message:
            record.msg = message.replace(f'failed temporarily: {WAITING}', 'waits: ')
            record.args = ()
            record.levelno, record.levelname = logging.INFO, 'INFO'
        return True


EXPECTED_WAITS = ExpectedWaits()


def build_registry(runtime: Runtime, login: Login) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    logging.getLogger('kopf.objects').addFilter(EXPECTED_WAITS)  # once: the same filter

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f'{GROUP}/finalizer'
        # kopf leaves its own annotations out of the diff it reacts to: they must not share the
        # prefix of the user-facing ones (shoal.dev/paused, shoal.dev/force-delete)
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=KOPF_PREFIX)
        settings.posting.level = logging.WARNING
        # The watched namespaces are plain names (or the whole cluster) and the CRDs are installed
        # before the operator: nothing to discover at runtime. Without this, kopf lists and
        # watches namespaces and CRDs at cluster scope, which namespaced RBAC forbids (403s,
        # retried with backoff before the first reconcile).
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.inactivity_timeout = 600
        settings.networking.request_timeout = 30

    @kopf.on.login(registry=registry)
    async def log_in(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = login(**kwargs)
        if info is not None:
            if runtime.kube is not None:
                await runtime.kube.close()
            runtime.kube = k8s.Kube(info)
        return info

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        await runtime.close()

    for plural, kind in {'brokerclusters': 'BrokerCluster', **ENTITIES}.items():
        _inventory(registry, runtime, plural, kind)
    _clusters(registry, runtime)
    for plural, kind in ENTITIES.items():
        _entities(registry, runtime, plural, kind)
    return registry


def _inventory(registry: kopf.OperatorRegistry, runtime: Runtime, plural: str, kind: str) -> None:
    @kopf.on.event(GROUP, VERSION, plural, id=f'remember-{plural}', registry=registry)
    async def remember(type: str | None, body: kopf.Body, **_: Any) -> None:
        runtime.remember(kind, body, deleted=type == 'DELETED')
        metrics.MANAGED.labels(kind).set(len(runtime.of_kind(kind)))
        if type == 'DELETED' and kind in ENTITIES.values():
            # gone without (or past) a finalizer: carry out its deletion policy, or release
            # what stays in Redis
            await deletion.on_deleted(runtime, kind, body)


def _clusters(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    @kopf.on.resume(GROUP, VERSION, 'brokerclusters', id='reconcile', registry=registry)
    @kopf.on.create(GROUP, VERSION, 'brokerclusters', id='reconcile', registry=registry)
    @kopf.on.update(GROUP, VERSION, 'brokerclusters', id='reconcile', registry=registry)
    async def reconcile_cluster(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        try:
            cluster = BrokerCluster.from_body(body, default_image=runtime.settings.broker_image)
            if cluster.meta.paused:
                _event(body, 'Normal', 'ReconcilePaused', 'children left as they are')
            else:
                cluster = await clusters.apply_cluster(runtime, body)
            new = await clusters.observe_cluster(runtime, body, cluster)
        except InvalidSpec as exc:
            metrics.RECONCILES.labels('BrokerCluster', 'invalid').inc()
            _event(body, 'Warning', 'InvalidSpec', str(exc))
            raise kopf.PermanentError(str(exc)) from exc
        except k8s.ApiError as exc:
            metrics.RECONCILES.labels('BrokerCluster', 'error').inc()
            raise kopf.TemporaryError(str(exc), delay=runtime.settings.retry_seconds) from exc
        patch.status.update(status.cluster_patch(body.get('status') or {}, new))
        metrics.RECONCILES.labels('BrokerCluster', 'ok').inc()


def _entities(registry: kopf.OperatorRegistry, runtime: Runtime, plural: str, kind: str) -> None:
    @kopf.on.resume(GROUP, VERSION, plural, id='provision', registry=registry)
    @kopf.on.create(GROUP, VERSION, plural, id='provision', registry=registry)
    @kopf.on.update(GROUP, VERSION, plural, id='provision', registry=registry)
    async def provision(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        outcome = await entities.provision(runtime, kind, body)
        patch.status.update(outcome.status)
        previous = (body.get('status') or {}).get('conditions') or []
        if outcome.problem is None:
            metrics.RECONCILES.labels(kind, 'ok').inc()
            written = outcome.provisioned
            if written is not None and (written is not Provisioned.UNCHANGED
                                        or not _has(previous, 'Ready', 'True')):  # fmt: skip
                _event(body, 'Normal', written.value.capitalize(), f'{kind} {written.value}')
            return
        reason, message = outcome.problem
        metrics.RECONCILES.labels(kind, reason).inc()
        if not _has(previous, 'Ready', 'False', reason):  # once per new problem, not per retry
            _event(body, 'Warning', reason, message)
        if outcome.retry:
            raise kopf.TemporaryError(WAITING + message, delay=runtime.settings.retry_seconds)

    def holds(spec: kopf.Spec, namespace: str | None, **_: Any) -> bool:
        return deletion.needs_finalizer(spec, namespace or '', runtime.settings)

    @kopf.on.delete(GROUP, VERSION, plural, id='deprovision', registry=registry, when=holds)
    async def deprovision(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        since = memo.get('unreachable_since')
        result, since = await deletion.remove(runtime, kind, body, since)
        memo['unreachable_since'] = since
        if result.done:
            if result.released is not None:
                _event(body, 'Warning', 'FinalizerReleased', result.message)
            else:
                _event(body, 'Normal', 'Deprovisioned', result.message)
            return
        assert result.blocked is not None
        previous = (body.get('status') or {}).get('conditions') or []
        if not _has(previous, 'DeletionBlocked', 'True', result.blocked[0]):
            _event(body, 'Warning', 'DeletionBlocked', result.message)
        patch.status['conditions'] = deletion.blocked_conditions(body, *result.blocked)
        raise kopf.TemporaryError(WAITING + result.message, delay=runtime.settings.retry_seconds)


def _has(conditions: list[Any], type_: str, status: str, reason: str | None = None) -> bool:
    return any(
        c.get('type') == type_ and c.get('status') == status
        and (reason is None or c.get('reason') == reason)
        for c in conditions
    )  # fmt: skip


def _event(body: kopf.Body, type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event users see with ``kubectl describe`` (kopf's own logs are not posted
    below WARNING)."""
    kopf.event(body, type=type_, reason=reason, message=message)
