"""
Test-side helpers for the emulated Kubernetes API (kmock's KubernetesEmulator).

kmock keeps no resourceVersion, uid or generation and ignores ``generateName`` (operator-anchors
§5); ``StampingEmulator`` fills them in as an API server does, so kopf's finalizer patches (a
JSON-patch testing the resourceVersion), observedGeneration and kopf's Events work. ``Kube`` is a
test's hands on the API.
"""

import asyncio
import base64
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import kmock
from prometheus_client import REGISTRY

GROUP_VERSION = 'shoal.dev/v1alpha1'
WATCHED = ('default', 'elsewhere')
"""The namespaces the tests' operator watches (as the chart's namespaced RBAC has it)."""
LAST_PASS = 'shoal_operator_last_observation_timestamp_seconds'
"""The gauge an in-process operator's observer loop moves at the end of each pass."""
_versions = itertools.count(1000)


class StampingEmulator(kmock.KubernetesEmulator):
    unserved: frozenset[str] = frozenset()
    """Plurals answered 404 as by an API server without their CRD (a test sets its own)."""
    forbidden: frozenset[str] = frozenset()
    """Namespaces whose operator Role is gone: new requests bearing ``forbidden_token`` are
    refused with 403 there (watches opened before go on, as on a real API server)."""
    forbidden_token = ''

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.resource.plural in self.unserved:
            raise kmock.KubernetesResourceNotFoundError()
        if (
            request.namespace in self.forbidden
            and request.headers.get('Authorization') == f'Bearer {self.forbidden_token}'
        ):
            raise kmock.KubernetesError(
                status=403, reason='Forbidden', message='no Role in this namespace any more'
            )
        data = request.data
        if request.resource is not None and request.resource.plural == 'services':
            _omit_empty(data)
        if request.resource is not None and request.action == kmock.action.CREATE:
            meta = data.setdefault('metadata', {})
            if not meta.get('name') and meta.get('generateName'):  # as the API server does
                meta['name'] = f'{meta["generateName"]}{uuid.uuid4().hex[:5]}'
            meta.setdefault('uid', str(uuid.uuid4()))
            meta.setdefault('generation', 1)
            meta.setdefault('creationTimestamp', '2026-01-01T00:00:00Z')
            meta['resourceVersion'] = str(next(_versions))
        elif request.resource is not None and request.action == kmock.action.UPDATE:
            # generation follows spec changes; the resourceVersion stays as created, so kopf's
            # JSON-patch test of it never fails on its own earlier merge-patches (this emulator
            # has no conflict detection to make bumping it meaningful)
            key = (request.resource, request.namespace, request.name)
            current = self.objects[key] if key in self._objects else None
            generation = int((current or {}).get('metadata', {}).get('generation', 1)) + 1
            if isinstance(data, list) and current is not None:
                if any(str(op.get('path', '')).startswith('/spec') for op in data):
                    data.append(
                        {'op': 'replace', 'path': '/metadata/generation', 'value': generation}
                    )
            elif isinstance(data, dict) and current is not None and 'spec' in data:
                data['metadata'] = {**(data.get('metadata') or {}), 'generation': generation}
        return await super()._handle(request)


def _omit_empty(data: Any) -> None:
    """A false ``publishNotReadyAddresses`` is dropped from a stored Service, as the API server's
    ``omitempty`` does (an apply that sends it would never find it held)."""
    spec = data.get('spec') if isinstance(data, dict) else None
    if isinstance(spec, dict) and spec.get('publishNotReadyAddresses') is False:
        del spec['publishNotReadyAddresses']


CRDS = {
    'brokerclusters': ('BrokerCluster', {'status', 'scale'}),
    'queues': ('Queue', {'status'}),
    'sharedsubscriptions': ('SharedSubscription', {'status'}),
}
VERBS = {'get', 'list', 'watch', 'create', 'patch', 'update', 'delete'}


def kmock_resource(kind: str, subresources: set[str]) -> Any:
    return kmock.ResourceInfo(kind=kind, namespaced=True, verbs=VERBS, subresources=subresources)


class Kube:
    """A test's hands on the emulated API server."""

    def __init__(self, emulator: Any, session: aiohttp.ClientSession) -> None:
        self.emulator = emulator
        self.session = session

    @staticmethod
    def url(api_version: str, plural: str, namespace: str, name: str = '') -> str:
        root = f'/apis/{api_version}' if '/' in api_version else f'/api/{api_version}'
        return f'{root}/namespaces/{namespace}/{plural}' + (f'/{name}' if name else '')

    async def create(self, plural: str, body: dict[str, Any], api_version: str = GROUP_VERSION
                     ) -> None:  # fmt: skip
        namespace = body['metadata'].setdefault('namespace', 'default')
        body.setdefault('apiVersion', api_version)
        async with self.session.post(self.url(api_version, plural, namespace), json=body) as r:
            assert r.status < 300, await r.text()

    async def get(self, plural: str, name: str, namespace: str = 'default',
                  api_version: str = GROUP_VERSION) -> dict[str, Any] | None:  # fmt: skip
        async with self.session.get(self.url(api_version, plural, namespace, name)) as r:
            if r.status == 404:
                return None
            assert r.status < 300, await r.text()
            found: dict[str, Any] = await r.json()
            return found

    async def patch(
        self,
        plural: str,
        name: str,
        body: dict[str, Any],
        namespace: str = 'default',
        api_version: str = GROUP_VERSION,
    ) -> None:
        async with self.session.patch(
            self.url(api_version, plural, namespace, name), json=body,
            headers={'Content-Type': 'application/merge-patch+json'},
        ) as r:  # fmt: skip
            assert r.status < 300, await r.text()

    async def delete(
        self, plural: str, name: str, namespace: str = 'default', api_version: str = GROUP_VERSION
    ) -> None:
        async with self.session.delete(self.url(api_version, plural, namespace, name)) as r:
            assert r.status < 300, await r.text()

    async def event_reasons(self, name: str, namespace: str = 'default') -> list[str]:
        """Reasons of the Events posted about the object called ``name``, oldest first."""
        async with self.session.get(self.url('v1', 'events', namespace)) as r:
            assert r.status < 300, await r.text()
            items = (await r.json()).get('items') or []
        return [e.get('reason', '') for e in items
                if (e.get('involvedObject') or {}).get('name') == name]  # fmt: skip

    async def event_types(self, name: str, namespace: str = 'default') -> list[str]:
        """Types (Normal, Warning, Error) of the Events posted about the object ``name``."""
        async with self.session.get(self.url('v1', 'events', namespace)) as r:
            assert r.status < 300, await r.text()
            items = (await r.json()).get('items') or []
        return [e.get('type', '') for e in items
                if (e.get('involvedObject') or {}).get('name') == name]  # fmt: skip

    async def redis_secret(self, url: str, name: str = 'redis') -> None:
        body = {
            'metadata': {'name': name},
            'data': {'url': base64.b64encode(url.encode()).decode()},
        }
        await self.create('secrets', body, api_version='v1')

    async def observer_passes(self, count: int) -> None:
        """Wait for ``count`` whole passes of the in-process operator's observer loop (each
        re-applies and re-observes every BrokerCluster), the first one starting after the call."""
        for _ in range(count + 1):
            before = REGISTRY.get_sample_value(LAST_PASS) or 0.0

            async def moved(before: float = before) -> bool:
                return (REGISTRY.get_sample_value(LAST_PASS) or 0.0) > before

            await self.eventually(moved, 'an observer pass')

    async def eventually(self, probe: Callable[[], Any], what: str, limit: float = 30) -> Any:
        """Poll an async probe until it returns something truthy (bounded)."""
        deadline = asyncio.get_running_loop().time() + limit
        while True:
            value = await probe()
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f'timed out waiting for {what}')
            await asyncio.sleep(0.2)


# -- resource bodies ----------------------------------------------------------------------------


def cluster_body(name: str = 'shoal', **spec: Any) -> dict[str, Any]:
    """A BrokerCluster that lets anonymous clients in (the tests' brokers run without users)."""
    return {'kind': 'BrokerCluster', 'metadata': {'name': name},
            'spec': {'redis': {'secretName': 'redis'}, 'replicas': 2,
                     'auth': {'allowAnonymous': True}, **spec}}  # fmt: skip


def subscription_body(name: str, topic: str, **spec: Any) -> dict[str, Any]:
    return {
        'kind': 'SharedSubscription',
        'metadata': {'name': name},
        'spec': {'clusterRef': {'name': 'shoal'}, 'topic': topic, 'subscriptionName': name,
                 **spec},
    }  # fmt: skip


def condition(body: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((body or {}).get('status') or {}).get('conditions') or []:
        if c['type'] == type_:
            return dict(c)
    return {}
