"""A call on a stream: its request's message, the handler run as a task (or an
`answer` here and now), the reply sent as the peer's windows allow, and the status
trailers."""

from __future__ import annotations

import asyncio
import struct
from typing import Any, NamedTuple

import grpc

from crishim.log import get_logger
from crishim.rpc import frames as fr
from crishim.rpc import grpcwire
from crishim.rpc.flow import FlowControl
from crishim.rpc.limits import FAIR_SHARE
from crishim.rpc.method import Answer, CallStatus, Context, Method
from crishim.rpc.stream import Stream

log = get_logger(__name__)

# Longer grpc-message texts are cut: the trailers must fit one frame.
MAX_DETAILS = 4096
# Replies up to this size go out with their prefix in one DATA frame; larger ones (an
# ExecSync's 16 MiB) in frames of their own, which saves a copy of the whole reply.
JOINED_MAX = 64 * 1024


class Framed(NamedTuple):
    """A successful unary reply, framed once and sent again on each call's stream."""

    message: bytes
    max_frame: int
    frames: bytearray  # the stream ids written in place for each call
    stream_ids: tuple[int, ...]  # where each frame's stream id goes


class Calls(FlowControl):
    _framed: dict[str, Framed]
    _max_frame: int

    def _answer(self, st: Stream, answer: Answer) -> bool:
        """Reply here and now, whole; False to leave the call to its handler (no answer,
        an error the handler will meet and report, or a reply the peer's windows do not
        take at once)."""
        try:
            data = answer(self._request_message(st))
        except Exception:
            return False
        if data is None:
            return False
        size = grpcwire.PREFIX_LEN + len(data)
        if size > st.send_window or size > self._send_window or len(data) > self._max_message:
            return False
        framed = self._framed.get(st.path)
        if framed is None or framed.message != data or framed.max_frame != self._max_frame:
            frames, stream_ids = grpcwire.unary_reply(data, self._max_frame)
            framed = Framed(data, self._max_frame, bytearray(frames), stream_ids)
            self._framed[st.path] = framed
        out, sid = framed.frames, st.id.to_bytes(4, "big")
        for at in framed.stream_ids:
            out[at:at + 4] = sid
        st.send_window -= size
        self._send_window -= size
        st.headers_sent = st.closed = True
        self._streams.pop(st.id, None)
        if st.held:
            self._release(st)
        # Written now and as it is, not copied: a relist's reply is tens of kilobytes,
        # rarely in the CPU's caches a second later. What is queued goes first.
        self._flush()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(out)
            if transport.get_write_buffer_size():
                # The transport may hold on to `out` until the peer reads: it is not
                # written into again.
                del self._framed[st.path]
        return True

    async def _call(self, st: Stream, method: Method) -> None:
        ctx = Context(st.metadata)
        try:
            request = method.deserialize(self._request_message(st))
            if st.timeout is None:
                await self._invoke(st, method, request, ctx)
            else:
                async with asyncio.timeout(st.timeout):
                    await self._invoke(st, method, request, ctx)
            self._end(st, grpc.StatusCode.OK, "")
        except (Exception, asyncio.CancelledError) as exc:
            self._end_failed(st, ctx, exc)
        finally:
            self._streams.pop(st.id, None)
            self._release(st)
            self._flush()

    def _end_failed(self, st: Stream, ctx: Context, exc: BaseException) -> None:
        """End the call with the status its error stands for (called where it is
        caught); the error goes no further."""
        if isinstance(exc, CallStatus):
            self._end(st, exc.code, exc.details)
        elif isinstance(exc, grpc.aio.AbortError):
            self._end(st, ctx.code, ctx.details)
        elif isinstance(exc, TimeoutError):
            self._end(st, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        elif isinstance(exc, asyncio.CancelledError):
            # Reset by the client, its connection gone, or the server stopping.
            self._end(st, grpc.StatusCode.CANCELLED, "the call was cancelled")
        else:
            log.exception("unexpected error in a call", method=st.path)
            self._end(st, grpc.StatusCode.UNKNOWN, f"Unexpected error: {exc}")

    def _request_message(self, st: Stream) -> bytes:
        body = st.body
        if len(body) < grpcwire.PREFIX_LEN:
            raise CallStatus(grpc.StatusCode.INTERNAL, "the request has no message")
        if body[0] != 0:
            raise CallStatus(grpc.StatusCode.UNIMPLEMENTED,
                             "compressed requests are not accepted (grpc-accept-encoding: "
                             "identity)")
        (size,) = struct.unpack(">I", body[1:5])
        if size != len(body) - grpcwire.PREFIX_LEN:
            raise CallStatus(grpc.StatusCode.INTERNAL,
                             "a unary request must hold exactly one message")
        return bytes(body[grpcwire.PREFIX_LEN:])

    async def _invoke(self, st: Stream, method: Method, request: Any, ctx: Context) -> None:
        if method.server_streaming:
            async for item in method.handler(request, ctx):
                await self._send_message(st, method.serialize(item))
                self._flush()  # each item as it comes
        else:
            await self._send_message(st, method.serialize(await method.handler(request, ctx)))

    async def _send_message(self, st: Stream, data: bytes | bytearray) -> None:
        if st.closed or self.closed:  # reset while its handler ran
            raise asyncio.CancelledError()
        self._start_reply(st, data)
        if len(data) <= JOINED_MAX:
            parts = [memoryview(grpcwire.message(data))]
        else:
            # A large message: its prefix, then its bytes as they are, in DATA frames of
            # their own, rather than one more copy of the message with the prefix in front.
            parts = [memoryview(grpcwire.prefix(len(data))), memoryview(data)]
        await self._drain(st, self._send_parts(st, parts))

    def _start_reply(self, st: Stream, data: bytes | bytearray) -> None:
        """The reply's size checked, and its headers (once)."""
        if len(data) > self._max_message:
            raise CallStatus(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"the reply is {len(data)} bytes, more than the "
                             f"{self._max_message} a message may have")
        if not st.headers_sent:
            st.headers_sent = True
            self._send(fr.frame(fr.HEADERS, fr.END_HEADERS, st.id, fr.REPLY_HEADERS))

    def _send_data(self, st: Stream, view: memoryview) -> memoryview:
        while view:
            n = min(len(view), st.send_window, self._send_window, self._max_frame)
            if n <= 0:
                break
            # The slice is copied once, with the rest of the write (_flush).
            self._send(fr.frame_head(fr.DATA, 0, st.id, n))
            self._send(view[:n])
            st.send_window -= n
            self._send_window -= n
            view = view[n:]
        return view

    def _send_parts(self, st: Stream, parts: list[memoryview]) -> list[memoryview]:
        """`parts` in order, as much as the windows take now; what is left of them."""
        for i, part in enumerate(parts):
            left = self._send_data(st, part)
            if left:
                return [left, *parts[i + 1:]]
        return []

    async def _drain(self, st: Stream, rest: list[memoryview]) -> None:
        """Send `rest` as the peer's windows open. A reply the peer's windows hold back
        is memory the peer decides about: it is held within the connection's share or
        the budget while it waits, or the call fails."""
        if not rest:
            return
        n = sum(len(part) for part in rest)
        if self._held + n > FAIR_SHARE and self._budget.held + n > self._budget.limit:
            raise CallStatus(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"{n} bytes of the reply wait for the client's flow-control "
                             "window, and the server holds all it may of replies and "
                             "requests (grpc_max_buffered)")
        st.held += n
        self._held += n
        self._budget.held += n
        try:
            while rest:
                self._flush()
                waiter = asyncio.get_running_loop().create_future()
                self._window_waiters.append(waiter)
                await waiter
                if st.closed or self.closed:
                    raise asyncio.CancelledError()
                rest = self._send_parts(st, rest)
        finally:
            n = min(n, st.held)  # none if the connection was lost meanwhile
            st.held -= n
            self._held -= n
            self._budget.release(n)

    def _end(self, st: Stream, code: grpc.StatusCode, details: str) -> None:
        """The call's status: trailers after a reply, or trailers only."""
        if st.closed or self.closed:
            return
        st.closed = True
        block = grpcwire.status_fields(code, details[:MAX_DETAILS])
        if not st.headers_sent:
            block = fr.REPLY_HEADERS + block
        self._send(fr.frame(fr.HEADERS, fr.END_HEADERS | fr.END_STREAM, st.id, block))
        if not st.remote_ended:
            # Answered before the request ended (e.g. too large): the rest is not read.
            self._send(fr.rst_stream(st.id, fr.NO_ERROR))
        self._streams.pop(st.id, None)
        self._release(st)
