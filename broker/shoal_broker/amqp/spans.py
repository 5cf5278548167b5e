"""
Where a message's trace context is found and kept, for the broker's spans (``tracing/``).

Only built with tracing on (``Broker``); producing and consuming call it behind one ``is not
None`` check each, so tracing off costs a message one attribute test and decodes nothing.

A producer's context is W3C trace context, in the application property ``traceparent`` (and
``tracestate``), as the OpenTelemetry Java agent's JMS instrumentation sets it, or in the message
annotation ``x-opt-qpid-tracestate``, a map of the propagator's fields, as Qpid JMS's tracing hook
(``JmsTracer``) and Qpid Proton's OpenTelemetry tracing set it. A sampled message is stored with
its publish span's ``traceparent`` in the annotation ``x-opt-shoal-trace``, so that whichever
replica delivers it can make its delivery spans children of that span: the bare message stays as
sent (AMQP 1.0 §3.2), only the annotations section is re-encoded, and only for sampled messages.
"""

import logging
from typing import Any, Final

from shoal_broker.amqp import codec, recode
from shoal_broker.amqp.links import ConsumerLink, PendingMessage, ProducerLink
from shoal_broker.routing.storage import Entry, OutgoingMessage
from shoal_broker.settings import AddressKind
from shoal_broker.tracing import Tracing

logger = logging.getLogger(__name__)

QPID_ANNOTATION: Final = 'x-opt-qpid-tracestate'
TRACE_ANNOTATION: Final = 'x-opt-shoal-trace'
_PROPERTY_MARK: Final = b'traceparent'
_PARENT_KEY: Final = b'\xa1\x0btraceparent\xa1'
_STATE_KEY: Final = b'\xa1\x0atracestate\xa1'
"""The two keys as str8, followed by a str8 value's constructor: the length comes next."""
_STORED_MARK: Final = recode.encode_symbol(TRACE_ANNOTATION) + b'\xa1'
"""How ``recode.with_annotations`` writes the annotation: its key, then a short string."""
MAX_OPEN_SPANS: Final = 10_000
"""Spans waiting for a store's answer or a consumer's outcome, at most; beyond, the oldest ends
unanswered (a message handed over without the store, a link gone with its deliveries)."""


class Spans:
    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._publishing: dict[int, tuple[PendingMessage, Any]] = {}
        self._delivering: dict[int, tuple[Entry, Any]] = {}

    # -- publish -----------------------------------------------------------------------------

    def published(
        self,
        producer: ProducerLink,
        message: PendingMessage,
        stored: OutgoingMessage,
        address: str,
        kind: AddressKind,
    ) -> OutgoingMessage:
        """A message about to be stored: with a sampled context, its publish span starts and the
        message to store carries the span's context. A failure here costs the span, never the
        message: it is logged and the message stored as received."""
        try:
            return self._published(producer, message, stored, address, kind)
        except Exception:
            logger.exception('tracing a publish to %s failed', address)
            return stored

    def _published(
        self,
        producer: ProducerLink,
        message: PendingMessage,
        stored: OutgoingMessage,
        address: str,
        kind: AddressKind,
    ) -> OutgoingMessage:
        view = message.view
        carrier = _carrier(view)
        if carrier is None or not self.tracing.wanted(carrier['traceparent']):
            return stored
        attributes: dict[str, str | int | float | bool] = {
            'shoal.address.kind': kind.value,
            'shoal.durable': view.header.durable,
            'shoal.priority': view.header.priority,
            'shoal.transactional': message.transaction is not None,
            'messaging.client.id': producer.conn.container_id or '',
            'shoal.producer.link': producer.name,
        }
        span = self.tracing.publish_span(carrier, address, attributes)
        if span is None:  # not sampled: nothing more decoded
            return stored
        properties = codec.selection_view(view.header_bytes, view.rest).properties
        if properties and properties[0] is not None:
            span.set_attribute('messaging.message.id', str(properties[0]))
        if len(properties) > 5 and properties[5] is not None:
            span.set_attribute('messaging.message.conversation_id', str(properties[5]))
        context = {TRACE_ANNOTATION: self.tracing.traceparent(span)}
        rest = recode.with_annotations(stored.rest, context)
        if message.transaction is not None:  # stored at discharge: the span covers the send
            self.tracing.stored(span, None)
        else:
            _remember(self._publishing, id(message), (message, span))
        traced = OutgoingMessage(stored.band, stored.header, rest, stored.expiry_ms, stored.origin)
        traced.group = stored.group
        return traced

    def stored(self, batch: list[tuple[Any, PendingMessage, str]], error: str | None) -> None:
        """The store answered for ``batch`` (``Producing._stored``): their publish spans end."""
        if not self._publishing:
            return
        for _, message, _ in batch:
            found = self._publishing.pop(id(message), None)
            if found is not None and found[0] is message:
                self.tracing.stored(found[1], error)

    # -- deliveries --------------------------------------------------------------------------

    def sent(self, consumer: ConsumerLink, entries: list[Entry]) -> None:
        """Entries went out on ``consumer``'s link: a delivery span for each traced one."""
        try:
            self._sent(consumer, entries)
        except Exception:
            logger.exception('tracing a delivery on %s failed', consumer.address)

    def _sent(self, consumer: ConsumerLink, entries: list[Entry]) -> None:
        for entry in entries:
            rest = entry.rest
            at = rest.find(_STORED_MARK)
            if at < 0:
                continue
            start = at + len(_STORED_MARK) + 1
            traceparent = rest[start : start + rest[start - 1]].decode('ascii', 'replace')
            attributes: dict[str, str | int | float | bool] = {
                'shoal.consumer.link': consumer.name,
                'messaging.client.id': consumer.conn.container_id or '',
                'shoal.entry.id': entry.id,
                'shoal.delivery_count': entry.delivery_count,
                'shoal.presettled': consumer.presettled,
            }
            if consumer.group:
                attributes['messaging.consumer.group.name'] = consumer.group
            appended_ms = int(entry.id.partition('-')[0] or 0)  # stream ids start with their ms
            span = self.tracing.delivery_span(
                traceparent, consumer.address, appended_ms, attributes
            )
            if span is None:
                continue
            if consumer.presettled:
                self.tracing.settled(span, 'settled-on-send')
            else:
                _remember(self._delivering, id(entry), (entry, span))

    def settled(self, entries: list[Entry], outcome: str) -> None:
        """A consumer decided ``outcome`` for ``entries``: their delivery spans end."""
        if not self._delivering:
            return
        for entry in entries:
            found = self._delivering.pop(id(entry), None)
            if found is not None and found[0] is entry:
                self.tracing.settled(found[1], outcome)

    def close(self) -> None:
        """End what is still open, and export it."""
        for table in (self._publishing, self._delivering):
            for _, span in table.values():
                span.set_attribute('shoal.unanswered', True)
                span.end()
            table.clear()
        self.tracing.shutdown()


def _carrier(view: codec.RoutingView) -> dict[str, str] | None:
    """The producer's W3C trace context fields, or None when the message has none."""
    annotated = view.annotations.get(QPID_ANNOTATION)
    if isinstance(annotated, dict) and 'traceparent' in annotated:
        return {str(k): str(v) for k, v in annotated.items() if isinstance(v, str)}
    if _PROPERTY_MARK not in view.rest:  # one scan of the bytes before decoding anything
        return None
    return _property_carrier(view.rest)


def _property_carrier(rest: bytes) -> dict[str, str] | None:
    """``traceparent`` and ``tracestate`` from the application-properties section. The sections
    before it are skipped by their encoded width; within it the two short string keys are found
    as bytes, as encoders write them (str8 key, str8 value), and any other encoding is decoded:
    decoding every map cost ~2 times a whole message's parse."""
    pos = 0
    while pos < len(rest):
        code, value_at = codec.section_code(rest, pos)
        end = codec.skip(rest, value_at)
        if code == codec.APPLICATION_PROPERTIES:
            at = rest.find(_PARENT_KEY, value_at, end)
            if at < 0:
                return _decoded_carrier(rest, value_at)
            carrier = {'traceparent': _short_string(rest, at + len(_PARENT_KEY))}
            at = rest.find(_STATE_KEY, value_at, end)
            if at >= 0:
                carrier['tracestate'] = _short_string(rest, at + len(_STATE_KEY))
            return carrier
        if code > codec.APPLICATION_PROPERTIES:
            break
        pos = end
    return None


def _short_string(buf: bytes, at: int) -> str:
    return buf[at + 1 : at + 1 + buf[at]].decode('utf-8', 'replace')


def _decoded_carrier(rest: bytes, value_at: int) -> dict[str, str] | None:
    application = codec.decode(rest, value_at)[0]
    if not isinstance(application, dict):
        return None
    traceparent = application.get('traceparent')
    if not isinstance(traceparent, str):
        return None
    carrier = {'traceparent': traceparent}
    if isinstance(state := application.get('tracestate'), str):
        carrier['tracestate'] = state
    return carrier


def _remember(table: dict[int, Any], key: int, value: Any) -> None:
    if len(table) >= MAX_OPEN_SPANS:
        _, span = table.pop(next(iter(table)))
        span.set_attribute('shoal.unanswered', True)
        span.end()
    table[key] = value
