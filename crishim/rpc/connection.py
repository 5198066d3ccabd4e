"""One client connection: HTTP/2 settings, flow control, and a call on each stream.

A call starts when its request has fully arrived and runs as a task of its own; its
reply (headers, message, trailers) goes out in one write when the peer's windows allow,
so a unary call is one read, one turn of the loop and one write. A method with an
`answer` is a read of in-memory state: answered where its request is read, without a
task, and a reply that is the same bytes as the last one is framed once.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, NoReturn

import grpc

from crishim.log import get_logger
from crishim.rpc import frames as fr
from crishim.rpc import grpcwire
from crishim.rpc.hpackdecoder import Decoder, HeaderBlockError

log = get_logger(__name__)

# The connection window we keep open for requests, topped up once half is used.
RECV_WINDOW = 1 << 30
MAX_HEADER_LIST = 16 * 1024
# Longer grpc-message texts are cut: the trailers must fit one frame.
MAX_DETAILS = 4096
MAX_HEADS = 64  # request header blocks kept read (a client repeats a few)
# Reads go into one buffer per connection: a fresh bytes object per read, as a plain
# Protocol gets, is 256 KiB that glibc maps and unmaps each time (~20 µs a read).
READ_BUFFER = 256 * 1024


Answer = Callable[[bytes], bytes | None]


class Method(NamedTuple):
    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]
    handler: Callable[[Any, Context], Any]  # a coroutine, or an async iterator if streaming
    server_streaming: bool
    # The serialized reply from the serialized request, here and now (a read of in-memory
    # state); None, or an error, and the handler runs instead, as it would without one.
    answer: Answer | None = None


class Framed(NamedTuple):
    """A successful unary reply, framed once and sent again on each call's stream."""

    message: bytes
    max_frame: int
    frames: bytearray  # the stream ids written in place for each call
    stream_ids: tuple[int, ...]  # where each frame's stream id goes


class Context:
    """What a handler may do to its own call: end it with a status."""

    __slots__ = ("code", "details")

    def __init__(self) -> None:
        self.code = grpc.StatusCode.UNKNOWN
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.code, self.details = code, details
        # grpcio's exception for the same thing, so servicers work under either server.
        raise grpc.aio.AbortError()


class CallStatus(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ProtocolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class RequestHead(NamedTuple):
    """What a call needs of its request's header block."""

    table: int  # the decoder's table_changes when it was read
    path: str
    timeout: float | None  # grpc-timeout, in seconds
    grpc: bool  # a POST of application/grpc


class Stream:
    __slots__ = ("body", "closed", "headers_sent", "id", "path", "remote_ended",
                 "send_window", "task", "timeout")

    def __init__(self, sid: int, send_window: int) -> None:
        self.id = sid
        self.send_window = send_window
        self.path = ""
        self.timeout: float | None = None
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.closed = False  # our END_STREAM or RST_STREAM went out, or the peer's RST came
        self.remote_ended = False


class Connection(asyncio.BufferedProtocol):
    def __init__(self, methods: Mapping[str, Method], max_message: int,
                 on_close: Callable[[Connection], None]) -> None:
        self._methods = methods
        self._max_message = max_message
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        # Bytes read and not yet taken as frames are _buf[:_buffered]; the buffer is
        # never resized, as the transport holds a view of it while a read is handled.
        self._buf = bytearray(READ_BUFFER)
        self._buffered = 0
        self._out: list[bytes | bytearray | memoryview] = []
        self._preface_seen = False
        self._decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._heads: dict[bytes, RequestHead] = {}  # by header block, see _head
        self._framed: dict[str, Framed] = {}  # the last answer by method path
        self._streams: dict[int, Stream] = {}
        self._last_stream = 0
        self._send_window = fr.DEFAULT_WINDOW
        self._peer_initial_window = fr.DEFAULT_WINDOW
        self._max_frame = fr.DEFAULT_MAX_FRAME
        self._recv_unacked = 0
        self._pending_block: tuple[int, int, bytearray] | None = None  # CONTINUATIONs due
        self._window_waiters: list[asyncio.Future[None]] = []
        self._going_away = False
        self.closed = False

    # --- what the server asks of a connection ---------------------------------------------
    def tasks(self) -> list[asyncio.Task[None]]:
        return [st.task for st in self._streams.values() if st.task is not None]

    def go_away(self) -> None:
        """No new calls; those under way finish."""
        if not self._going_away and not self.closed:
            self._going_away = True
            self._send(fr.goaway(self._last_stream, fr.NO_ERROR))
            self._flush()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        stream_window = min(self._max_message + grpcwire.PREFIX_LEN, fr.MAX_WINDOW)
        transport.write(fr.settings({fr.ENABLE_PUSH: 0, fr.INITIAL_WINDOW_SIZE: stream_window,
                                     fr.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST})
                        + fr.window_update(0, RECV_WINDOW - fr.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for st in self._streams.values():
            st.closed = True
            if st.task is not None:
                st.task.cancel()
        self._wake_senders()
        self._on_close(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buf)[self._buffered:]

    def buffer_updated(self, nbytes: int) -> None:
        buf, end = self._buf, self._buffered + nbytes
        pos = 0
        if not self._preface_seen:
            if end < len(fr.PREFACE):
                self._buffered = end
                if not fr.PREFACE.startswith(bytes(buf[:end])):
                    self._fail(fr.PROTOCOL_ERROR, "not an HTTP/2 client")
                return
            if buf[:len(fr.PREFACE)] != fr.PREFACE:
                self._fail(fr.PROTOCOL_ERROR, "not an HTTP/2 client")
                return
            pos = len(fr.PREFACE)
            self._preface_seen = True
        try:
            while end - pos >= fr.HEADER_LEN:
                length = int.from_bytes(buf[pos:pos + 3], "big")
                if length > fr.DEFAULT_MAX_FRAME:
                    raise ProtocolError(fr.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                stop = pos + fr.HEADER_LEN + length
                if stop > end:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                sid = int.from_bytes(buf[pos + 5:pos + 9], "big") & fr.MAX_WINDOW
                payload = bytes(buf[pos + fr.HEADER_LEN:stop])
                pos = stop
                self._on_frame(kind, flags, sid, payload)
        except ProtocolError as exc:
            self._fail(exc.code, str(exc))
            return
        finally:
            # The part of a frame still to come moves to the front (less than a frame:
            # the rest of the buffer always has room for one).
            if pos:
                buf[:end - pos] = buf[pos:end]
            self._buffered = end - pos
        self._flush()

    # --- frames in ------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._pending_block is not None and kind != fr.CONTINUATION:
            raise ProtocolError(fr.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == fr.DATA:
            self._on_data(sid, flags, payload)
        elif kind == fr.HEADERS:
            try:
                block = fr.strip_padding(flags, payload)
            except ValueError as exc:
                raise ProtocolError(fr.PROTOCOL_ERROR, str(exc)) from None
            if flags & fr.END_HEADERS:
                self._on_headers(sid, flags, block)
            else:
                self._pending_block = (sid, flags, bytearray(block))
        elif kind == fr.CONTINUATION:
            if self._pending_block is None or self._pending_block[0] != sid:
                raise ProtocolError(fr.PROTOCOL_ERROR, "CONTINUATION out of place")
            self._pending_block[2].extend(payload)
            if len(self._pending_block[2]) > 4 * MAX_HEADER_LIST:
                raise ProtocolError(fr.PROTOCOL_ERROR, "header block too large")
            if flags & fr.END_HEADERS:
                psid, pflags, fragments = self._pending_block
                self._pending_block = None
                self._on_headers(psid, pflags, bytes(fragments))
        elif kind == fr.RST_STREAM:
            st = self._streams.pop(sid, None)
            if st is not None:
                st.closed = True
                if st.task is not None:
                    st.task.cancel()
                self._wake_senders()
        elif kind == fr.SETTINGS:
            if not flags & fr.ACK:
                self._on_settings(fr.parse_settings(payload))
                self._send(fr.frame(fr.SETTINGS, fr.ACK, 0))
        elif kind == fr.PING:
            if not flags & fr.ACK:
                self._send(fr.frame(fr.PING, fr.ACK, 0, payload))
        elif kind == fr.WINDOW_UPDATE:
            (increment,) = struct.unpack(">I", payload[:4])
            increment &= fr.MAX_WINDOW
            if sid == 0:
                self._send_window += increment
            elif (st := self._streams.get(sid)) is not None:
                st.send_window += increment
            self._wake_senders()
        # PRIORITY, GOAWAY (the peer closes when its calls are done) and unknown types:
        # nothing to do.

    def _on_settings(self, values: dict[int, int]) -> None:
        if fr.INITIAL_WINDOW_SIZE in values:
            new = values[fr.INITIAL_WINDOW_SIZE]
            if new > fr.MAX_WINDOW:
                raise ProtocolError(fr.FLOW_CONTROL_ERROR, "initial window too large")
            delta = new - self._peer_initial_window
            self._peer_initial_window = new
            for st in self._streams.values():
                st.send_window += delta
            self._wake_senders()
        if fr.MAX_FRAME_SIZE in values:
            self._max_frame = max(fr.DEFAULT_MAX_FRAME, min(values[fr.MAX_FRAME_SIZE],
                                                            2**24 - 1))

    def _on_headers(self, sid: int, flags: int, block: bytes) -> None:
        head = self._head(sid, block)
        st = self._streams.get(sid)
        if st is not None:
            if st.remote_ended:
                # Half-closed (remote): anything but WINDOW_UPDATE, PRIORITY or RST_STREAM
                # is a stream error STREAM_CLOSED (RFC 9113 5.1); the call is not run again.
                self._reset(st, fr.STREAM_CLOSED)
            elif flags & fr.END_STREAM:  # the request's trailers
                self._request_done(st)
            return
        if sid % 2 == 0 or sid <= self._last_stream:
            return  # not a new call: a stream already finished here
        self._last_stream = sid
        if self._going_away:
            self._send(fr.rst_stream(sid, fr.REFUSED_STREAM))
            return
        if not head.grpc:
            # Not a gRPC request: an HTTP error, as gRPC servers answer.
            self._send(fr.frame(fr.HEADERS, fr.END_HEADERS | fr.END_STREAM, sid,
                                fr.status_line(415)))
            return
        st = Stream(sid, self._peer_initial_window)
        st.path, st.timeout = head.path, head.timeout
        self._streams[sid] = st
        if flags & fr.END_STREAM:
            self._request_done(st)

    def _head(self, sid: int, block: bytes) -> RequestHead:
        """The block's fields that a call needs. A client sends the same few blocks again
        and again (a kubelet's, once its table holds them, are table references only,
        one per method); a block that leaves the table as it was reads the same while
        the table is unchanged, so it is read once."""
        changes = self._decoder.table_changes
        head = self._heads.get(block)
        if head is not None and head.table == changes:
            return head
        try:
            fields = self._decoder.decode(block)
        except HeaderBlockError as exc:
            # The decoder's table can no longer be trusted: the connection ends, and a
            # new call on it gets a status first.
            if sid % 2 == 1 and sid > self._last_stream:
                self._last_stream = sid
                self._send(fr.frame(fr.HEADERS, fr.END_HEADERS | fr.END_STREAM, sid,
                                    fr.REPLY_HEADERS + grpcwire.status_fields(
                                        grpc.StatusCode.INTERNAL,
                                        "the request's header block could not be decoded")))
            raise ProtocolError(fr.COMPRESSION_ERROR, f"header block: {exc}") from None
        path, timeout, method, content_type = "", None, b"", b""
        for name, value in fields:
            if name == b":path":
                path = value.decode("utf-8", "replace")
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = grpcwire.parse_timeout(value)
        head = RequestHead(self._decoder.table_changes, path, timeout,
                           method == b"POST" and content_type.startswith(b"application/grpc"))
        if head.table == changes:
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()
            self._heads[block] = head
        return head

    def _on_data(self, sid: int, flags: int, payload: bytes) -> None:
        self._recv_unacked += len(payload)
        if self._recv_unacked >= RECV_WINDOW // 2:
            self._send(fr.window_update(0, self._recv_unacked))
            self._recv_unacked = 0
        st = self._streams.get(sid)
        if st is None or st.remote_ended:
            return  # a call already answered or reset
        try:
            data = fr.strip_padding(flags, payload)
        except ValueError as exc:
            raise ProtocolError(fr.PROTOCOL_ERROR, str(exc)) from None
        st.body += data
        # The prefix tells the size before the message arrives: refuse at once, as the
        # stream's window would stop a larger message short of its end.
        if len(st.body) >= grpcwire.PREFIX_LEN and (
                int.from_bytes(st.body[1:5], "big") > self._max_message
                or len(st.body) > self._max_message + grpcwire.PREFIX_LEN):
            self._end(st, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"the request is larger than {self._max_message} bytes")
            return
        if flags & fr.END_STREAM:
            self._request_done(st)

    def _request_done(self, st: Stream) -> None:
        st.remote_ended = True
        method = self._methods.get(st.path)
        if method is None:
            self._end(st, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {st.path}")
            return
        if method.answer is not None and self._answer(st, method.answer):
            return
        st.task = asyncio.get_running_loop().create_task(self._call(st, method))

    # --- a call ---------------------------------------------------------------------------
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
        ctx = Context()
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

    async def _send_message(self, st: Stream, data: bytes) -> None:
        if st.closed or self.closed:  # reset while its handler ran
            raise asyncio.CancelledError()
        await self._drain(st, self._start_reply(st, data))

    def _start_reply(self, st: Stream, data: bytes) -> memoryview:
        """Headers (once) and as much of the message as the windows take now; the rest."""
        if len(data) > self._max_message:
            raise CallStatus(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"the reply is {len(data)} bytes, more than the "
                             f"{self._max_message} a message may have")
        if not st.headers_sent:
            st.headers_sent = True
            self._send(fr.frame(fr.HEADERS, fr.END_HEADERS, st.id, fr.REPLY_HEADERS))
        return self._send_data(st, memoryview(grpcwire.message(data)))

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

    async def _drain(self, st: Stream, rest: memoryview) -> None:
        """Send `rest` as the peer's windows open."""
        while rest:
            self._flush()
            waiter = asyncio.get_running_loop().create_future()
            self._window_waiters.append(waiter)
            await waiter
            if st.closed or self.closed:
                raise asyncio.CancelledError()
            rest = self._send_data(st, rest)

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

    def _reset(self, st: Stream, code: int) -> None:
        """A stream error: RST_STREAM, and its call, if running, is cancelled."""
        self._streams.pop(st.id, None)
        if not st.closed:
            st.closed = True
            self._send(fr.rst_stream(st.id, code))
        if st.task is not None:
            st.task.cancel()
        self._wake_senders()

    # --- frames out -----------------------------------------------------------------------
    def _send(self, data: bytes | bytearray | memoryview) -> None:
        self._out.append(data)

    def _flush(self) -> None:
        if not self._out:
            return
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def _wake_senders(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _fail(self, code: int, message: str) -> None:
        log.warning("closing a client connection", reason=message)
        self._send(fr.goaway(self._last_stream, code, message.encode()[:256]))
        self._flush()
        self.close()
