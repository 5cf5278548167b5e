"""
A stored message as JSON for the message browser: header, properties, application
properties, annotations and a body preview, decoded with the broker's own AMQP codec.

The stored bytes are never changed here; a section that does not decode is shown as an error
field rather than failing the page.
"""

import base64
import math
import uuid
from typing import Any

from shoal_broker import selector as selectors
from shoal_broker.amqp import codec
from shoal_broker.store.management import StoredMessage

PREVIEW_BYTES = 256
"""A body preview holds at most this many bytes (or characters) of the body."""

PROPERTY_NAMES = (
    'message-id', 'user-id', 'to', 'subject', 'reply-to', 'correlation-id', 'content-type',
    'content-encoding', 'absolute-expiry-time', 'creation-time', 'group-id', 'group-sequence',
    'reply-to-group-id',
)  # fmt: skip
"""The properties section's fields, in order (AMQP 1.0 §3.2.4)."""


def jsonable(value: Any) -> Any:
    """An AMQP value as JSON: binary as ``{"binary": base64}``, described values as
    ``{"descriptor", "value"}``, map keys as strings."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes | bytearray):
        return {'binary': base64.b64encode(bytes(value)).decode()}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, codec.Described):
        return {'descriptor': jsonable(value.descriptor), 'value': jsonable(value.value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


def sections(m: StoredMessage) -> dict[int, Any]:
    """The decoded sections of the stored rest (annotations, properties, application
    properties, body); DecodeError when they do not decode."""
    found: dict[int, Any] = {}
    pos = 0
    body: list[Any] = []
    while pos < len(m.rest):
        code, vpos = codec.section_code(m.rest, pos)
        value, pos = codec.decode(m.rest, vpos)
        if code in (codec.DATA, codec.AMQP_SEQUENCE):
            body.append(value)
        else:
            found[code] = value
    if body:
        found[codec.DATA if isinstance(body[0], bytes) else codec.AMQP_SEQUENCE] = body
    return found


def header_of(m: StoredMessage) -> codec.Header:
    if not m.header:
        return codec.DEFAULT_HEADER
    _, vpos = codec.section_code(m.header, 0)
    return codec.header_from_fields(codec.decode(m.header, vpos)[0])


def preview(found: dict[int, Any]) -> dict[str, Any]:
    """The body's kind, size and first ``PREVIEW_BYTES``: text when it is UTF-8."""
    if codec.AMQP_VALUE in found:
        value = found[codec.AMQP_VALUE]
        if isinstance(value, str):
            return {'kind': 'text', 'size': len(value), 'text': value[:PREVIEW_BYTES]}
        text = str(jsonable(value))
        return {'kind': 'value', 'size': len(text), 'text': text[:PREVIEW_BYTES]}
    if codec.DATA in found:
        data = b''.join(bytes(part) for part in found[codec.DATA])
        head = data[:PREVIEW_BYTES]
        try:
            return {'kind': 'data', 'size': len(data), 'text': head.decode()}
        except UnicodeDecodeError:
            return {
                'kind': 'data', 'size': len(data), 'base64': base64.b64encode(head).decode()
            }  # fmt: skip
    if codec.AMQP_SEQUENCE in found:
        text = str(jsonable(found[codec.AMQP_SEQUENCE]))
        return {'kind': 'sequence', 'size': len(text), 'text': text[:PREVIEW_BYTES]}
    return {'kind': 'none', 'size': 0}


def view(m: StoredMessage) -> dict[str, Any]:
    """The message browser's JSON of one stored message."""
    shown: dict[str, Any] = {
        'id': m.id, 'state': m.state, 'enqueued_ms': int(m.entry_id.partition('-')[0]),
        'expiry_ms': m.expiry_ms or None,
    }  # fmt: skip
    try:
        header = header_of(m)
        found = sections(m)
    except codec.DecodeError as exc:
        shown['error'] = f'the stored message does not decode: {exc}'
        return shown
    properties = found.get(codec.PROPERTIES)
    properties = properties if isinstance(properties, list) else []
    shown.update(
        header={
            'durable': header.durable, 'priority': header.priority, 'ttl': header.ttl,
            'first_acquirer': header.first_acquirer, 'delivery_count': header.delivery_count,
        },
        properties={
            name: jsonable(value)
            for name, value in zip(PROPERTY_NAMES, properties, strict=False)
            if value is not None
        },
        application_properties=jsonable(found.get(codec.APPLICATION_PROPERTIES) or {}),
        annotations=jsonable(found.get(codec.MESSAGE_ANNOTATIONS) or {}),
        body=preview(found),
    )  # fmt: skip
    return shown


def identifiers(m: StoredMessage) -> dict[str, object]:
    """What a JMS selector sees of the message (every identifier unknown when it does not
    decode, as for a consumer's selector)."""
    try:
        s = codec.selection_view(m.header, m.rest)
    except codec.DecodeError:
        return {}
    return selectors.identifiers(s.header, s.properties, s.application_properties, s.annotations)


def annotation(m: StoredMessage, name: str) -> str | None:
    """A string message annotation of the stored message, or None."""
    try:
        found = codec.selection_view(m.header, m.rest).annotations
    except codec.DecodeError:
        return None
    value = found.get(codec.Symbol(name), found.get(name))
    return value if isinstance(value, str) else None
