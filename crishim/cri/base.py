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

from crishim.api.runtime.v1 import api_pb2
from crishim.errors import CrishimError
from crishim.log import get_logger
from crishim.metrics import observe_rpc
from crishim.rpc.connection import Answer

log = get_logger("crishim.cri")

Context = grpc.aio.ServicerContext[Any, Any]


def _fail(exc: BaseException, name: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, CrishimError):
        return exc.code, str(exc)
    log.exception("unexpected error", rpc=name)
    return grpc.StatusCode.INTERNAL, f"{name}: internal error: {exc}"


def _wrap_unary(name: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(impl)
    async def handler(self: Any, request: Any, context: Context) -> Any:
        start = time.perf_counter()
        code: str | None = None
        try:
            return await impl(self, request, context)
        except grpc.aio.AbortError:
            code = "aborted"
            raise
        except Exception as exc:
            status, message = _fail(exc, name)
            code = status.name
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
        try:
            async for item in impl(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            status, message = _fail(exc, name)
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
                setattr(cls, method.name, _wrap_unary(method.name, impl))

    def answers(self) -> dict[str, Answer]:
        """RPCs that crishim's own server answers from the request's bytes where it
        reads them (rpc/connection.py), by name: reads of in-memory state."""
        return {}
