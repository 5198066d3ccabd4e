"""What a server serves and what a handler sees: a method's table entry, its call's
context, and the status a call may end with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

import grpc

Answer = Callable[[bytes], bytes | None]


class Method(NamedTuple):
    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes | bytearray]
    handler: Callable[[Any, Context], Any]  # a coroutine, or an async iterator if streaming
    server_streaming: bool
    # The serialized reply from the serialized request, here and now (a read of in-memory
    # state); None, or an error, and the handler runs instead, as it would without one.
    answer: Answer | None = None


class Context:
    """What a handler may do to its own call: end it with a status, and read the metadata
    the server keeps (the W3C trace context, TRACE_KEYS)."""

    __slots__ = ("code", "details", "metadata")

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.code = grpc.StatusCode.UNKNOWN
        self.details = ""
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """As grpcio's ServicerContext.invocation_metadata, limited to TRACE_KEYS."""
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.code, self.details = code, details
        # grpcio's exception for the same thing, so servicers work under either server.
        raise grpc.aio.AbortError()


class CallStatus(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details

# The request metadata kept for handlers: W3C trace context (observe/tracing.py).
TRACE_KEYS = (b"traceparent", b"tracestate")
