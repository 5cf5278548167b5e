"""
The broker's own spans, recorded with the OpenTelemetry SDK and exported over OTLP/HTTP.

Knows nothing of AMQP: ``amqp/spans.py`` finds the trace contexts in messages and calls here with
plain strings and attributes. OpenTelemetry is imported by ``start`` alone, so a broker with
tracing off (the default) neither needs the ``tracing`` extra nor pays for its import.

Spans follow the OpenTelemetry messaging semantic conventions 1.27.0 (``SEMCONV``): a publish
span (``send``) for each traced message a replica stores, child of the producer's span, and a
delivery span (``receive``) for each time a replica sends it to a consumer, child of the publish
span, ended by the consumer's outcome (a ``settle`` event). Sampling is parent-based: a message
whose producer did not sample its span, or that carries no context, gets no span; of the others
a trace-id ratio (``TracingSettings.sample_ratio``) is kept, the same on every replica.
"""

import time
from collections.abc import Mapping
from typing import Any, Final

from shoal_broker.settings import TracingSettings

SEMCONV: Final = '1.27.0'
"""The messaging semantic conventions the attributes follow (docs/tracing.md)."""
SYSTEM: Final = 'shoal'
"""``messaging.system``: not one of the conventions' well-known values, which name other
brokers."""

Attributes = Mapping[str, str | int | float | bool]


class Tracing:
    """A tracer provider with its exporter and sampler, for one replica. Spans are the SDK's
    objects, passed around as ``Any``: callers only hand them back."""

    def __init__(self, settings: TracingSettings, replica: str) -> None:
        # imported here, not at the top: the broker runs without the tracing extra when it is off
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        ratio = TraceIdRatioBased(settings.sample_ratio)
        sampler = ParentBased(
            root=ALWAYS_OFF,  # no context, no span: nothing to link the broker's spans to
            remote_parent_sampled=ratio,
            remote_parent_not_sampled=ALWAYS_OFF,
        )
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override these (Resource.create)
        resource = Resource.create({'service.name': 'shoal-broker', 'service.instance.id': replica})
        self._bound = TraceIdRatioBased.get_bound_for_rate(settings.sample_ratio)
        self.provider = TracerProvider(sampler=sampler, resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer('shoal_broker', schema_url=_SCHEMA_URL)
        self.propagator = TraceContextTextMapPropagator()
        self.replica = replica
        self._trace = trace

    def wanted(self, traceparent: str) -> bool:
        """Whether the sampler would keep a message with this ``traceparent``, read from the
        string: the SDK's decision costs ~10 times as much, and most messages are dropped at a
        low ratio. The same rule as ``TraceIdRatioBased`` (the trace id's low 64 bits under the
        ratio's bound), so the SDK, deciding again, agrees; a malformed context is the SDK's to
        refuse."""
        if len(traceparent) != 55 or traceparent[54] not in '13579bdf':  # flags: sampled bit
            return False
        try:
            return int(traceparent[19:35], 16) < self._bound
        except ValueError:
            return False

    def publish_span(self, carrier: Mapping[str, str], address: str, attributes: Attributes) -> Any:
        """Start the span of a message's publish, child of the producer's context in
        ``carrier`` (``traceparent``, ``tracestate``); None when the message is not sampled."""
        parent = self.propagator.extract(carrier)
        span = self.tracer.start_span(
            f'publish {address}',
            context=parent,
            kind=self._trace.SpanKind.SERVER,
            attributes={
                'messaging.system': SYSTEM,
                'messaging.operation.type': 'send',
                'messaging.operation.name': 'publish',
                'messaging.destination.name': address,
                'shoal.replica': self.replica,
                **attributes,
            },
        )
        return span if span.is_recording() else None

    def traceparent(self, span: Any) -> str:
        """The W3C ``traceparent`` of ``span``, to carry with the stored message."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, self._trace.set_span_in_context(span))
        return carrier['traceparent']

    def stored(self, span: Any, error: str | None) -> None:
        """The store answered the publish: its span ends, with the error if it failed."""
        if error is not None:
            span.set_status(self._trace.StatusCode.ERROR, error)
            span.set_attribute('error.type', error)
        span.end()

    def delivery_span(
        self, traceparent: str, address: str, appended_ms: int, attributes: Attributes
    ) -> Any:
        """Start the span of one delivery of a message whose publish span is ``traceparent``;
        ``appended_ms`` is when the store took it, for the time it waited."""
        parent = self.propagator.extract({'traceparent': traceparent})
        now = time.time()
        span = self.tracer.start_span(
            f'deliver {address}',
            context=parent,
            kind=self._trace.SpanKind.PRODUCER,
            attributes={
                'messaging.system': SYSTEM,
                'messaging.operation.type': 'receive',
                'messaging.operation.name': 'deliver',
                'messaging.destination.name': address,
                'shoal.replica': self.replica,
                'shoal.queue.wait_seconds': max(0.0, now - appended_ms / 1000)
                if appended_ms
                else 0.0,
                **attributes,
            },
        )
        return span if span.is_recording() else None

    def settled(self, span: Any, outcome: str) -> None:
        """The consumer's outcome for a delivery: an event on its span, which ends."""
        span.add_event('settle', {'messaging.operation.type': 'settle', 'shoal.outcome': outcome})
        span.set_attribute('shoal.outcome', outcome)
        span.end()

    def shutdown(self) -> None:
        """Export what is still buffered (bounded by the SDK's export timeout)."""
        self.provider.shutdown()


_SCHEMA_URL: Final = f'https://opentelemetry.io/schemas/{SEMCONV}'


def start(settings: TracingSettings, replica: str) -> Tracing | None:
    """The replica's tracing, or None when it is off: callers check that one value."""
    return Tracing(settings, replica) if settings.enabled else None
