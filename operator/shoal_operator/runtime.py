"""
What one operator run holds: its settings, the Kubernetes session, one Redis registry per cluster,
and the inventory of resources seen on the watch streams (so periodic work needs no list calls).
"""

import asyncio
import dataclasses
import datetime
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal_broker.store.registry import Registry
from shoal_operator import k8s, redisurl
from shoal_operator.manifests import security
from shoal_operator.models import API_VERSION, BrokerCluster, ClusterRef, Credentials, InvalidSpec

DEFAULT_IMAGE = 'ghcr.io/shoal-dev/shoal:0.1.0'
DEFAULT_HEALTH = '0.0.0.0:8080'
DEFAULT_METRICS = '0.0.0.0:9090'
NAMESPACE_NAME = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?')
"""A DNS label: kopf reads ``*`` or ``!`` as a pattern, which needs namespace listing."""


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    broker_image: str = DEFAULT_IMAGE
    namespaces: tuple[str, ...] = ()
    """Namespaces watched, by plain name; empty = the whole cluster."""
    own_namespace: str = ''
    """The operator's own namespace (its ServiceAccount's); '' when unknown."""
    observe_seconds: float = 30.0
    """How often live status is sampled and children are checked for drift."""
    retry_seconds: float = 10.0
    """Delay before retrying a reconcile that waits (for the cluster, Redis, an empty queue)."""
    redis_timeout_seconds: float = 5.0
    health: str = DEFAULT_HEALTH
    """``HOST:PORT`` of the liveness endpoint ``/healthz``."""
    metrics: str = DEFAULT_METRICS
    """``HOST:PORT`` of the Prometheus endpoint ``/metrics``."""

    def permissions_outlive(self, namespace: str) -> bool:
        """Whether the operator can still write to ``namespace`` while it is being deleted:
        only with cluster-wide RBAC (a Role lives in the namespace it grants) and outside its
        own namespace (whose deletion takes its ServiceAccount, and so its token, along)."""
        return not self.namespaces and bool(self.own_namespace) and namespace != self.own_namespace

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> 'Settings':
        namespaces = tuple(n.strip() for n in env.get('SHOAL_OPERATOR_NAMESPACES', '').split(','))
        patterns = [n for n in namespaces if not NAMESPACE_NAME.fullmatch(n) and n]
        if patterns:
            raise ValueError(f'SHOAL_OPERATOR_NAMESPACES takes namespace names, not {patterns}')
        return cls(
            broker_image=env.get('SHOAL_BROKER_IMAGE') or DEFAULT_IMAGE,
            namespaces=tuple(n for n in namespaces if n),
            own_namespace=env.get('SHOAL_OPERATOR_POD_NAMESPACE', ''),
            observe_seconds=float(env.get('SHOAL_OPERATOR_OBSERVE_SECONDS', 30)),
            retry_seconds=float(env.get('SHOAL_OPERATOR_RETRY_SECONDS', 10)),
            health=env.get('SHOAL_OPERATOR_HEALTH') or DEFAULT_HEALTH,
            metrics=env.get('SHOAL_OPERATOR_METRICS') or DEFAULT_METRICS,
        )


def now() -> datetime.datetime:
    """The clock the reconcilers use (pure modules take it as a parameter)."""
    return datetime.datetime.now(datetime.UTC)


class ClusterUnavailable(Exception):
    """The referenced BrokerCluster cannot be used; ``reason`` is the condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


Key = tuple[str, str, str]
"""(kind, namespace, name)"""


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kube: k8s.Kube | None = None
        self.inventory: dict[Key, dict[str, Any]] = {}
        self.secret_warnings: dict[str, set[str]] = {}
        """Per BrokerCluster uid, the Secret problems already posted as Events (kopf runs its
        resume and create handlers on the same body, before either's status is written)."""
        self.last_seen: dict[tuple[str, str], tuple[BrokerCluster, str]] = {}
        """Per (namespace, name), each BrokerCluster this run reached Redis through, with that
        Redis URL: what a Queue or SharedSubscription deleted with its cluster is removed with
        (``kubectl delete -f`` removes the cluster, and maybe the Secret, first)."""
        self.pending_deletions: dict[Key, tuple[dict[str, Any], datetime.datetime | None]] = {}
        """Deleted resources without a finalizer whose deletion policy is not carried out yet
        (consumers attached, Redis down), with since when that is so; retried every pass."""
        self.kinds_not_served: dict[str, list[str]] = {}
        """Per BrokerCluster uid, why optional children could not be created (their kind is not
        served), as reported on its ChildrenApplied condition."""
        self.absent: set[tuple[str, str, str, str]] = set()
        """(namespace, kind, name, BrokerCluster uid) of optional children switched off and
        deleted by this run (or found absent): not deleted again every pass."""
        self._entity_locks: dict[Key, asyncio.Lock] = {}
        self._url_cache: dict[tuple[str, str], tuple[Any, float, tuple[str, str]]] = {}
        self._registries: dict[str, Registry] = {}
        self._ca_dir: Path | None = None

    def api(self) -> k8s.Kube:
        if self.kube is None:
            raise RuntimeError('not logged in to Kubernetes yet')
        return self.kube

    def remember(self, kind: str, body: Mapping[str, Any], deleted: bool) -> None:
        meta = body.get('metadata') or {}
        key = (kind, str(meta.get('namespace')), str(meta.get('name')))
        if deleted:
            self.inventory.pop(key, None)
            lock = self._entity_locks.get(key)
            if lock is not None and not lock.locked():
                del self._entity_locks[key]
            self.secret_warnings.pop(str(meta.get('uid')), None)
            self.kinds_not_served.pop(str(meta.get('uid')), None)
        else:
            self.inventory[key] = dict(body)

    def entity_lock(self, key: Key) -> asyncio.Lock:
        """Held while Redis is written for one Queue or SharedSubscription outside kopf's
        handlers (which kopf already runs one at a time per resource): carrying out its
        deletion policy, and the observer's drift repair, which would otherwise declare again
        what the deletion had just removed."""
        return self._entity_locks.setdefault(key, asyncio.Lock())

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [body for (k, _, _), body in sorted(self.inventory.items()) if k == kind]

    async def cluster(self, ref: ClusterRef, namespace: str) -> BrokerCluster:
        """The referenced cluster, if it exists, is not being deleted and admits ``namespace``.
        Read from the inventory (the watch stream's latest body): a GET only for a cluster the
        watch has not brought yet (just created, or missing), so a pass over every resource
        reads no shared object from the API server."""
        body: Mapping[str, Any] | None = self.inventory.get(
            ('BrokerCluster', ref.namespace, ref.name)
        )
        if body is None:
            body = await self.api().get(API_VERSION, 'BrokerCluster', ref.namespace, ref.name)
        if body is None or (body.get('metadata') or {}).get('deletionTimestamp'):
            raise ClusterUnavailable(
                'ClusterNotFound', f'BrokerCluster {ref.namespace}/{ref.name} does not exist'
            )
        try:
            cluster = BrokerCluster.from_body(body, default_image=self.settings.broker_image)
        except InvalidSpec as exc:  # the cluster's problem, reported on it; retried until fixed
            raise ClusterUnavailable(
                'ClusterInvalid', f'BrokerCluster {ref.namespace}/{ref.name} is invalid: {exc}'
            ) from exc
        if not cluster.admits(namespace):
            raise ClusterUnavailable(
                'NamespaceNotAllowed',
                f'BrokerCluster {ref.namespace}/{ref.name} does not list {namespace} in '
                'spec.tenancy.allowedNamespaces',
            )
        return cluster

    async def registry(self, cluster: BrokerCluster, *, fresh: bool = False) -> Registry:
        """The cluster's Redis, through the URL its brokers get (``redis_url``); ``fresh``:
        read the Secrets naming it again (``_urls``)."""
        _, own = await self._urls(cluster, fresh=fresh)
        registry = self._registry(own)
        self.last_seen[(cluster.meta.namespace, cluster.meta.name)] = (cluster, own)
        return registry

    async def redis_url(self, cluster: BrokerCluster, *, fresh: bool = False) -> str:
        """The Redis URL the cluster's brokers get: the one in ``spec.redis.secretName``, or the
        one rendered from ``spec.redis`` and the Secrets it names (``redisurl.render``)."""
        pods, _ = await self._urls(cluster, fresh=fresh)
        return pods

    async def _urls(self, cluster: BrokerCluster, *, fresh: bool) -> tuple[str, str]:
        """(the brokers' URL, the operator's), from the Secrets read at most once per observe
        interval per cluster: the cluster's own pass reads them again (``fresh``), every Queue
        and SharedSubscription of the pass, and each handler in between, reuses that read. A
        watch of Secrets would need list and watch of every Secret in the watched namespaces
        (all their credentials streamed to the operator); one read per cluster per pass needs
        neither, and a changed Secret is seen within one interval."""
        key = (cluster.meta.namespace, cluster.meta.name)
        cached = self._url_cache.get(key)
        clock = time.monotonic()
        if (not fresh and cached is not None and cached[0] == cluster.redis
                and clock - cached[1] < self.settings.observe_seconds):  # fmt: skip
            return cached[2]
        self._url_cache.pop(key, None)  # a Secret that can no longer be read is not reused
        urls = await self._read_urls(cluster)
        self._url_cache[key] = (cluster.redis, clock, urls)
        return urls

    async def _read_urls(self, cluster: BrokerCluster) -> tuple[str, str]:
        spec, namespace = cluster.redis, cluster.meta.namespace
        if spec.url_secret is not None:
            url = await self._secret_value(namespace, spec.url_secret, spec.url_key, empty=False)
            if (problem := redisurl.mismatch(spec, url)) is not None:
                raise ClusterUnavailable('RedisSecretInvalid', problem)
            return url, url
        auth, sentinel = spec.auth, spec.sentinel_auth
        username, password = await self._credentials(namespace, auth)
        sentinel_username, sentinel_password = await self._credentials(namespace, sentinel)
        secrets = redisurl.Secrets(username, password, sentinel_username, sentinel_password)
        pods = redisurl.render(spec, secrets, security.REDIS_CA_FILE)
        if spec.ca_secret is None:
            return pods, pods
        ca = await self._secret_value(namespace, spec.ca_secret, 'ca.crt')
        return pods, redisurl.render(spec, secrets, self._ca_file(ca))

    async def _credentials(
        self, namespace: str, credentials: Credentials | None
    ) -> tuple[str | None, str | None]:
        if credentials is None:
            return None, None
        password = await self._secret_value(namespace, credentials.secret, credentials.password_key)
        if credentials.username_key is None:
            return None, password
        username = await self._secret_value(namespace, credentials.secret, credentials.username_key)
        return username, password

    async def _secret_value(
        self, namespace: str, name: str, key: str, *, empty: bool = True
    ) -> str:
        """One key of a Secret; ``empty``: whether an empty value will do (a password may be
        empty, a URL may not)."""
        value = await self.api().secret_value(namespace, name, key)
        if value is None or (not value and not empty):
            raise ClusterUnavailable(
                'RedisSecretMissing', f'Secret {namespace}/{name} has no key {key!r}'
            )
        return value

    def _ca_file(self, pem: str) -> str:
        """The operator's copy of a Redis CA (the brokers mount theirs), named by its digest."""
        if self._ca_dir is None:
            self._ca_dir = Path(tempfile.mkdtemp(prefix='shoal-operator-redis-ca-'))
        path = self._ca_dir / f'{hashlib.sha256(pem.encode()).hexdigest()}.crt'
        if not path.exists():
            path.write_text(pem)
        return str(path)

    def remembered(self, ref: ClusterRef) -> tuple[BrokerCluster, Registry] | None:
        """A cluster that is gone (or being deleted) and the Redis this run last reached it
        through; None when this run never did."""
        seen = self.last_seen.get((ref.namespace, ref.name))
        return None if seen is None else (seen[0], self._registry(seen[1]))

    def reached(self) -> list[Registry]:
        """Every Redis this run reached a cluster through."""
        return [self._registry(url) for url in sorted({url for _, url in self.last_seen.values()})]

    def watches(self, namespace: str) -> bool:
        return not self.settings.namespaces or namespace in self.settings.namespaces

    def _registry(self, url: str) -> Registry:
        if url not in self._registries:
            try:
                registry = Registry.from_url(url, timeout=self.settings.redis_timeout_seconds)
            except ValueError as exc:
                raise ClusterUnavailable('RedisSecretInvalid', f'bad Redis URL: {exc}') from exc
            self._registries[url] = registry
        return self._registries[url]

    async def close(self) -> None:
        """Close every cluster's Redis registry and the Kubernetes session. kopf's cleanup calls
        this while the observer may still be in its last round, and ``cli.run`` calls it again
        once everything has stopped: a registry used after the first call connects again, and
        only the second call closes that connection. So the registries are kept, not forgotten."""
        for registry in self._registries.values():
            await registry.close()
        if self.kube is not None:
            await self.kube.close()
            self.kube = None
