"""An OTLP trace receiver for the tests, like a collector: HTTP/protobuf and gRPC, spans decoded.

    with Collector() as collector:
        telemetry.configure(collector.http_endpoint)
        ...; telemetry.flush()
        collector.spans()  # every span received, attributes as plain values
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    transport: str = ""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Collector:
    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.requests = 0
        # (path, headers) of every HTTP export: what a hosted backend would authenticate.
        self.http_requests: list[tuple[str, dict[str, str]]] = []

    def receive(self, payload: trace_service_pb2.ExportTraceServiceRequest, transport: str) -> None:
        received = []
        for resource_spans in payload.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), kind=span.kind,
                        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attributes={a.key: _value(a.value) for a in span.attributes}, resource=resource,
                        transport=transport))
        with self._lock:
            self.requests += 1
            self._spans.extend(received)

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if name is None or s.name == name]

    # -- transports ----------------------------------------------------------------------

    def __enter__(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with collector._lock:
                    collector.http_requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                # A backend may serve OTLP under a prefix of its own (Langfuse: /api/public/otel).
                if not self.path.endswith("/v1/traces") or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.receive(request, "http/protobuf")
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the generated name)
                collector.receive(request, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(grace=None)

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"
