"""Shared servicer machinery: error mapping, metrics and UNIMPLEMENTED stubs.

A servicer class names its gRPC service in `SERVICE`. When the class is created every RPC
of that service is wrapped so that domain errors (crishim.errors) become the right gRPC
status in exactly one place, and every RPC the class does not implement answers
UNIMPLEMENTED with a message that names it (never a fake success).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import grpc
from google.protobuf.message import Message

from crishim.api.runtime.v1 import api_pb2
from crishim.errors import CrishimError, Kind
from crishim.log import get_logger
from crishim.observe import tracing
from crishim.observe.metrics import observe_rpc
from crishim.rpc.method import Answer

log = get_logger("crishim.cri")

Context = grpc.aio.ServicerContext[Any, Any]

# Calls a kubelet makes for objects that may well be gone already: their NotFound is an
# answer, not a failure worth a warning.
_IDEMPOTENT = frozenset({
    "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox",
    "ContainerStatus", "PodSandboxStatus", "ContainerStats", "PodSandboxStats",
    "RemoveImage", "ImageStatus", "ReopenContainerLog"})
# Request fields that name the object a call is about, as they appear in its log line.
_ID_FIELDS = (("pod_sandbox_id", "pod"), ("container_id", "container"))


def _ids(request: Any) -> dict[str, str]:
    return _message_ids(request) if isinstance(request, Message) else {}


def _message_ids(request: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    fields = request.DESCRIPTOR.fields_by_name
    for field, key in _ID_FIELDS:
        if field in fields and getattr(request, field):
            out[key] = getattr(request, field)
    if "config" in fields and request.HasField("config") \
            and "metadata" in request.config.DESCRIPTOR.fields_by_name:
        out["name"] = request.config.metadata.name
    return out


# Request fields that a call's span carries, by the attribute they become: (path, attribute).
_SPAN_FIELDS = (
    (("pod_sandbox_id",), "cri.pod_sandbox_id"),
    (("container_id",), "cri.container_id"),
    (("runtime_handler",), "cri.runtime_handler"),
    (("image", "image"), "cri.image"),
    (("config", "image", "image"), "cri.image"),
    (("config", "metadata", "name"), "cri.name"),
    (("config", "metadata", "namespace"), "cri.namespace"),
    (("sandbox_config", "metadata", "name"), "cri.pod_name"),
    (("sandbox_config", "metadata", "namespace"), "cri.namespace"),
)


def _field(message: Message, path: tuple[str, ...]) -> str:
    value: Any = message
    for name in path:
        if not isinstance(value, Message) or name not in value.DESCRIPTOR.fields_by_name:
            return ""
        value = getattr(value, name)
    return value if isinstance(value, str) else ""


def span_attributes(message: Any) -> dict[str, str]:
    """What a request (or a reply) says about the objects a call is about, as span
    attributes; only computed while tracing is on."""
    if not isinstance(message, Message):
        return {}
    out: dict[str, str] = {}
    for path, key in _SPAN_FIELDS:
        value = _field(message, path)
        if value:
            out[key] = value
    return out


# The one place a domain error's kind becomes a gRPC status (kinds are named as codes).
STATUS: dict[Kind, grpc.StatusCode] = {kind: grpc.StatusCode[kind.name] for kind in Kind}


def _fail(exc: BaseException, name: str, request: Any) -> tuple[grpc.StatusCode, str]:
    """The status for `exc`, logged once: a warning for a client's mistake or a refusal
    (no traceback), debug for an expected NotFound, an error with its traceback for a
    bug (INTERNAL)."""
    if isinstance(exc, CrishimError):
        code, message = STATUS[exc.code], str(exc)
        kv = {"method": name, **_ids(request), "code": code.name, "error": message}
        if code == grpc.StatusCode.NOT_FOUND and name in _IDEMPOTENT:
            log.debug("call failed", **kv)
        else:
            log.warning("call failed", **kv)
        return code, message
    log.exception("call failed with an unexpected error", method=name, **_ids(request),
                  code=grpc.StatusCode.INTERNAL.name)
    return grpc.StatusCode.INTERNAL, f"{name}: internal error: {exc}"


class Unparsed:
    """What the deserializer gives for a request whose bytes are not its message, so that
    both servers answer INTERNAL "cannot parse the request", as grpc-go does (grpcio's aio
    server answers UNKNOWN and logs a traceback when a deserializer raises).

    A client sending garbage in a loop must not fill the log: one warning a minute at
    most, which says how many such requests were refused without a line since the last."""

    __slots__ = ("message",)
    QUIET = 60.0  # seconds between two warnings
    _last = -QUIET
    _unlogged = 0

    def __init__(self, message: str) -> None:
        self.message = message

    def refuse(self, name: str) -> str:
        now = time.monotonic()
        if now - Unparsed._last >= Unparsed.QUIET:
            log.warning("call failed", method=name, code=grpc.StatusCode.INTERNAL.name,
                        error=self.message, unlogged_since_last=Unparsed._unlogged)
            Unparsed._last, Unparsed._unlogged = now, 0
        else:
            Unparsed._unlogged += 1
        return self.message


def _wrap_unary(name: str, impl: Callable[..., Any], full_name: str) -> Callable[..., Any]:
    @functools.wraps(impl)
    async def handler(self: Any, request: Any, context: Context) -> Any:
        if type(request) is Unparsed:
            await context.abort(grpc.StatusCode.INTERNAL, request.refuse(name))
        start = time.perf_counter()
        code: str | None = None
        with tracing.server_span(full_name, context, span_attributes, request) as span:
            try:
                reply = await impl(self, request, context)
                if span.recording:
                    span.set(**span_attributes(reply), **{"rpc.grpc.status_code": 0})
                return reply
            except grpc.aio.AbortError:
                code = "aborted"
                raise
            except Exception as exc:
                status, message = _fail(exc, name, request)
                code = status.name
                span.fail(message, **{"rpc.grpc.status_code": status.value[0],
                                      "rpc.grpc.status": status.name})
                await context.abort(status, message)
            finally:
                observe_rpc(name, time.perf_counter() - start, code)

    return handler


def counted(name: str, answer: Answer) -> Answer:
    """`answer`, counted in the RPC metrics as a handler is; one that gives no reply or
    fails leaves the count to the handler that then runs."""
    def counted_answer(request: bytes) -> bytes | None:
        start = time.perf_counter()
        reply = answer(request)
        if reply is not None:
            observe_rpc(name, time.perf_counter() - start, None)
        return reply

    return counted_answer


def _wrap_stream(name: str, impl: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    @functools.wraps(impl)
    async def handler(self: Any, request: Any, context: Context) -> AsyncIterator[Any]:
        if type(request) is Unparsed:
            await context.abort(grpc.StatusCode.INTERNAL, request.refuse(name))
        try:
            async for item in impl(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            status, message = _fail(exc, name, request)
            await context.abort(status, message)

    return handler


def _unimplemented(service: str, name: str) -> Callable[..., Any]:
    async def handler(self: Any, request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{service}.{name} is not implemented by crishim yet")

    handler.__name__ = name
    return handler


class ServicerBase:
    SERVICE: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.SERVICE:
            return
        service = api_pb2.DESCRIPTOR.services_by_name[cls.SERVICE]
        for method in service.methods:
            impl = getattr(cls, method.name, None)
            if impl is None:
                setattr(cls, method.name, _unimplemented(cls.SERVICE, method.name))
            elif method.server_streaming:
                if not inspect.isasyncgenfunction(impl):
                    raise TypeError(f"{cls.SERVICE}.{method.name} must be an async generator")
                setattr(cls, method.name, _wrap_stream(method.name, impl))
            else:
                setattr(cls, method.name, _wrap_unary(method.name, impl,
                                                       f"{service.full_name}/{method.name}"))

    def answers(self) -> dict[str, Answer]:
        """RPCs that crishim's own server answers from the request's bytes where it
        reads them (rpc/connection.py, rpc/calls.py), by name: reads of in-memory state."""
        return {}
