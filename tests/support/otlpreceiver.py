"""
An OTLP/HTTP trace receiver on loopback, for the tracing tests.

The OpenTelemetry Collector is a Go binary, not on PyPI: this takes its place for traces. It
accepts ``POST /v1/traces`` (protobuf ``ExportTraceServiceRequest``, gzip or not, as the SDK's
OTLP/HTTP exporter sends it), decodes it with the opentelemetry-proto package and keeps every
span with its resource's attributes.
"""

import dataclasses
import gzip
import http.server
import threading
import time
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from tests.support.processes import LOOPBACK


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    start_ns: int
    end_ns: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof('value')
    return None if which is None else getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get('Content-Length', '0')))
                if self.headers.get('Content-Encoding') == 'gzip':
                    body = gzip.decompress(body)
                if self.path != '/v1/traces':
                    self.send_error(404)
                    return
                receiver._keep(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header('Content-Type', 'application/x-protobuf')
                self.send_header('Content-Length', str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.endpoint = f'http://{LOOPBACK}:{self.server.server_address[1]}'
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.kind,
                            _attributes(span.attributes),
                            resource,
                            [(e.name, _attributes(e.attributes)) for e in span.events],
                            [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(found)

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(self, trace_id: str, count: int, timeout: float = 20.0) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once at least ``count`` arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.in_trace(trace_id)
            if len(spans) >= count:
                return spans
            time.sleep(0.05)
        raise AssertionError(f'{count} spans of trace {trace_id} not received: {self.spans}')

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
