"""
The management API's HTTP routes (aiohttp), mounted under ``/api`` on the broker's HTTP port.

JSON in and out. Errors are ``{"error": "..."}`` with a 4xx that says what was wrong (401 no or
bad credentials, 403 no permission, 404 unknown queue/subscription/message, 400 bad input, 409
a refused move) and 503 when Redis does not answer; nothing is changed by a refused request,
except the messages a move reports it moved before it was refused. The routes are described by
``openapi.py``'s document at ``/api/openapi.json``.
"""

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shoal_broker.errors import StoreUnavailable
from shoal_broker.management import openapi
from shoal_broker.management.access import EVERY_ADDRESS, Access, audit
from shoal_broker.management.operations import OperationError, Operations, entity, picker
from shoal_broker.routing.storage import QUEUE_GROUP
from shoal_broker.security.authenticator import Identity
from shoal_broker.security.permissions import Operation

MAX_LIST = 1000
"""Queues or subscriptions one listing page returns at most (``limit``; larger is 400)."""
MAX_BODY_BYTES = 1 << 20
IDENTITY = web.RequestKey('identity', Identity)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, **extra: Any) -> web.Response:
    headers = {'WWW-Authenticate': 'Basic realm="shoal"'} if status == 401 else None
    return web.json_response({'error': message, **extra}, status=status, headers=headers)


def _int(request: web.Request, name: str, default: int, most: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not 0 <= int(text) <= most:
        raise OperationError(400, f'{name} must be a whole number from 0 to {most}')
    return int(text)


async def _body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    """The JSON object of a request (empty when there is no body); 400 when malformed."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OperationError(400, f'the body is not JSON: {exc}') from None
    if not isinstance(body, dict):
        raise OperationError(400, 'the body must be a JSON object')
    unknown = set(body) - allowed
    if unknown:
        raise OperationError(400, f'unknown fields: {", ".join(sorted(unknown))}')
    return body


SORTS = ('name', 'backlog')
"""A listing's orders: by name, or largest backlog first (then by name)."""


def _sort(request: web.Request) -> str:
    order = request.query.get('sort', 'name')
    if order not in SORTS:
        raise OperationError(400, f'sort must be one of: {", ".join(SORTS)}')
    return order


def _selection(body: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    ids, selector = body.get('ids'), body.get('selector')
    if ids is not None and selector is not None:
        raise OperationError(400, 'give ids or a selector, not both')
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise OperationError(400, 'ids must be a list of message ids')
    if selector is not None and not isinstance(selector, str):
        raise OperationError(400, 'selector must be a string')
    return ids, selector


class Routes:
    def __init__(self, ops: Operations, access: Access) -> None:
        self.ops = ops
        self.access = access

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY_BYTES)
        r = app.router
        r.add_get('/openapi.json', self.openapi)
        r.add_get('/addresses', self.addresses)
        r.add_get('/queues', self.queues)
        r.add_get('/queues/{name}', self.queue)
        r.add_get('/queues/{name}/messages', self.queue_messages)
        r.add_delete('/queues/{name}/messages/{id}', self.delete_message)
        r.add_post('/queues/{name}/purge', self.purge_queue)
        r.add_post('/queues/{name}/move', self.move)
        r.add_post('/queues/{name}/retry', self.retry)
        r.add_post('/queues/{name}/pause', self.pause_queue)
        r.add_post('/queues/{name}/resume', self.pause_queue)
        r.add_get('/subscriptions', self.subscriptions)
        r.add_get('/subscriptions/{id}', self.subscription)
        r.add_delete('/subscriptions/{id}', self.delete_subscription)
        r.add_get('/subscriptions/{id}/messages', self.subscription_messages)
        r.add_post('/subscriptions/{id}/purge', self.purge_subscription)
        r.add_post('/subscriptions/{id}/pause', self.pause_subscription)
        r.add_post('/subscriptions/{id}/resume', self.pause_subscription)
        r.add_get('/connections', self.connections)
        r.add_delete('/connections/{replica}/{id}', self.close_connection)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.endswith('/openapi.json'):
            return await handler(request)
        identity = await self.access.identify(request.headers.get('Authorization'))
        if identity is None:
            return _error(401, 'authentication required (HTTP Basic, a user of the users file)')
        request[IDENTITY] = identity
        try:
            return await handler(request)
        except OperationError as exc:
            return _error(exc.status, exc.message, **exc.done)
        except StoreUnavailable as exc:
            return _error(503, f'the store is unavailable: {exc}')

    def _check(self, request: web.Request, operation: Operation, address: str) -> Identity:
        identity = request[IDENTITY]
        if not self.access.allows(identity, operation, address):
            if operation is Operation.MANAGE:
                audit(identity, f'{request.method}:{request.path}', address, 'denied', '')
            raise OperationError(403, f'{identity.name} may not {operation} {address!r}')
        return identity

    async def _write(
        self, request: web.Request, operation: str, target: str, run: Awaitable[Any]
    ) -> web.Response:
        """Run a write and audit it, whatever its outcome."""
        identity = request[IDENTITY]
        try:
            result = await run
        except OperationError as exc:
            audit(identity, operation, target, 'refused', f'status={exc.status} {exc.message}')
            raise
        except StoreUnavailable:
            audit(identity, operation, target, 'failed', 'store unavailable')
            raise
        if dataclasses.is_dataclass(result) and not isinstance(result, type):
            result = dataclasses.asdict(result)
        audit(identity, operation, target, 'ok', json.dumps(result, sort_keys=True))
        return web.json_response(result)

    # -- reads ------------------------------------------------------------------------------------

    async def openapi(self, _: web.Request) -> web.Response:
        return web.json_response(openapi.document())

    async def addresses(self, request: web.Request) -> web.Response:
        found = await self.ops.admin.registry.addresses()
        identity = request[IDENTITY]
        shown = [
            dataclasses.asdict(a) for a in found
            if self.access.allows(identity, Operation.BROWSE, a.name)
        ]  # fmt: skip
        return web.json_response(shown)

    async def queues(self, request: web.Request) -> web.Response:
        """A page of the queues whose names contain ``search``, in name order or largest
        backlog first (``sort``)."""
        offset = _int(request, 'offset', 0, 1 << 31)
        limit = _int(request, 'limit', 100, MAX_LIST)
        search, order = request.query.get('search', ''), _sort(request)
        identity = request[IDENTITY]
        registry = self.ops.admin.registry
        names = [
            a.name for a in await registry.addresses()
            if a.kind == 'queue' and search in a.name
            and self.access.allows(identity, Operation.BROWSE, a.name)
        ]  # fmt: skip
        if order == 'backlog':
            found = await registry.group_backlogs([(n, QUEUE_GROUP) for n in names])
            ranked = sorted(zip(found, names, strict=True), key=lambda p: (-p[0].backlog, p[1]))
            names = [name for _, name in ranked]
        rows = await registry.queues(names[offset : offset + limit])
        paused, rates = await self.ops.admin.paused(), await self.ops.rates()
        items = [_queue_row(dataclasses.asdict(q), paused, rates) for q in rows]
        return web.json_response({'total': len(names), 'offset': offset, 'items': items})

    async def queue(self, request: web.Request) -> web.Response:
        name = request.match_info['name']
        self._check(request, Operation.BROWSE, name)
        await self.ops.queue(name)
        rows = await self.ops.admin.registry.queues([name])
        paused, rates = await self.ops.admin.paused(), await self.ops.rates()
        return web.json_response(_queue_row(dataclasses.asdict(rows[0]), paused, rates))

    async def queue_messages(self, request: web.Request) -> web.Response:
        name = request.match_info['name']
        self._check(request, Operation.BROWSE, name)
        await self.ops.queue(name)
        return await self._messages(request, name, QUEUE_GROUP)

    async def _messages(self, request: web.Request, address: str, group: str) -> web.Response:
        limit = _int(request, 'limit', 50, 1 << 31)
        page = await self.ops.browse(
            address, group, request.query.get('cursor'), limit, request.query.get('selector')
        )
        return web.json_response(page)

    async def subscriptions(self, request: web.Request) -> web.Response:
        offset = _int(request, 'offset', 0, 1 << 31)
        limit = _int(request, 'limit', 100, MAX_LIST)
        search, order = request.query.get('search', ''), _sort(request)
        identity = request[IDENTITY]
        rows = [
            s for s in await self.ops.admin.registry.subscriptions()
            if search in s.id and self.access.allows(identity, Operation.BROWSE, s.topic)
        ]  # fmt: skip
        if order == 'backlog':
            rows.sort(key=lambda s: (-s.backlog, s.id))
        paused, rates = await self.ops.admin.paused(), await self.ops.rates()
        items = [
            _subscription_row(dataclasses.asdict(s), paused, rates)
            for s in rows[offset : offset + limit]
        ]
        return web.json_response({'total': len(rows), 'offset': offset, 'items': items})

    async def subscription(self, request: web.Request) -> web.Response:
        sid = request.match_info['id']
        topic = (await self.ops.subscription(sid)).get('topic', '')
        self._check(request, Operation.BROWSE, topic)
        found = [s for s in await self.ops.admin.registry.subscriptions() if s.id == sid]
        if not found:
            raise OperationError(404, f'no subscription {sid!r}')
        paused, rates = await self.ops.admin.paused(), await self.ops.rates()
        return web.json_response(_subscription_row(dataclasses.asdict(found[0]), paused, rates))

    async def subscription_messages(self, request: web.Request) -> web.Response:
        sid = request.match_info['id']
        topic = (await self.ops.subscription(sid)).get('topic', '')
        self._check(request, Operation.BROWSE, topic)
        return await self._messages(request, topic, sid)

    async def connections(self, request: web.Request) -> web.Response:
        self._check(request, Operation.BROWSE, EVERY_ADDRESS)
        return web.json_response(await self.ops.connections())

    # -- writes -----------------------------------------------------------------------------------

    async def delete_message(self, request: web.Request) -> web.Response:
        name, message_id = request.match_info['name'], request.match_info['id']
        self._check(request, Operation.MANAGE, name)
        await self.ops.queue(name)
        run = self.ops.delete_message(name, message_id)
        return await self._write(request, 'delete-message', f'{name}/{message_id}', run)

    async def purge_queue(self, request: web.Request) -> web.Response:
        name = request.match_info['name']
        self._check(request, Operation.MANAGE, name)
        await self.ops.queue(name)
        return await self._write(request, 'purge', name, self.ops.purge(name, QUEUE_GROUP))

    async def move(self, request: web.Request) -> web.Response:
        name = request.match_info['name']
        self._check(request, Operation.MANAGE, name)
        body = await _body(request, {'target', 'ids', 'selector'})
        target = body.get('target')
        if not isinstance(target, str) or not target:
            raise OperationError(400, 'target must name an address')
        self._check(request, Operation.MANAGE, target)
        ids, selector = _selection(body)
        pick = picker(ids, selector)
        await self.ops.queue(name)
        return await self._write(
            request, 'move', f'{name}->{target}', self.ops.move(name, target, pick)
        )

    async def retry(self, request: web.Request) -> web.Response:
        name = request.match_info['name']
        self._check(request, Operation.MANAGE, name)
        ids, selector = _selection(await _body(request, {'ids', 'selector'}))
        pick = picker(ids, selector)
        await self.ops.queue(name)
        identity = request[IDENTITY]

        def allowed(target: str) -> bool:
            return self.access.allows(identity, Operation.MANAGE, target)

        return await self._write(request, 'retry', name, self.ops.retry(name, pick, allowed))

    async def pause_queue(self, request: web.Request) -> web.Response:
        name = request.match_info['name']
        self._check(request, Operation.MANAGE, name)
        await self.ops.queue(name)
        return await self._pause(request, entity(name, QUEUE_GROUP))

    async def pause_subscription(self, request: web.Request) -> web.Response:
        sid = request.match_info['id']
        self._check(request, Operation.MANAGE, (await self.ops.subscription(sid)).get('topic', ''))
        return await self._pause(request, entity('', sid))

    async def _pause(self, request: web.Request, field: str) -> web.Response:
        paused = request.path.endswith('/pause')
        user = request[IDENTITY].name

        async def run() -> dict[str, Any]:
            unconfirmed = await self.ops.pause(field, user, paused=paused)
            return {'paused': paused, 'unconfirmed': unconfirmed}

        return await self._write(request, 'pause' if paused else 'resume', field, run())

    async def purge_subscription(self, request: web.Request) -> web.Response:
        sid = request.match_info['id']
        topic = (await self.ops.subscription(sid)).get('topic', '')
        self._check(request, Operation.MANAGE, topic)
        return await self._write(request, 'purge', sid, self.ops.purge(topic, sid))

    async def delete_subscription(self, request: web.Request) -> web.Response:
        sid = request.match_info['id']
        topic = (await self.ops.subscription(sid)).get('topic', '')
        self._check(request, Operation.MANAGE, topic)
        return await self._write(
            request, 'delete-subscription', sid, self.ops.delete_subscription(sid)
        )

    async def close_connection(self, request: web.Request) -> web.Response:
        replica, connection = request.match_info['replica'], request.match_info['id']
        self._check(request, Operation.MANAGE, EVERY_ADDRESS)

        async def run() -> dict[str, Any]:
            await self.ops.close_connection(replica, connection)
            return {'closing': connection, 'replica': replica}

        return await self._write(request, 'close-connection', f'{replica}/{connection}', run())


Rates = dict[tuple[str, str], dict[str, Any]]
NO_RATES = {
    'enqueued_per_second': 0.0, 'delivered_per_second': 0.0, 'acknowledged_per_second': 0.0,
    'delivered_per_second_per_replica': {},
}  # fmt: skip


def _age(row: dict[str, Any]) -> float | None:
    oldest = row.get('oldest_ms')
    return max(0.0, time.time() - oldest / 1000) if oldest else None


def _queue_row(row: dict[str, Any], paused: dict[str, Any], rates: Rates) -> dict[str, Any]:
    return {
        **row, 'oldest_age_seconds': _age(row),
        'paused': entity(row['name'], QUEUE_GROUP) in paused,
        'rates': rates.get((row['name'], QUEUE_GROUP), NO_RATES),
    }  # fmt: skip


def _subscription_row(row: dict[str, Any], paused: dict[str, Any], rates: Rates) -> dict[str, Any]:
    return {
        **row, 'oldest_age_seconds': _age(row), 'paused': entity('', row['id']) in paused,
        'rates': rates.get((row['topic'], row['id']), NO_RATES),
    }  # fmt: skip
