"""
Broker spans (docs/tracing.md): a traced message's publish and deliveries, exported over OTLP/HTTP
to a real receiver, and nothing at all with tracing off.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context
from proton import Delivery, Message, symbol
from tests.support.amqpclient import connect, flush, receiver, sender, settle
from tests.support.otlpreceiver import OtlpReceiver, ReceivedSpan
from tests.support.processes import BrokerProcess

SPAN_KIND_SERVER = 2
SPAN_KIND_PRODUCER = 4


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def _env(otlp: OtlpReceiver, tracing: bool) -> dict[str, str]:
    return {
        'SHOAL_TRACING': 'true' if tracing else 'false',
        'OTEL_EXPORTER_OTLP_ENDPOINT': otlp.endpoint,
        'OTEL_BSP_SCHEDULE_DELAY': '100',  # ms: spans reach the receiver soon after they end
    }


def _traced_send(otlp: OtlpReceiver, url: str, address: str, body: str) -> tuple[str, str, Any]:
    """Send one message inside a producer span made with the SDK, its context injected as the
    ``traceparent`` application property (as the OpenTelemetry Java agent's JMS instrumentation
    does). Returns the trace id, the producer span's id and the provider."""
    provider = TracerProvider(resource=Resource.create({'service.name': 'test-producer'}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f'{otlp.endpoint}/v1/traces'))
    )
    tracer = provider.get_tracer('test')
    conn = connect(url)
    try:
        snd = sender(conn, address)
        with tracer.start_as_current_span(f'send {address}', kind=SpanKind.PRODUCER) as span:
            carrier: dict[str, str] = {}
            inject(carrier, set_span_in_context(span))
            snd.send(Message(body=body, durable=True, id='m-1', properties=carrier))
        context = span.get_span_context()
    finally:
        conn.close()
    provider.shutdown()
    return f'{context.trace_id:032x}', f'{context.span_id:016x}', provider


def _one(spans: list[ReceivedSpan], predicate: Callable[[ReceivedSpan], bool]) -> ReceivedSpan:
    found = [span for span in spans if predicate(span)]
    assert len(found) == 1, found
    return found[0]


def test_a_message_released_on_one_replica_and_accepted_on_another_has_one_trace(
    start_broker: Callable[..., BrokerProcess], otlp: OtlpReceiver, address: str
) -> None:
    a = start_broker(replica_id='trace-a', env=_env(otlp, True))
    b = start_broker(replica_id='trace-b', env=_env(otlp, True))
    trace_id, producer_span_id, _ = _traced_send(otlp, a.url, address, 'traced')

    on_b = connect(b.url)
    rcv = receiver(on_b, address, credit=1)
    first = rcv.receive(timeout=10)
    assert first.body == 'traced'
    assert first.properties['traceparent'].split('-')[1] == trace_id  # the bare message as sent
    assert first.annotations[symbol('x-opt-shoal-trace')].split('-')[1] == trace_id
    settle(rcv, Delivery.RELEASED)
    flush(on_b)
    rcv.close()
    on_b.close()

    on_a = connect(a.url)
    rcv = receiver(on_a, address, credit=1)
    second = rcv.receive(timeout=10)
    assert second.body == 'traced'
    rcv.accept()
    flush(on_a)
    on_a.close()

    def delivered_on_a() -> bool:
        spans = otlp.in_trace(trace_id)
        return any(
            s.attributes.get('shoal.replica') == 'trace-a'
            for s in spans
            if s.name.startswith('deliver')
        )

    # b's link may take the released message again before its detach arrives (proton's receiver
    # tops its credit up after each delivery); that copy is returned by the detach, so b
    # delivers it once or twice, then a once
    spans = otlp.wait_for(trace_id, 4)
    deadline = time.monotonic() + 20
    while not delivered_on_a() and time.monotonic() < deadline:
        time.sleep(0.05)
    spans = otlp.in_trace(trace_id)
    producer = _one(spans, lambda s: s.resource.get('service.name') == 'test-producer')
    assert producer.span_id == producer_span_id
    publish = _one(spans, lambda s: s.name == f'publish {address}')
    assert publish.parent_span_id == producer.span_id
    assert publish.kind == SPAN_KIND_SERVER
    assert publish.resource['service.instance.id'] == 'trace-a'
    assert publish.attributes['messaging.system'] == 'shoal'
    assert publish.attributes['messaging.operation.type'] == 'send'
    assert publish.attributes['messaging.destination.name'] == address
    assert publish.attributes['messaging.message.id'] == 'm-1'
    assert publish.attributes['shoal.replica'] == 'trace-a'
    assert publish.attributes['shoal.durable'] is True
    assert publish.end_ns > publish.start_ns  # it lasts until the store answered
    assert first.annotations[symbol('x-opt-shoal-trace')].split('-')[2] == publish.span_id

    deliveries = sorted(
        (s for s in spans if s.name == f'deliver {address}'), key=lambda s: s.start_ns
    )
    assert len(deliveries) in (2, 3), spans
    released, *again_on_b, accepted = deliveries
    assert [d.attributes['shoal.replica'] for d in again_on_b] in ([], ['trace-b']), spans
    for delivery in deliveries:
        assert delivery.parent_span_id == publish.span_id
        assert delivery.kind == SPAN_KIND_PRODUCER
        assert delivery.attributes['messaging.operation.type'] == 'receive'
        assert delivery.attributes['messaging.destination.name'] == address
        assert delivery.attributes['shoal.queue.wait_seconds'] >= 0
        assert delivery.attributes['shoal.consumer.link'].startswith('receiver-')
    assert released.attributes['shoal.replica'] == 'trace-b'
    assert released.resource['service.instance.id'] == 'trace-b'
    assert released.events == [
        ('settle', {'messaging.operation.type': 'settle', 'shoal.outcome': 'released'})
    ]
    assert accepted.attributes['shoal.replica'] == 'trace-a'
    assert accepted.events == [
        ('settle', {'messaging.operation.type': 'settle', 'shoal.outcome': 'accepted'})
    ]
    assert accepted.start_ns >= released.end_ns


def test_a_message_without_a_sampled_context_gets_no_span_and_no_annotation(
    start_broker: Callable[..., BrokerProcess], otlp: OtlpReceiver, address: str
) -> None:
    on = start_broker(replica_id='trace-on', env=_env(otlp, True))
    conn = connect(on.url)
    snd = sender(conn, address)
    unsampled = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00'
    snd.send(Message(body='not sampled', properties={'traceparent': unsampled}))
    snd.send(Message(body='no context'))
    snd.send(Message(body='malformed', properties={'traceparent': 'not-a-trace-context'}))
    snd.send(Message(body='odd annotation', annotations={symbol('x-opt-qpid-tracestate'): 7}))
    rcv = receiver(conn, address, credit=4)
    for body in ('not sampled', 'no context', 'malformed', 'odd annotation'):
        message = rcv.receive(timeout=10)
        assert message.body == body
        assert not message.annotations or 'x-opt-shoal-trace' not in message.annotations
        rcv.accept()
    flush(conn)
    # a sampled message last: once its publish span is in, any span of those before would be
    sampled = '00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
    snd.send(Message(body='sampled', properties={'traceparent': sampled}))
    conn.close()
    otlp.wait_for('1af7651916cd43dd8448eb211c80319c', 1)
    assert {s.trace_id for s in otlp.spans} == {'1af7651916cd43dd8448eb211c80319c'}


def test_with_tracing_off_nothing_is_exported_and_nothing_annotated(
    start_broker: Callable[..., BrokerProcess], otlp: OtlpReceiver, address: str
) -> None:
    off = start_broker(replica_id='trace-off', env=_env(otlp, False))
    trace_id, _, _ = _traced_send(otlp, off.url, address, 'untraced')
    conn = connect(off.url)
    rcv = receiver(conn, address, credit=1)
    message = rcv.receive(timeout=10)
    assert message.body == 'untraced'
    assert message.properties['traceparent'].split('-')[1] == trace_id
    assert not message.annotations or 'x-opt-shoal-trace' not in message.annotations
    rcv.accept()
    flush(conn)
    conn.close()
    assert [s.name for s in otlp.wait_for(trace_id, 1)] == [f'send {address}']
    # an absence: ten of the exporter's 0.1 s batch delays for a span that must not come
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert len(otlp.in_trace(trace_id)) == 1
        time.sleep(0.1)


def test_the_qpid_jms_annotation_carries_the_context_to_a_consumer_waiting_on_the_replica(
    start_broker: Callable[..., BrokerProcess], otlp: OtlpReceiver, address: str
) -> None:
    """Qpid JMS's tracing hook puts the propagator's fields in the message annotation
    ``x-opt-qpid-tracestate`` (a map); a consumer already waiting on the publishing replica is
    sent the message while Redis stores it (deliver-ahead) and gets a delivery span all the same."""
    broker = start_broker(replica_id='trace-qpid', env=_env(otlp, True))
    trace_id, parent_id = '4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7'
    context = {'traceparent': f'00-{trace_id}-{parent_id}-01'}
    conn = connect(broker.url)
    rcv = receiver(conn, address, credit=1)
    snd = sender(conn, address)
    snd.send(Message(body='qpid', annotations={symbol('x-opt-qpid-tracestate'): context}))
    message = rcv.receive(timeout=10)
    assert message.body == 'qpid'
    assert message.annotations[symbol('x-opt-qpid-tracestate')] == context  # kept as sent
    rcv.accept()
    flush(conn)
    conn.close()

    spans = otlp.wait_for(trace_id, 2)
    publish = _one(spans, lambda s: s.name == f'publish {address}')
    assert publish.parent_span_id == parent_id
    delivery = _one(spans, lambda s: s.name == f'deliver {address}')
    assert delivery.parent_span_id == publish.span_id
    assert delivery.events[0][1]['shoal.outcome'] == 'accepted'
