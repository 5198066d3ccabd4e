"""OpenTelemetry spans for CRI calls and the steps under them, sent over OTLP.

    with tracing.span("cni ADD bridge", **{"cni.plugin": "bridge"}):
        ...

Off (`[tracing] sampling_rate_per_million = 0`, the default) nothing here imports the
OpenTelemetry SDK, and `span()` hands out one shared no-op after a single attribute check:
no span object, no context read, on any call. On, spans nest through the contextvars
context (so across awaits and into `asyncio.to_thread`), a CRI call continues the W3C trace
context of its gRPC metadata, and log lines carry the active span's ids (a hook in
crishim.log, which sits below this module).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from crishim import log
from crishim.config import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.context import Context as OtelContext
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

logger = log.get_logger(__name__)

DEFAULT_ENDPOINTS = {"grpc": "127.0.0.1:4317", "http/protobuf": "http://127.0.0.1:4318/v1/traces"}
# The metadata keys of W3C trace context (gRPC metadata keys are lower case).
TRACE_KEYS = ("traceparent", "tracestate")

Attr = str | int | float | bool
T = TypeVar("T")


class Scope:
    """What `span()` gives while tracing is off: nothing recorded, nothing allocated."""

    __slots__ = ()
    recording = False

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def set(self, **attrs: object) -> None:
        """Add attributes to the span (None values are left out)."""

    def fail(self, message: str, **attrs: object) -> None:
        """Mark the span as failed, with `message`, where the error does not pass through
        the `with` (an error turned into a gRPC status)."""


NOOP = Scope()


def _clean(attrs: Mapping[str, object]) -> dict[str, Attr]:
    """Attributes as OpenTelemetry takes them: empty ones left out, others as text."""
    return {k: v if isinstance(v, Attr) else str(v) for k, v in attrs.items()
            if v is not None and v != ""}


class _Api:
    """The OpenTelemetry calls a span makes, imported once when tracing starts (an import
    statement run per span costs more than the rest of crishim's part of it)."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        self.attach, self.detach = context.attach, context.detach
        self.get_current = context.get_current
        self.set_span, self.current_span = trace.set_span_in_context, trace.get_current_span
        self.server, self.internal = trace.SpanKind.SERVER, trace.SpanKind.INTERNAL
        self.status, self.error = Status, StatusCode.ERROR
        self.propagator = TraceContextTextMapPropagator()


class _Live(Scope):
    """A span made current for the `with` block; an error leaving it is recorded."""

    __slots__ = ("_api", "_attrs", "_failed", "_kind", "_name", "_parent", "_span", "_token",
                 "_tracer")
    recording = True

    def __init__(self, tracer: Tracer, api: _Api, name: str, attrs: Mapping[str, object],
                 parent: OtelContext | None = None, server: bool = False) -> None:
        self._tracer, self._api, self._name, self._attrs = tracer, api, name, attrs
        self._parent, self._kind = parent, server
        self._span: Span | None = None
        self._token: object = None
        self._failed = False  # fail() said why; the error that follows is its consequence

    def __enter__(self) -> Scope:
        api = self._api
        span = self._tracer.start_span(self._name, context=self._parent,
                                       kind=api.server if self._kind else api.internal,
                                       attributes=_clean(self._attrs))
        self._span = span
        self._token = api.attach(api.set_span(span, self._parent))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        api, span = self._api, self._span
        assert span is not None
        try:
            if exc is not None and not self._failed and span.is_recording():
                span.record_exception(exc)
                span.set_status(api.status(api.error,
                                           f"{type(exc).__name__}: {exc}".rstrip(": ")))
            span.end()
        finally:
            api.detach(self._token)  # type: ignore[arg-type]

    def set(self, **attrs: object) -> None:
        if self._span is not None:
            self._span.set_attributes(_clean(attrs))

    def fail(self, message: str, **attrs: object) -> None:
        if self._span is not None:
            self._failed = True
            self._span.set_attributes(_clean(attrs))
            self._span.set_status(self._api.status(self._api.error, message))


class _State:
    __slots__ = ("api", "provider", "tracer")

    def __init__(self) -> None:
        self.tracer: Tracer | None = None
        self.provider: TracerProvider | None = None
        self.api: _Api | None = None


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def span(name: str, **attrs: object) -> Scope:
    """A child span of the current one for a `with` block; the no-op while off."""
    tracer = _state.tracer
    if tracer is None:
        return NOOP
    assert _state.api is not None
    return _Live(tracer, _state.api, name, attrs)


def carry() -> object | None:
    """The current trace context, for work that a call sets up and that runs after its
    reply (a streaming session opened with the URL the call handed out): `resumed()`
    continues it there. None while tracing is off."""
    api = _state.api
    return api.get_current() if api is not None and _state.tracer is not None else None


def resumed(parent: object | None, name: str, **attrs: object) -> Scope:
    """A span for a `with` block, the child of `parent` (from `carry()`) wherever it runs,
    sampled as `parent` was; the no-op while off or without `parent`."""
    tracer, api = _state.tracer, _state.api
    if tracer is None or api is None or parent is None:
        return NOOP
    return _Live(tracer, api, name, attrs, cast("OtelContext", parent))


def untraced(register: Callable[..., T], *args: Any) -> T:
    """`register(*args)` outside any span: for a callback registered during a call
    (`loop.add_reader`) that runs long after it, whose work is no part of that call's trace.
    A callback keeps the context it was registered in."""
    if _state.tracer is None:
        return register(*args)
    return contextvars.Context().run(register, *args)


class Call(Protocol):
    """A gRPC call's context, as both servers give it to a handler."""

    def invocation_metadata(self) -> Iterable[tuple[str, Any]] | None: ...


def server_span(name: str, call: Call, attrs: Callable[[Any], Mapping[str, object]],
                request: Any) -> Scope:
    """The span of a call whose caller may have sent W3C trace context (`traceparent`,
    `tracestate`) in its gRPC metadata: then it is that span's child, sampled as the
    caller decided. `call` and `attrs(request)` are only read while tracing is on."""
    tracer = _state.tracer
    if tracer is None:
        return NOOP
    carrier: dict[str, str] = {}
    for key, value in call.invocation_metadata() or ():
        if key in TRACE_KEYS:
            carrier[key] = value.decode("ascii", "replace") if isinstance(value, bytes) \
                else str(value)
    api = _state.api
    assert api is not None
    parent = api.propagator.extract(carrier) if carrier else None
    return _Live(tracer, api, name, attrs(request), parent, server=True)


def _ids() -> tuple[str, str] | None:
    api = _state.api
    if api is None:
        return None
    ctx = api.current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _exporter(cfg: TracingConfig) -> SpanExporter:
    endpoint = cfg.endpoint or DEFAULT_ENDPOINTS[cfg.protocol]
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=endpoint,
                                insecure=not endpoint.startswith("https://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HTTPSpanExporter,
    )
    return HTTPSpanExporter(endpoint=endpoint)


def setup(cfg: TracingConfig, exporter: SpanExporter | None = None) -> None:
    """Start tracing as `cfg` says (nothing when its rate is 0); `exporter` replaces the
    OTLP one (tests)."""
    if cfg.sampling_rate_per_million == 0:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from crishim.observe.sampling import PerMillion

    provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}),
                              sampler=PerMillion(cfg.sampling_rate_per_million))
    # A batch is never larger than the queue (the SDK refuses that: its default is 512).
    batch = cfg.max_queue_size if cfg.max_queue_size < 512 else None
    provider.add_span_processor(BatchSpanProcessor(
        exporter or _exporter(cfg), max_queue_size=cfg.max_queue_size,
        max_export_batch_size=batch))
    _state.provider = provider
    _state.api = _Api()
    _state.tracer = provider.get_tracer("crishim")
    log.set_trace_ids(_ids)
    logger.info("tracing on", protocol=cfg.protocol,
                endpoint=cfg.endpoint or DEFAULT_ENDPOINTS[cfg.protocol],
                sampling_rate_per_million=cfg.sampling_rate_per_million,
                service_name=cfg.service_name, max_queue_size=cfg.max_queue_size)


def flush(timeout_ms: int = 30_000) -> bool:
    """Send the spans ended so far (blocks: call from a thread)."""
    provider = _state.provider
    return provider is None or provider.force_flush(timeout_ms)


def shutdown() -> None:
    """Send what is left and stop (blocks: call from a thread)."""
    provider = _state.provider
    _state.tracer = _state.provider = None
    log.set_trace_ids(None)
    if provider is not None:
        provider.shutdown()
