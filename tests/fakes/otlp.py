"""An OTLP trace receiver for tests: the collector's TraceService/Export over gRPC, and
OTLP/HTTP's POST /v1/traces, on loopback ports; it keeps every span it is sent.

    with Receiver() as rx:
        ...  # point crishim's [tracing] endpoint at rx.grpc_endpoint or rx.http_endpoint
        spans = rx.wait(lambda spans: ..., timeout=30)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tsvc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsvc_grpc
from opentelemetry.proto.common.v1 import common_pb2


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    service: str = ""
    kind: int = 0
    events: tuple[str, ...] = ()

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


def _spans(req: tsvc.ExportTraceServiceRequest) -> list[Span]:
    out: list[Span] = []
    for rs in req.resource_spans:
        service = next((_value(a.value) for a in rs.resource.attributes
                        if a.key == "service.name"), "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(Span(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(), start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    status_code=s.status.code, status_message=s.status.message,
                    service=str(service), kind=s.kind,
                    events=tuple(e.name for e in s.events)))
    return out


class Receiver:
    """Both OTLP transports on 127.0.0.1; `spans` is everything received so far."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._spans: list[Span] = []
        self.requests = {"grpc": 0, "http": 0}
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        tsvc_grpc.add_TraceServiceServicer_to_server(_Service(self), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(self))
        self.http_port = self._http.server_address[1]
        self._http_thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    def __enter__(self) -> Receiver:
        self._grpc.start()
        self._http_thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grpc.stop(grace=None)
        self._http.shutdown()
        self._http.server_close()

    def add(self, transport: str, req: tsvc.ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests[transport] += 1
            self._spans.extend(_spans(req))
            self._lock.notify_all()

    @property
    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def wait(self, done: Callable[[list[Span]], bool], timeout: float = 60.0) -> list[Span]:
        """The spans once `done(spans)` holds; AssertionError with what came, at the
        deadline."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self._spans})
                    raise AssertionError(f"spans not received in {timeout}s; have {names}")
                self._lock.wait(left)
            return list(self._spans)


class _Service(tsvc_grpc.TraceServiceServicer):
    def __init__(self, rx: Receiver) -> None:
        self._rx = rx

    def Export(self, request: tsvc.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> tsvc.ExportTraceServiceResponse:
        self._rx.add("grpc", request)
        return tsvc.ExportTraceServiceResponse()


def _http_handler(rx: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces" or \
                    self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            rx.add("http", tsvc.ExportTraceServiceRequest.FromString(body))
            reply = tsvc.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def tree(spans: list[Span], root: Span) -> str:
    """`root` and its descendants as an indented outline with durations."""
    lines: list[str] = []

    def walk(s: Span, depth: int) -> None:
        lines.append(f"{'  ' * depth}{s.name}  {s.ms:.1f} ms")
        for child in sorted((c for c in spans if c.parent_id == s.span_id),
                            key=lambda c: c.start_ns):
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)
