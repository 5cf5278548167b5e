"""
kmock's KubernetesEmulator, grown by what Spark's Kubernetes client (fabric8 over Vert.x) asks
of an API server and kmock does not serve: watches over a WebSocket (fabric8 opens every watch
as a WebSocket upgrade and waits for it), server-side apply (a PATCH with
``application/apply-patch+yaml`` that creates what is missing) and delete-collection by label
(what a Spark driver does on stop). With these, ``spark-submit`` and a Spark driver run against
the emulator as against an API server, and every request they make is recorded.
"""

import asyncio
import contextlib
import json
from typing import Any

import aiohttp.web
import kmock
from kubeemulator import StampingEmulator


def selected(labels: dict[str, str], selector: str) -> bool:
    """Whether ``labels`` match an equality-based label selector (``a=b,c!=d,e``)."""
    for term in filter(None, selector.split(',')):
        if '!=' in term:
            key, value = term.split('!=', 1)
            if labels.get(key) == value:
                return False
        elif '=' in term:
            key, value = term.replace('==', '=').split('=', 1)
            if labels.get(key) != value:
                return False
        elif term.startswith('!'):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def wanted(params: Any, obj: dict[str, Any]) -> bool:
    """Whether a list or watch with these query parameters includes ``obj`` (kmock ignores
    selectors; a Spark driver or submitter would take another pod's events for its own)."""
    meta = obj.get('metadata') or {}
    fields = {'metadata.name': meta.get('name'), 'metadata.namespace': meta.get('namespace')}
    for term in filter(None, str(params.get('fieldSelector', '')).split(',')):
        key, _, value = term.partition('=')
        if fields.get(key, value) != value:
            return False
    return selected(meta.get('labels') or {}, str(params.get('labelSelector', '')))


class Fabric8Emulator(StampingEmulator):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied_creates: set[int] = set()
        """Ids of the recorded requests whose server-side apply created the object (the API
        server authorizes such a PATCH as a create too)."""

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        upgrade = raw_request.headers.get('Upgrade', '').lower() == 'websocket'
        if not (upgrade and raw_request.query.get('watch') in ('true', '1')):
            return await super().__call__(raw_request)
        await raw_request.read()
        request = await kmock.Request._parse(raw_request, id=len(self._requests))
        self._requests.append(request)
        socket = aiohttp.web.WebSocketResponse()
        await socket.prepare(raw_request)
        forward = asyncio.ensure_future(self._forward(request, socket))
        try:
            async for _ in socket:  # pings and the like, until a close frame or the peer gone
                pass
        finally:
            forward.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await forward
            await socket.close()
        return socket

    async def _forward(self, request: Any, socket: aiohttp.web.WebSocketResponse) -> None:
        async for payload in self._serve_watch(request):
            if isinstance(payload, dict) and wanted(request.params, payload.get('object') or {}):
                await socket.send_str(json.dumps(payload))

    async def _serve_list(self, request: Any) -> Any:
        listed: Any = await super()._serve_list(request)
        listed['items'] = [item for item in listed['items'] if wanted(request.params, item)]
        return listed

    async def _handle(self, request: Any) -> Any:
        if (
            request.resource is not None
            and request.name is None
            and (str(request.method.value).upper() == 'DELETE')
        ):
            return await self._delete_collection(request)
        if (
            request.namespace
            and isinstance(request.data, dict)
            and (request.action == kmock.action.CREATE or 'apply-patch' in str(request.headers))
        ):  # the API server fills in the namespace of the URL (kmock's watches filter on it)
            request.data.setdefault('metadata', {}).setdefault('namespace', request.namespace)
            if request.resource.plural == 'pods':
                request.data.setdefault('status', {'phase': 'Pending'})
        applying = 'apply-patch' in (request.headers.get('Content-Type') or '')
        if applying and request.resource is not None and isinstance(request.data, dict):
            key = (request.resource, request.namespace, request.name)
            async with self._lock:
                if key not in self._objects or self._objects[key].deleted:
                    self._objects[key] = request.data  # server-side apply creates what is missing
                    self.applied_creates.add(id(request))
        return await super()._handle(request)

    async def _delete_collection(self, request: Any) -> aiohttp.web.StreamResponse:
        selector = request.params.get('labelSelector', '')
        gone = []
        async with self._lock:
            for key, obj in list(self._objects.items()):
                if obj.deleted or key[0] != request.resource or key[1] != request.namespace:
                    continue
                if selected(obj.raw.get('metadata', {}).get('labels') or {}, selector):
                    raw = obj.raw
                    obj.delete()
                    gone.append(raw)
                    await self._buses[request.resource].put({'type': 'DELETED', 'object': raw})
        return aiohttp.web.json_response({'kind': 'List', 'apiVersion': 'v1', 'items': gone})
