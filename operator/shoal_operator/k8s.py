"""
The only module doing Kubernetes API I/O (besides kopf patching the object it handles).

Plain REST over aiohttp (kopf's own HTTP client) with the credentials kopf logged in with, so the
operator needs no second client configuration. Children are applied as "create, else merge-patch
when they differ": idempotent, and quiet when nothing changed. Server-side apply would be nicer
but is not available on every API server the operator is tested against; what the merge patch
must remove is worked out by :mod:`shoal_operator.manifests.applied` (keys the last apply set and
this one does not) and ``WHOLE_DATA`` below.
"""

import base64
import datetime
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from shoal_operator.manifests import applied

PLURALS = {
    'ConfigMap': 'configmaps',
    'Secret': 'secrets',
    'Service': 'services',
    'Deployment': 'deployments',
    'PodDisruptionBudget': 'poddisruptionbudgets',
    'NetworkPolicy': 'networkpolicies',
    'ServiceMonitor': 'servicemonitors',
    'HorizontalPodAutoscaler': 'horizontalpodautoscalers',
    'BrokerCluster': 'brokerclusters',
    'Queue': 'queues',
    'SharedSubscription': 'sharedsubscriptions',
}
MERGE_PATCH = 'application/merge-patch+json'
WHOLE_DATA = {'ConfigMap', 'Secret'}
"""Kinds whose ``data`` the operator renders whole: a key it no longer renders is removed (a merge
patch by itself only adds and changes keys, so a dropped setting would live on)."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f'HTTP {status}: {message}' if status else message)
        self.status = status


class ApiUnreachable(ApiError):
    """A request the API server did not answer: the connection failed or broke, or the answer
    took longer than the session's timeout. It is as transient as a 5xx, so it is an
    ``ApiError``: handlers retry it at the operator's retry delay rather than at kopf's default
    backoff for unexpected errors (60 s), and an observation pass skips the object rather than
    ending the pass."""

    def __init__(self, method: str, url: str, cause: BaseException) -> None:
        detail = str(cause) or 'no detail'
        super().__init__(0, f'{method} {url}: no answer ({type(cause).__name__}: {detail})')


class KindNotServed(ApiError):
    """The API server does not serve the kind (its CRD is not installed): a create answered
    404."""

    def __init__(self, api_version: str, kind: str) -> None:
        self.description = f'{kind} ({api_version}) is not served by the API server'
        super().__init__(404, self.description)
        self.kind = kind
        self.api_version = api_version


def path(api_version: str, kind: str, namespace: str, name: str = '') -> str:
    root = f'/api/{api_version}' if '/' not in api_version else f'/apis/{api_version}'
    tail = f'/{name}' if name else ''
    return f'{root}/namespaces/{namespace}/{PLURALS[kind]}{tail}'


def contains(actual: Any, desired: Any) -> bool:
    """Whether ``actual`` already holds everything ``desired`` says (extra fields are fine)."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            contains(actual.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(contains(a, d) for a, d in zip(actual, desired, strict=True))
        )
    return bool(actual == desired)


class Kube:
    """A Kubernetes API session for one login."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self._server = info.server.rstrip('/')
        # kopf's own translation of the credentials (the one its client uses): CA and client
        # certificate as paths or as the kubeconfig's base64 data, bearer token, insecure mode
        self._session = aiohttp.ClientSession(
            headers={**info.as_http_headers(), 'Accept': 'application/json'},
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
            proxy=info.proxy_url,
            trust_env=info.trust_env,
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self._session.close()

    async def get(self, api_version: str, kind: str, namespace: str, name: str
                  ) -> dict[str, Any] | None:  # fmt: skip
        return await self._request('GET', path(api_version, kind, namespace, name))

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object, or merge-patch it when it lacks part of ``manifest`` or still has
        keys an earlier apply set and ``manifest`` dropped."""
        manifest = applied.recording(manifest)
        meta = manifest['metadata']
        url = path(manifest['apiVersion'], manifest['kind'], meta['namespace'], meta['name'])
        current = await self._request('GET', url)
        if current is None:
            collection = path(manifest['apiVersion'], manifest['kind'], meta['namespace'])
            created = await self._request('POST', collection, body=manifest)
            if created is None:
                raise KindNotServed(manifest['apiVersion'], manifest['kind'])
            return created
        manifest = applied.removing_dropped(current, _removing_stale_data(current, manifest))
        if contains(current, manifest):
            return current
        patched = await self._request('PATCH', url, body=manifest, content_type=MERGE_PATCH)
        return patched or current

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """True if it existed."""
        return await self._request('DELETE', path(api_version, kind, namespace, name)) is not None

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str = '',
    ) -> dict[str, Any] | None:
        url = path(api_version, kind, namespace, name) + (f'/{subresource}' if subresource else '')
        return await self._request('PATCH', url, body=body, content_type=MERGE_PATCH)

    async def post_event(self, body: Mapping[str, Any], type_: str, reason: str, message: str
                         ) -> None:  # fmt: skip
        """A core/v1 Event about ``body`` (for work done outside kopf's handlers)."""
        meta = body['metadata']
        now = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')
        event = {
            'apiVersion': 'v1', 'kind': 'Event',
            'metadata': {'generateName': f"{meta['name']}.", 'namespace': meta['namespace']},
            'involvedObject': {'apiVersion': body['apiVersion'], 'kind': body['kind'],
                               'name': meta['name'], 'namespace': meta['namespace'],
                               'uid': meta.get('uid', '')},
            'type': type_, 'reason': reason, 'message': message[:1024],
            'source': {'component': 'shoal-operator'},
            'firstTimestamp': now, 'lastTimestamp': now, 'count': 1,
        }  # fmt: skip
        await self._request('POST', f'/api/v1/namespaces/{meta["namespace"]}/events', body=event)

    async def secret_keys(self, namespace: str, name: str) -> set[str] | None:
        """The keys a Secret holds; None when there is no such Secret."""
        secret = await self.get('v1', 'Secret', namespace, name)
        if secret is None:
            return None
        return {*(secret.get('data') or {}), *(secret.get('stringData') or {})}

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """One key of a Secret, decoded; None when the Secret or key is missing."""
        secret = await self.get('v1', 'Secret', namespace, name)
        if secret is None:
            return None
        if key in (secret.get('stringData') or {}):  # never returned by a real API server
            return str(secret['stringData'][key])
        encoded = (secret.get('data') or {}).get(key)
        return base64.b64decode(encoded).decode() if encoded is not None else None

    async def _request(
        self, method: str, url: str, *, body: Any = None, content_type: str = 'application/json'
    ) -> dict[str, Any] | None:
        """The decoded answer; None for 404 (and for a DELETE of a missing object)."""
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs['json'] = body
            kwargs['headers'] = {'Content-Type': content_type}
        try:
            async with self._session.request(method, self._server + url, **kwargs) as response:
                if response.status == 404:
                    return None
                if response.status >= 400:
                    raise ApiError(response.status, (await response.text())[:500])
                answer: dict[str, Any] = await response.json(content_type=None)
                return answer
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise ApiUnreachable(method, url, exc) from exc


def _removing_stale_data(current: Mapping[str, Any], manifest: Mapping[str, Any]
                         ) -> Mapping[str, Any]:  # fmt: skip
    """``manifest`` with a null (merge-patch removal) for each ``data`` key only ``current`` has."""
    if manifest['kind'] not in WHOLE_DATA:
        return manifest
    desired = manifest.get('data') or {}
    stale = {key: None for key in current.get('data') or {} if key not in desired}
    return {**manifest, 'data': {**desired, **stale}} if stale else manifest
