"""
The OpenAPI 3 document of the management API, served at ``/api/openapi.json``: what a console or
a script builds on, and what the property-based test (schemathesis) runs against a real broker.
Kept beside ``routes.py``, which it describes route for route.
"""

from typing import Any

from shoal_broker.management.operations import MAX_PAGE

_ERROR = {'$ref': '#/components/schemas/Error'}
_OBJECT = {'type': 'object', 'additionalProperties': True}


def _response(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {'description': description}
    if schema is not None:
        answer['content'] = {'application/json': {'schema': schema}}
    return answer


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        400: 'malformed input', 401: 'no or bad credentials', 403: 'no permission',
        404: 'no such queue, subscription, message or connection',
        409: 'refused: the target is at its backlog limit, a topic without subscription, a '
        'message out at a consumer, consumers attached, or declared by a resource',
        503: 'Redis does not answer',
    }  # fmt: skip
    return {str(c): _response(why[c], _ERROR) for c in (401, 403, 503, *codes)}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        'name': name, 'in': 'path', 'required': True, 'description': description,
        'schema': {'type': 'string', 'minLength': 1},
    }  # fmt: skip


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {'name': name, 'in': 'query', 'required': False, 'schema': schema,
            'description': description}  # fmt: skip


_QUEUE = _path_param('name', 'queue (address) name')
_SUBSCRIPTION = _path_param('id', 'subscription id, e.g. durable:global:*:orders-audit')
_LISTING = [
    _query('offset', {'type': 'integer', 'minimum': 0}, 'first item of the page'),
    _query('limit', {'type': 'integer', 'minimum': 0, 'maximum': 1000}, 'items per page'),
    _query('search', {'type': 'string'}, 'only names containing this (case-sensitive)'),
    _query('sort', {'type': 'string', 'enum': ['name', 'backlog']},
           'name order (the default), or largest backlog first then name'),
]  # fmt: skip
_BROWSING = [
    _query('cursor', {'type': 'string'}, "the previous page's next"),
    _query('limit', {'type': 'integer', 'minimum': 1, 'maximum': MAX_PAGE},
           f'messages per page (at most {MAX_PAGE}; more is refused with 400)'),
    _query('selector', {'type': 'string'}, 'a JMS selector: only the messages it matches'),
]  # fmt: skip
_SELECTION = {
    'ids': {'type': 'array', 'items': {'type': 'string'}, 'description': 'message ids'},
    'selector': {'type': 'string', 'description': 'a JMS selector'},
}


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {'type': 'object', 'properties': properties,
                              'additionalProperties': False}  # fmt: skip
    if required:
        schema['required'] = required
    return {'required': bool(required), 'content': {'application/json': {'schema': schema}}}


def _op(summary: str, params: list[dict[str, Any]], ok: dict[str, Any], *errors: int,
        body: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    op: dict[str, Any] = {
        'summary': summary, 'parameters': params,
        'responses': {'200': _response('done', ok), **_errors(*errors)},
    }  # fmt: skip
    if body is not None:
        op['requestBody'] = body
    return op


def document() -> dict[str, Any]:
    page = {'$ref': '#/components/schemas/Page'}
    messages = {'$ref': '#/components/schemas/Messages'}
    transfer = {'$ref': '#/components/schemas/Transfer'}
    paths: dict[str, Any] = {
        '/addresses': {'get': _op('every address and its kind', [], {'type': 'array'})},
        '/queues': {
            'get': _op(
                'queues: backlog, in flight, consumers and deliveries per '
                'replica, oldest age, paused',
                _LISTING,
                page,
                400,
            )
        },
        '/queues/{name}': {'get': _op('one queue', [_QUEUE], _OBJECT, 404)},
        '/queues/{name}/messages': {
            'get': _op('browse without consuming', [_QUEUE, *_BROWSING], messages, 400, 404)
        },
        '/queues/{name}/messages/{id}': {
            'delete': _op(
                'delete one message',
                [_QUEUE, _path_param('id', 'message id')],
                _OBJECT,
                400,
                404,
                409,
            )
        },
        '/queues/{name}/purge': {'post': _op('purge', [_QUEUE], _OBJECT, 404)},
        '/queues/{name}/move': {
            'post': _op(
                'move messages (all, by id or by selector) to another address',
                [_QUEUE],
                transfer,
                400,
                404,
                409,
                body=_body(
                    {'target': {'type': 'string', 'minLength': 1}, **_SELECTION}, ['target']
                ),
            )
        },
        '/queues/{name}/retry': {
            'post': _op(
                'send dead-lettered or expired messages back to their original address',
                [_QUEUE],
                transfer,
                400,
                404,
                409,
                body=_body(_SELECTION, []),
            )
        },
        '/queues/{name}/pause': {'post': _op('pause delivery', [_QUEUE], _OBJECT, 404)},
        '/queues/{name}/resume': {'post': _op('resume delivery', [_QUEUE], _OBJECT, 404)},
        '/subscriptions': {'get': _op('named subscriptions', _LISTING, page, 400)},
        '/subscriptions/{id}': {
            'get': _op('one subscription', [_SUBSCRIPTION], _OBJECT, 404),
            'delete': _op(
                'delete a subscription and its messages', [_SUBSCRIPTION], _OBJECT, 404, 409
            ),
        },
        '/subscriptions/{id}/messages': {
            'get': _op('browse without consuming', [_SUBSCRIPTION, *_BROWSING], messages, 400, 404)
        },
        '/subscriptions/{id}/purge': {'post': _op('purge', [_SUBSCRIPTION], _OBJECT, 404)},
        '/subscriptions/{id}/pause': {'post': _op('pause delivery', [_SUBSCRIPTION], _OBJECT, 404)},
        '/subscriptions/{id}/resume': {'post': _op('resume', [_SUBSCRIPTION], _OBJECT, 404)},
        '/connections': {'get': _op('client connections of every replica', [], {'type': 'array'})},
        '/connections/{replica}/{id}': {
            'delete': _op(
                'close a client connection (amqp:connection:forced)',
                [_path_param('replica', 'replica id'), _path_param('id', 'connection id')],
                _OBJECT,
                404,
            )
        },
    }
    return {
        'openapi': '3.0.3',
        'info': {'title': 'Shoal management API', 'version': '1'},
        'servers': [{'url': '/api'}],
        'security': [{'basic': []}, {}],
        'paths': paths,
        'components': {
            'securitySchemes': {'basic': {'type': 'http', 'scheme': 'basic'}},
            'schemas': {
                'Error': {'type': 'object', 'required': ['error'],
                          'properties': {'error': {'type': 'string'}}},
                'Page': {'type': 'object', 'required': ['total', 'offset', 'items'],
                         'properties': {'total': {'type': 'integer'},
                                        'offset': {'type': 'integer'},
                                        'items': {'type': 'array', 'items': _OBJECT}}},
                'Messages': {'type': 'object', 'required': ['messages', 'next'],
                             'properties': {'messages': {'type': 'array', 'items': _OBJECT},
                                            'next': {'type': 'string', 'nullable': True}}},
                'Transfer': {'type': 'object', 'properties': {
                    'moved': {'type': 'integer'}, 'in_flight': {'type': 'integer'},
                    'duplicated': {'type': 'integer'}, 'skipped': {'type': 'integer'},
                    'denied': {'type': 'integer'},
                    'targets': {'type': 'object', 'additionalProperties': {'type': 'integer'}},
                }},
            },
        },
    }  # fmt: skip
