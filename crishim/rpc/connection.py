"""One client connection: HTTP/2 settings, flow control, and a call on each stream.

A call starts when its request has fully arrived and runs as a task of its own; its
reply (headers, message, trailers) goes out in one write when the peer's windows allow,
so a unary call is one read, one turn of the loop and one write. A method with an
`answer` is a read of in-memory state: answered where its request is read, without a
task, and a reply that is the same bytes as the last one is framed once.

What a client can make the server hold is bounded (`Limits`): streams per connection
(MAX_CONCURRENT_STREAMS, extra ones refused), request bytes (the connection window is
opened again only while the connection, and all connections together (`Budget`), hold
less than their share), replies the client does not read (reading stops while the
transport's write buffer is above its high-water mark) and control-frame replies
(ENHANCE_YOUR_CALM past a bound). A frame that breaks RFC 9113 ends its stream or the
connection with the RFC's error code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import grpc

from crishim.log import get_logger
from crishim.observe import tracing
from crishim.rpc import frames as fr
from crishim.rpc import grpcwire
from crishim.rpc.calls import Calls, Framed
from crishim.rpc.hpackdecoder import Decoder, HeaderBlockError
from crishim.rpc.limits import DEFAULT_LIMITS, Budget, Limits
from crishim.rpc.method import TRACE_KEYS, Method
from crishim.rpc.stream import ProtocolError, Stream

log = get_logger(__name__)

MAX_HEADER_LIST = 16 * 1024
MAX_HEADS = 64  # request header blocks kept read (a client repeats a few)
MAX_HEAD_BYTES = 512  # larger blocks are read each time (a kubelet's are tens of bytes)
# Reads go into one buffer per connection: a fresh bytes object per read, as a plain
# Protocol gets, is 256 KiB that glibc maps and unmaps each time (~20 µs a read). It is
# small while requests are (an idle connection costs little), large after a read filled
# it, and small again once a small read leaves nothing behind.
READ_SMALL = 8 * 1024
READ_LARGE = 256 * 1024
# Replies queued unread: reading stops above the high mark until the peer has read
# down to the low one.
WRITE_HIGH = 256 * 1024
WRITE_LOW = 64 * 1024
PREFACE_TIMEOUT = 10.0  # seconds a new connection has to show it is an HTTP/2 client
# Seconds without a read after which a connection with no call running (none open, or
# only requests that do not arrive) may be closed for a new one when the server is at
# its limit; one that never made a call may be at once. A kubelet's, which relists
# every second, is never one of them, nor one whose call is being handled.
IDLE_EVICT = 2.0
CLOSE_GRACE = 5.0  # seconds a closing connection's unread replies are kept


class RequestHead(NamedTuple):
    """What a call needs of its request's header block."""

    table: int  # the decoder's table_changes when it was read
    path: str
    timeout: float | None  # grpc-timeout, in seconds
    grpc: bool  # a POST of application/grpc
    metadata: tuple[tuple[str, str], ...]  # the TRACE_KEYS fields



class Connection(Calls, asyncio.BufferedProtocol):
    def __init__(self, methods: Mapping[str, Method], max_message: int,
                 on_close: Callable[[Connection], None], limits: Limits = DEFAULT_LIMITS,
                 budget: Budget | None = None) -> None:
        self._methods = methods
        self._max_message = max_message
        self._on_close = on_close
        self._limits = limits
        self._budget = budget if budget is not None else Budget(limits.max_buffered)
        self._transport: asyncio.Transport | None = None
        # Bytes read and not yet taken as frames are _buf[:_buffered]; the buffer is
        # replaced, never resized, as the transport holds a view of it while a read is
        # handled.
        self._buf = bytearray(READ_SMALL)
        self._buffered = 0
        self._reading_paused = False  # the peer leaves our replies unread
        self._control = 0  # control-frame replies since the peer last read all we wrote
        # Connection-level flow control of requests: what the peer may still send, what
        # it sent that we have not offered again, and the request bytes held meanwhile.
        self._recv_window = fr.DEFAULT_WINDOW
        self._unacked = 0
        self._held = 0
        self._preface_timer: asyncio.TimerHandle | None = None
        self.last_read = time.monotonic()
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
        self._pending_block: tuple[int, int, bytearray] | None = None  # CONTINUATIONs due
        self._window_waiters: list[asyncio.Future[None]] = []
        self._going_away = False
        self.closed = False

    # --- what the server asks of a connection ---------------------------------------------
    def tasks(self) -> list[asyncio.Task[None]]:
        return [st.task for st in self._streams.values() if st.task is not None]

    def idle(self, now: float) -> bool:
        """Connected, and no call ever made, or none running (a handler, or a reply
        going out) and no read for IDLE_EVICT seconds."""
        if self._transport is None or self.closed:
            return False
        if not self._last_stream:
            return True
        return now - self.last_read >= IDLE_EVICT and not any(
            st.remote_ended for st in self._streams.values())

    def evict(self) -> None:
        """Closed for a new connection: GOAWAY, NO_ERROR if no call was open (the client
        reconnects for its next one), ENHANCE_YOUR_CALM if requests were left unsent."""
        if self._streams:
            self.go_away(fr.ENHANCE_YOUR_CALM, b"requests left unsent, closed for a new "
                         b"connection")
        else:
            self.go_away(fr.NO_ERROR, b"idle connection closed for a new one")
        self.close()

    def go_away(self, code: int = fr.NO_ERROR, debug: bytes = b"") -> None:
        """No new calls; those under way finish."""
        if not self._going_away and not self.closed:
            self._going_away = True
            self._send(fr.goaway(self._last_stream, code, debug))
            self._flush()

    def close(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.close()
            if transport.get_write_buffer_size():
                # A peer that reads nothing would keep what is queued for ever.
                asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        # Replies a peer leaves unread stop its reads (pause_writing) past the high mark.
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        # One request message fits a stream's window; the connection's is what we offer
        # to hold, topped up as requests are taken while the budget allows.
        stream_window = min(self._max_message + grpcwire.PREFIX_LEN, fr.MAX_WINDOW)
        window = self._limits.connection_window
        head = fr.settings({fr.ENABLE_PUSH: 0,
                            fr.MAX_CONCURRENT_STREAMS: self._limits.max_concurrent_streams,
                            fr.INITIAL_WINDOW_SIZE: stream_window,
                            fr.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST})
        if window > fr.DEFAULT_WINDOW:
            head += fr.window_update(0, window - fr.DEFAULT_WINDOW)
            self._recv_window = window
        transport.write(head)
        self._preface_timer = asyncio.get_running_loop().call_later(
            PREFACE_TIMEOUT, self._preface_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        for st in list(self._streams.values()):
            st.closed = True
            if st.task is not None:
                st.task.cancel()
            self._release(st)
        self._budget.waiting.pop(self, None)
        self._wake_senders()
        self._on_close(self)

    def pause_writing(self) -> None:
        self._reading_paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._reading_paused = False
        self._control = 0
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()
            if self._buffered >= fr.HEADER_LEN:
                self.buffer_updated(0)  # frames read before the pause

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buf)[self._buffered:]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_read = time.monotonic()
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
            if self._preface_timer is not None:
                self._preface_timer.cancel()
                self._preface_timer = None
        try:
            while end - pos >= fr.HEADER_LEN and not self._reading_paused:
                length = int.from_bytes(buf[pos:pos + 3], "big")
                if length > fr.DEFAULT_MAX_FRAME:
                    raise ProtocolError(fr.FRAME_SIZE_ERROR, f"a frame of {length} bytes, "
                                        f"more than SETTINGS_MAX_FRAME_SIZE")
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
        except Exception as exc:
            # Nothing a peer sends may escape into the transport: the connection ends.
            log.exception("unexpected error reading a client connection")
            self._fail(fr.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
            return
        finally:
            self._keep(buf, pos, end, nbytes)
        self._flush()
        if self._control and self._transport is not None \
                and not self._transport.get_write_buffer_size():
            self._control = 0

    def _keep(self, buf: bytearray, pos: int, end: int, nbytes: int) -> None:
        """What is left of `buf` after frames up to `pos`, at the front of the buffer
        the next read goes into: a larger one when the read filled this one or the frame
        begun does not fit it, the small one again when a small read left nothing."""
        rest = end - pos
        size = len(buf)
        want = size
        if rest == 0:
            if size > READ_SMALL and nbytes < READ_SMALL:
                want = READ_SMALL
        elif end == size or (rest >= 3 and fr.HEADER_LEN
                             + int.from_bytes(buf[pos:pos + 3], "big") > size):
            want = max(READ_LARGE, rest + fr.HEADER_LEN + fr.DEFAULT_MAX_FRAME)
        if want != size:
            new = bytearray(want)
            new[:rest] = buf[pos:end]
            self._buf = new
        elif pos:
            buf[:rest] = buf[pos:end]
        self._buffered = rest

    def _preface_late(self) -> None:
        self._preface_timer = None
        if not self._preface_seen and not self.closed:
            log.warning("closing a client connection", reason="no HTTP/2 preface within "
                        f"{PREFACE_TIMEOUT:g}s")
            if self._transport is not None:
                self._transport.abort()

    # --- frames in ------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._pending_block is not None and kind != fr.CONTINUATION:
            raise ProtocolError(fr.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == fr.DATA:
            if not sid:
                raise ProtocolError(fr.PROTOCOL_ERROR, "DATA on stream 0")
            self._on_data(sid, flags, payload)
        elif kind == fr.HEADERS:
            if not sid & 1:
                raise ProtocolError(fr.PROTOCOL_ERROR, f"HEADERS on stream {sid}: a client's "
                                    "streams have odd ids")
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
            self._fixed_size(kind, payload, 4)
            self._on_stream_frame(kind, sid)
            st = self._streams.get(sid)
            if st is not None:
                st.closed = True  # the peer's reset: nothing more goes out on it
                self._reset(st, fr.CANCEL)
        elif kind == fr.SETTINGS:
            self._on_connection_frame(kind, sid)
            if flags & fr.ACK:
                if payload:
                    raise ProtocolError(fr.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            else:
                if len(payload) % 6:
                    raise ProtocolError(fr.FRAME_SIZE_ERROR, f"SETTINGS of {len(payload)} "
                                        "bytes, not a multiple of 6")
                self._on_settings(fr.parse_settings(payload))
                self._send(fr.frame(fr.SETTINGS, fr.ACK, 0))
                self._control_reply()
        elif kind == fr.PING:
            self._on_connection_frame(kind, sid)
            self._fixed_size(kind, payload, 8)
            if not flags & fr.ACK:
                self._send(fr.frame(fr.PING, fr.ACK, 0, payload))
                self._control_reply()
        elif kind == fr.WINDOW_UPDATE:
            self._fixed_size(kind, payload, 4)
            self._on_window_update(sid, int.from_bytes(payload, "big") & fr.MAX_WINDOW)
        elif kind == fr.PRIORITY:
            # Priorities are not used; a PRIORITY of the wrong size still ends the
            # connection (a stream error by the RFC, which lets a connection end for one).
            self._fixed_size(kind, payload, 5)
            if not sid:
                raise ProtocolError(fr.PROTOCOL_ERROR, "PRIORITY on stream 0")
        elif kind == fr.GOAWAY:
            # The peer closes when its calls are done.
            self._on_connection_frame(kind, sid)
            if len(payload) < 8:
                raise ProtocolError(fr.FRAME_SIZE_ERROR, f"GOAWAY of {len(payload)} bytes")
        elif kind == fr.PUSH_PROMISE:
            raise ProtocolError(fr.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Unknown types are ignored (RFC 9113 5.5).

    @staticmethod
    def _fixed_size(kind: int, payload: bytes, size: int) -> None:
        if len(payload) != size:
            raise ProtocolError(fr.FRAME_SIZE_ERROR, f"{fr.NAMES[kind]} of {len(payload)} "
                                f"bytes, not {size}")

    @staticmethod
    def _on_connection_frame(kind: int, sid: int) -> None:
        if sid:
            raise ProtocolError(fr.PROTOCOL_ERROR, f"{fr.NAMES[kind]} on stream {sid}")

    def _on_stream_frame(self, kind: int, sid: int) -> None:
        """A frame for a stream that must have been opened."""
        if not sid:
            raise ProtocolError(fr.PROTOCOL_ERROR, f"{fr.NAMES[kind]} on stream 0")
        if sid > self._last_stream or not sid & 1:
            raise ProtocolError(fr.PROTOCOL_ERROR, f"{fr.NAMES[kind]} on stream {sid}, "
                                "which the client never opened")

    def _on_window_update(self, sid: int, increment: int) -> None:
        if not sid:
            if not increment:
                raise ProtocolError(fr.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > fr.MAX_WINDOW:
                raise ProtocolError(fr.FLOW_CONTROL_ERROR, "WINDOW_UPDATE takes the "
                                    "connection's window past 2^31-1")
        else:
            self._on_stream_frame(fr.WINDOW_UPDATE, sid)
            st = self._streams.get(sid)
            if st is None:
                return  # a call already ended
            if not increment:
                self._reset(st, fr.PROTOCOL_ERROR)
                return
            if st.send_window + increment > fr.MAX_WINDOW:
                self._reset(st, fr.FLOW_CONTROL_ERROR)
                return
            st.send_window += increment
        self._wake_senders()

    def _on_settings(self, values: dict[int, int]) -> None:
        if values.get(fr.ENABLE_PUSH, 0) > 1:
            raise ProtocolError(fr.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
        if fr.INITIAL_WINDOW_SIZE in values:
            new = values[fr.INITIAL_WINDOW_SIZE]
            if new > fr.MAX_WINDOW:
                raise ProtocolError(fr.FLOW_CONTROL_ERROR, "initial window too large")
            delta = new - self._peer_initial_window
            self._peer_initial_window = new
            for st in self._streams.values():
                st.send_window += delta
                if st.send_window > fr.MAX_WINDOW:
                    raise ProtocolError(fr.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE "
                                        "takes a stream's window past 2^31-1")
            self._wake_senders()
        if fr.MAX_FRAME_SIZE in values:
            size = values[fr.MAX_FRAME_SIZE]
            if not fr.DEFAULT_MAX_FRAME <= size <= 2**24 - 1:
                raise ProtocolError(fr.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {size}")
            self._max_frame = size

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
            else:  # trailers must end the request (RFC 9113 8.1)
                self._reset(st, fr.PROTOCOL_ERROR)
            return
        if sid <= self._last_stream:
            raise ProtocolError(fr.PROTOCOL_ERROR, f"HEADERS on stream {sid}, not above "
                                f"the last stream opened ({self._last_stream})")
        self._last_stream = sid
        if self._going_away or len(self._streams) >= self._limits.max_concurrent_streams:
            self._send(fr.rst_stream(sid, fr.REFUSED_STREAM))
            self._control_reply()
            return
        if not head.grpc:
            # Not a gRPC request: an HTTP error, as gRPC servers answer.
            self._send(fr.frame(fr.HEADERS, fr.END_HEADERS | fr.END_STREAM, sid,
                                fr.status_line(415)))
            return
        st = Stream(sid, self._peer_initial_window)
        st.path, st.timeout, st.metadata = head.path, head.timeout, head.metadata
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
        metadata: list[tuple[str, str]] = []
        for name, value in fields:
            if name == b":path":
                path = value.decode("utf-8", "replace")
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = grpcwire.parse_timeout(value)
            elif name in TRACE_KEYS:
                metadata.append((name.decode(), value.decode("ascii", "replace")))
        head = RequestHead(self._decoder.table_changes, path, timeout,
                           method == b"POST" and content_type.startswith(b"application/grpc"),
                           tuple(metadata))
        if head.table == changes and len(block) <= MAX_HEAD_BYTES:
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()
            self._heads[block] = head
        return head

    def _on_data(self, sid: int, flags: int, payload: bytes) -> None:
        n = len(payload)
        self._recv_window -= n
        if self._recv_window < 0:
            raise ProtocolError(fr.FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self._unacked += n
        st = self._streams.get(sid)
        if st is None or st.remote_ended:
            if st is None:
                self._on_stream_frame(fr.DATA, sid)  # else a call already ended or reset
            else:  # half-closed (remote): the request had ended
                self._reset(st, fr.STREAM_CLOSED)
            if self._unacked >= self._limits.connection_window >> 1:
                self._credit()
            return
        try:
            data = fr.strip_padding(flags, payload)
        except ValueError as exc:
            raise ProtocolError(fr.PROTOCOL_ERROR, str(exc)) from None
        st.body += data
        held = len(data)
        st.held += held
        self._held += held
        self._budget.held += held
        if self._unacked >= self._limits.connection_window >> 1:
            self._credit()
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
        # A traced call goes to its handler, which makes its span.
        if method.answer is not None and not (st.metadata and tracing.enabled()) \
                and self._answer(st, method.answer):
            return
        st.task = asyncio.get_running_loop().create_task(self._call(st, method))

    def _fail(self, code: int, message: str) -> None:
        log.warning("closing a client connection", reason=message)
        self._send(fr.goaway(self._last_stream, code, message.encode()[:256]))
        self._flush()
        self.close()
