"""
The identifiers a selector sees for one AMQP message: JMS header names and message properties.

Exists to put the JMS-to-AMQP mapping that Qpid JMS applies on the client (jms-amqp-facts §5.5
to §5.7) in one place, so that a selector on the broker sees the same values the application
would read from ``Message.getJMSxxx()`` and ``getObjectProperty``. Pure: it takes the decoded
sections as plain Python values and returns a dict.

Choices:

* JMSMessageID uses Qpid JMS's ``toMessageIdString``: a string starting with ``ID:`` as it is,
  another string as ``ID:AMQP_NO_PREFIX:<s>``, a uuid as ``ID:AMQP_UUID:<uuid>``, an integer
  (ulong) as ``ID:AMQP_ULONG:<n>``, a binary as ``ID:AMQP_BINARY:<HEX>``; an ``ID:`` string
  whose rest already starts with one of those type prefixes is escaped as
  ``ID:AMQP_STRING:<s>``, so that it cannot be mistaken for another type.
* JMSCorrelationID uses ``toCorrelationIdString``: the same, except that a string without
  ``ID:`` stays as it is (an application correlation string, not a message id). This is what
  ``Message.getJMSCorrelationID()`` returns in Qpid JMS, so ``JMSCorrelationID = 'abc'``
  matches a correlation-id set with ``setJMSCorrelationID("abc")``.
* JMSTimestamp, JMSType, JMSXGroupID, JMSXGroupSeq, JMSXUserID and the ids are absent (NULL)
  when the AMQP field is absent; JMSExpiration is 0 when absent; JMSPriority is 4, JMSDeliveryMode
  NON_PERSISTENT and JMSXDeliveryCount 1 when the header is absent (facts §5.5).
* Application properties appear under their (string) keys; message annotations appear under
  ``m.<key>`` as in ActiveMQ Artemis (write ``"m.x-opt-foo"`` in a selector: a quoted
  identifier). Precedence, highest first: JMS header names, annotations, application properties.
"""

import datetime
import uuid
from collections.abc import Mapping, Sequence
from typing import TypeGuard

_TYPE_PREFIXES = ('AMQP_BINARY:', 'AMQP_UUID:', 'AMQP_ULONG:', 'AMQP_STRING:', 'AMQP_NO_PREFIX:')

# Positions in the AMQP properties list (AMQP 1.0 §3.2.4).
_MESSAGE_ID, _USER_ID, _CORRELATION_ID = 0, 1, 5
_SUBJECT, _ABSOLUTE_EXPIRY_TIME, _CREATION_TIME, _GROUP_ID, _GROUP_SEQUENCE = 3, 8, 9, 10, 11

ANNOTATION_PREFIX = 'm.'


def identifiers(
    header: Mapping[str, object],
    properties: Sequence[object] | None,
    application_properties: Mapping[object, object] | None,
    annotations: Mapping[object, object] | None,
) -> dict[str, object]:
    """Every identifier a selector can name for this message (absent ones are left out)."""
    ids: dict[str, object] = {}
    for key, value in (application_properties or {}).items():
        if isinstance(key, str):
            ids[key] = value
    for key, value in (annotations or {}).items():
        if isinstance(key, str):
            ids[ANNOTATION_PREFIX + key] = value
    ids.update(_header_fields(header))
    ids.update(_property_fields(list(properties or ())))
    return ids


def _header_fields(header: Mapping[str, object]) -> dict[str, object]:
    priority = header.get('priority')
    delivery_count = header.get('delivery_count')
    return {
        'JMSDeliveryMode': 'PERSISTENT' if header.get('durable') is True else 'NON_PERSISTENT',
        'JMSPriority': int(priority) if _is_int(priority) else 4,
        'JMSXDeliveryCount': (int(delivery_count) if _is_int(delivery_count) else 0) + 1,
    }


def _property_fields(fields: list[object]) -> dict[str, object]:
    fields = fields + [None] * (13 - len(fields))
    found: dict[str, object] = {
        'JMSMessageID': message_id_string(fields[_MESSAGE_ID]),
        'JMSCorrelationID': correlation_id_string(fields[_CORRELATION_ID]),
        'JMSTimestamp': _millis(fields[_CREATION_TIME]),
        'JMSType': fields[_SUBJECT],
        'JMSXGroupID': fields[_GROUP_ID],
        'JMSXGroupSeq': fields[_GROUP_SEQUENCE],
        'JMSXUserID': _user_id(fields[_USER_ID]),
    }
    ids = {name: value for name, value in found.items() if value is not None}
    expiry = _millis(fields[_ABSOLUTE_EXPIRY_TIME])
    ids['JMSExpiration'] = 0 if expiry is None else expiry
    return ids


def message_id_string(value: object) -> str | None:
    """JMSMessageID for an AMQP message-id (Qpid JMS ``AmqpMessageIdHelper.toMessageIdString``)."""
    if isinstance(value, str) and not value.startswith('ID:'):
        return 'ID:AMQP_NO_PREFIX:' + value
    return correlation_id_string(value)


def correlation_id_string(value: object) -> str | None:
    """JMSCorrelationID for an AMQP correlation-id (``toCorrelationIdString``)."""
    if isinstance(value, str):
        if value.startswith('ID:') and value[3:].startswith(_TYPE_PREFIXES):
            return 'ID:AMQP_STRING:' + value
        return str(value)
    if isinstance(value, uuid.UUID):
        return f'ID:AMQP_UUID:{value}'
    if _is_int(value):
        return f'ID:AMQP_ULONG:{int(value)}'
    if isinstance(value, (bytes, bytearray, memoryview)):
        return 'ID:AMQP_BINARY:' + bytes(value).hex().upper()
    return None


def _user_id(value: object) -> object:
    """JMSXUserID: the user-id bytes as UTF-8 text; bytes that are not UTF-8 stay bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if not raw:
            return None
        try:
            return raw.decode('utf-8')
        except UnicodeDecodeError:
            return raw
    return value


def _millis(value: object) -> int | None:
    """An AMQP timestamp (milliseconds since the epoch) as an int; a datetime is converted."""
    if _is_int(value):
        return int(value)
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    return None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
