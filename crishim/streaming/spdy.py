"""SPDY/3.1 framing and a connection with streams, flow control and backpressure.

Only what the Kubernetes streaming protocols need: the client opens streams (SYN_STREAM),
we answer SYN_REPLY, data flows both ways, either side half-closes with FIN or resets.
Header blocks are zlib-compressed with the SPDY/3 dictionary, one compression context per
direction for the whole connection (so frames must be compressed in the order they are
written: the writer lock covers compression and the socket write).

Flow control: SPDY/3.1 has per-stream and per-session windows (64 KiB initially). We honour
the peer's windows when it shows that it takes part (it sent SETTINGS or WINDOW_UPDATE);
moby/spdystream, which kubectl/crictl use, ignores flow control entirely, so for a peer that
never sent either we fall back to TCP backpressure (awaiting drain) after a short grace
period. The grace is kept tiny (50 ms, paid once per connection by kubectl/crictl): a
flow-controlled peer announces SETTINGS right after the upgrade, long before the first
64 KiB of output is spent. Received data is buffered per stream up to our advertised window; we send
WINDOW_UPDATE as the consumer reads, and a peer that overruns the window stalls the reader
(TCP backpressure) instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from crishim.log import get_logger

log = get_logger(__name__)

VERSION = 3

SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

# RST_STREAM status codes
PROTOCOL_ERROR = 1
INVALID_STREAM = 2
REFUSED_STREAM = 3
UNSUPPORTED_VERSION = 4
CANCEL = 5
INTERNAL_ERROR = 6
FLOW_CONTROL_ERROR = 7
STREAM_IN_USE = 8
STREAM_ALREADY_CLOSED = 9
FRAME_TOO_LARGE = 11

SETTINGS_INITIAL_WINDOW_SIZE = 7

INITIAL_WINDOW = 64 * 1024
MAX_DATA_CHUNK = 16 * 1024  # what we put in one DATA frame
MAX_FRAME = 1 << 20  # largest frame we accept (the field allows 16 MiB; clients send
                     # 32 KiB data frames, and a huge one would be buffered whole)
MAX_HEADER_BLOCK = 1 << 20  # decompressed header block limit (a zip bomb stops here)
MAX_STREAMS = 1024  # concurrent streams per connection; more are refused

# The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): a list of
# length-prefixed words followed by a plain-text tail. Tests pin it by SHA-256.
_DICT_WORDS = (
    *(
        "options head post put delete trace accept accept-charset accept-encoding "
        "accept-language accept-ranges age allow authorization cache-control connection "
        "content-base content-encoding content-language content-length content-location "
        "content-md5 content-range content-type date etag expect expires from host if-match "
        "if-modified-since if-none-match if-range if-unmodified-since last-modified location "
        "max-forwards pragma proxy-authenticate proxy-authorization range referer "
        "retry-after server te trailer transfer-encoding upgrade user-agent vary via warning "
        "www-authenticate method get status"
    ).split(),
    "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin",
)
_DICT_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417"
    "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
    "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct "
    "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
    "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8"
    "charset=iso-8859-1,utf-,*,enq=0."
)


def _build_dictionary() -> bytes:
    out = bytearray()
    for word in _DICT_WORDS:
        data = word.encode()
        out += struct.pack(">I", len(data)) + data
    return bytes(out) + _DICT_TAIL.encode()


DICTIONARY = _build_dictionary()


class ProtocolError(Exception):
    """The peer broke the SPDY framing; the connection is closed."""


class ByteReader(Protocol):
    """What the frame reader needs of a byte stream: asyncio.StreamReader, or the
    WebSocket tunnel (tunnel.py)."""

    async def readexactly(self, n: int) -> bytes: ...


class ByteWriter(Protocol):
    """What a connection needs to write: asyncio.StreamWriter, or the WebSocket tunnel."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


# ---------------------------------------------------------------- header blocks

Headers = dict[str, list[str]]


def encode_header_block(headers: Headers) -> bytes:
    out = bytearray(struct.pack(">I", len(headers)))
    for name, values in headers.items():
        n = name.lower().encode()
        v = "\x00".join(values).encode()
        out += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
    return bytes(out)


def decode_header_block(data: bytes) -> Headers:
    try:
        (count,) = struct.unpack_from(">I", data, 0)
        pos = 4
        headers: Headers = {}
        for _ in range(count):
            (nlen,) = struct.unpack_from(">I", data, pos)
            pos += 4
            name = data[pos:pos + nlen].decode()
            pos += nlen
            (vlen,) = struct.unpack_from(">I", data, pos)
            pos += 4
            value = data[pos:pos + vlen].decode()
            pos += vlen
            if name != name.lower() or not name:
                raise ProtocolError(f"header name {name!r} is not lowercase")
            headers.setdefault(name, []).extend(value.split("\x00"))
        return headers
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad header block: {exc}") from None


class HeaderCompressor:
    def __init__(self) -> None:
        self._z = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)

    def compress(self, headers: Headers) -> bytes:
        raw = encode_header_block(headers)
        return self._z.compress(raw) + self._z.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    def __init__(self) -> None:
        self._z = zlib.decompressobj(15, zdict=DICTIONARY)

    def decompress(self, data: bytes) -> Headers:
        try:
            raw = self._z.decompress(data, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"header decompression failed: {exc}") from None
        if self._z.unconsumed_tail:
            raise ProtocolError("header block too large")
        return decode_header_block(raw)


# ---------------------------------------------------------------- frames


@dataclass
class Frame:
    """One decoded frame. Control frames have `type` > 0; DATA frames type 0."""

    type: int
    flags: int = 0
    stream_id: int = 0
    data: bytes = b""
    headers: Headers = field(default_factory=dict)
    associated_id: int = 0
    priority: int = 0
    status: int = 0  # RST_STREAM / GOAWAY status
    ping_id: int = 0
    delta: int = 0  # WINDOW_UPDATE
    settings: dict[int, int] = field(default_factory=dict)


def control_frame(ftype: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, ftype, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(payload)) + payload


def syn_stream(comp: HeaderCompressor, stream_id: int, headers: Headers, flags: int = 0,
               priority: int = 0) -> bytes:
    body = struct.pack(">IIBB", stream_id, 0, (priority & 7) << 5, 0) + comp.compress(headers)
    return control_frame(SYN_STREAM, flags, body)


def syn_reply(comp: HeaderCompressor, stream_id: int, headers: Headers, flags: int = 0) -> bytes:
    return control_frame(SYN_REPLY, flags, struct.pack(">I", stream_id) + comp.compress(headers))


def rst_stream(stream_id: int, status: int) -> bytes:
    return control_frame(RST_STREAM, 0, struct.pack(">II", stream_id, status))


def settings(values: dict[int, int]) -> bytes:
    body = struct.pack(">I", len(values))
    for sid, value in values.items():
        body += struct.pack(">II", sid & 0xFFFFFF, value)
    return control_frame(SETTINGS, 0, body)


def ping(ping_id: int) -> bytes:
    return control_frame(PING, 0, struct.pack(">I", ping_id))


def goaway(last_good: int, status: int = 0) -> bytes:
    return control_frame(GOAWAY, 0, struct.pack(">II", last_good, status))


def window_update(stream_id: int, delta: int) -> bytes:
    return control_frame(WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta))


async def read_frame(reader: ByteReader, decomp: HeaderDecompressor) -> Frame | None:
    """Read one frame; None on a clean EOF between frames."""
    try:
        head = await reader.readexactly(8)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError("connection closed inside a frame header") from None
    first, second = struct.unpack(">II", head)
    flags, length = second >> 24, second & 0xFFFFFF
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is larger than {MAX_FRAME}")
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError("connection closed inside a frame") from None
    if not first & 0x80000000:
        return Frame(type=0, flags=flags, stream_id=first & 0x7FFFFFFF, data=payload)
    version, ftype = (first >> 16) & 0x7FFF, first & 0xFFFF
    if version != VERSION:
        raise ProtocolError(f"unsupported SPDY version {version}")
    try:
        return _decode_control(ftype, flags, payload, decomp)
    except struct.error:
        raise ProtocolError(f"short control frame of type {ftype}") from None


def _decode_control(ftype: int, flags: int, p: bytes, decomp: HeaderDecompressor) -> Frame:
    f = Frame(type=ftype, flags=flags)
    if ftype == SYN_STREAM:
        sid, assoc, pri = struct.unpack_from(">IIB", p, 0)
        f.stream_id, f.associated_id, f.priority = sid & 0x7FFFFFFF, assoc & 0x7FFFFFFF, pri >> 5
        f.headers = decomp.decompress(p[10:])
    elif ftype in (SYN_REPLY, HEADERS):
        (sid,) = struct.unpack_from(">I", p, 0)
        f.stream_id = sid & 0x7FFFFFFF
        f.headers = decomp.decompress(p[4:])
    elif ftype == RST_STREAM:
        sid, f.status = struct.unpack_from(">II", p, 0)
        f.stream_id = sid & 0x7FFFFFFF
    elif ftype == SETTINGS:
        (count,) = struct.unpack_from(">I", p, 0)
        for i in range(count):
            idf, value = struct.unpack_from(">II", p, 4 + 8 * i)
            f.settings[idf & 0xFFFFFF] = value
    elif ftype == PING:
        (f.ping_id,) = struct.unpack_from(">I", p, 0)
    elif ftype == GOAWAY:
        sid, f.status = struct.unpack_from(">II", p, 0)
        f.stream_id = sid & 0x7FFFFFFF
    elif ftype == WINDOW_UPDATE:
        sid, delta = struct.unpack_from(">II", p, 0)
        f.stream_id, f.delta = sid & 0x7FFFFFFF, delta & 0x7FFFFFFF
    # Unknown control frame types are ignored, as the spec says.
    return f


# ---------------------------------------------------------------- connection


class StreamReset(ConnectionError):
    """The stream was reset (by the peer or because the connection went away)."""


class SpdyStream:
    """One stream of a connection: a byte pipe in each direction plus its headers."""

    def __init__(self, conn: SpdyConnection, stream_id: int, headers: Headers) -> None:
        self.conn = conn
        self.id = stream_id
        self.headers = headers
        self._buf = bytearray()
        self._changed = asyncio.Event()
        self.remote_closed = False
        self.local_closed = False
        self.reset_received = False
        self.replied = False
        self.reply_received = asyncio.Event()
        self.send_window = conn.peer_initial_window
        self._unacked = 0  # bytes consumed by us but not yet granted back

    def header(self, name: str, default: str = "") -> str:
        values = self.headers.get(name.lower())
        return values[0] if values else default

    # -- receive side

    def _feed(self, data: bytes) -> None:
        self._buf += data
        self._changed.set()

    def _remote_fin(self) -> None:
        self.remote_closed = True
        self._changed.set()

    def _on_reset(self) -> None:
        self.reset_received = True
        self.remote_closed = True
        self.local_closed = True
        self._changed.set()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    async def read(self, n: int = 65536) -> bytes:
        """Up to n bytes; b"" at EOF (peer FIN, reset or connection gone)."""
        while not self._buf and not self.remote_closed:
            self._changed.clear()
            await self._changed.wait()
        if not self._buf:
            return b""
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._changed.set()  # wakes a reader loop stalled on this buffer
        self._unacked += len(data)
        await self.conn.consumed(self, len(data))
        return data

    async def wait_drained(self) -> None:
        """Wait until the consumer has made room (used by the connection reader)."""
        while len(self._buf) >= INITIAL_WINDOW and not self.reset_received:
            self._changed.clear()
            await self._changed.wait()

    # -- send side

    async def send_reply(self) -> None:
        if not self.replied:
            self.replied = True
            await self.conn.send_reply(self)

    async def write(self, data: bytes) -> None:
        if self.local_closed or self.reset_received:
            raise StreamReset(f"stream {self.id} is closed")
        await self.send_reply()
        view = memoryview(data)
        while view:
            n = await self.conn.reserve(self, min(len(view), MAX_DATA_CHUNK))
            await self.conn.send(data_frame(self.id, 0, bytes(view[:n])))
            view = view[n:]

    async def close(self) -> None:
        """Half-close: we send no more data (FIN). Idempotent."""
        if self.local_closed:
            return
        await self.send_reply()
        self.local_closed = True
        with contextlib.suppress(ConnectionError):
            await self.conn.send(data_frame(self.id, FLAG_FIN, b""))
        self.conn.forget_if_done(self)

    async def reset(self, status: int = CANCEL) -> None:
        if self.reset_received:
            return
        self._on_reset()
        with contextlib.suppress(ConnectionError):
            await self.conn.send(rst_stream(self.id, status))
        self.conn.forget_if_done(self)


StreamValidator = Callable[[SpdyStream], str | None]


class SpdyConnection:
    """The server side of an upgraded SPDY/3.1 connection.

    `accept()` yields streams the peer opened (already validated by `validator`, which
    returns an error text to reset a stream with). `serve()` runs the reader loop and must
    be running for anything to happen.
    """

    def __init__(self, reader: ByteReader, writer: ByteWriter,
                 idle_timeout: float, validator: StreamValidator | None = None,
                 flow_control_grace: float = 0.05, client: bool = False,
                 grant_windows: bool = True) -> None:
        self.client = client
        # False imitates peers without flow control (tests of our fallback use it).
        self.grant_windows = grant_windows
        self._next_id = 1 if client else 2
        self.reader = reader
        self.writer = writer
        self.idle_timeout = idle_timeout
        self.validator = validator
        self.flow_control_grace = flow_control_grace
        self.streams: dict[int, SpdyStream] = {}
        self.new_streams: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self._comp = HeaderCompressor()
        self._decomp = HeaderDecompressor()
        self._wlock = asyncio.Lock()
        self._last_good = 0
        self.peer_initial_window = INITIAL_WINDOW
        self.session_send_window = INITIAL_WINDOW
        self._session_unacked = 0
        # None = unknown yet; True once the peer sent SETTINGS/WINDOW_UPDATE.
        self.peer_flow_control: bool | None = None
        self._window_changed = asyncio.Event()
        self.closed = asyncio.Event()
        self.last_activity = time.monotonic()
        self.goaway_received = False

    # -- writing

    async def send(self, frame: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionError("connection closed")
        async with self._wlock:
            self.writer.write(frame)
            self.last_activity = time.monotonic()
            await self.writer.drain()

    async def send_reply(self, stream: SpdyStream) -> None:
        async with self._wlock:
            if self.closed.is_set():
                raise ConnectionError("connection closed")
            self.writer.write(syn_reply(self._comp, stream.id, {}))
            await self.writer.drain()

    async def consumed(self, stream: SpdyStream, n: int) -> None:
        """The consumer took n bytes of `stream`: give the peer window back in batches."""
        if not self.grant_windows:
            return
        frames = b""
        if stream._unacked >= INITIAL_WINDOW // 2 and not stream.remote_closed:
            frames += window_update(stream.id, stream._unacked)
            stream._unacked = 0
        self._session_unacked += n
        if self._session_unacked >= INITIAL_WINDOW // 2:
            frames += window_update(0, self._session_unacked)
            self._session_unacked = 0
        if frames:
            with contextlib.suppress(ConnectionError):
                await self.send(frames)

    async def reserve(self, stream: SpdyStream, want: int) -> int:
        """Wait for send window on the stream and session; return how many bytes to send."""
        while True:
            if stream.reset_received or self.closed.is_set():
                raise StreamReset(f"stream {stream.id} was reset")
            if self.peer_flow_control is False:
                return want
            avail = min(stream.send_window, self.session_send_window)
            if avail > 0:
                n = min(avail, want)
                stream.send_window -= n
                self.session_send_window -= n
                return n
            self._window_changed.clear()
            if self.peer_flow_control is None:
                # A peer that never spoke flow control within the grace period does not
                # implement it (spdystream): rely on TCP backpressure from here on.
                try:
                    await asyncio.wait_for(self._window_changed.wait(), self.flow_control_grace)
                except TimeoutError:
                    if self.peer_flow_control is None:
                        self.peer_flow_control = False
                        log.debug("peer does not do SPDY flow control; using TCP backpressure")
            else:
                await self._window_changed.wait()

    def forget_if_done(self, stream: SpdyStream) -> None:
        if stream.local_closed and stream.remote_closed and not stream.buffered:
            self.streams.pop(stream.id, None)

    # -- reading

    async def serve(self) -> None:
        """Reader loop plus idle watchdog; returns when the connection is gone."""
        watchdog = asyncio.create_task(self._idle_watchdog())
        try:
            await self._read_loop()
        except (ProtocolError, ConnectionError) as exc:
            log.debug("spdy connection ended", error=str(exc))
        finally:
            watchdog.cancel()
            await self.shutdown(send_goaway=False)

    async def _read_loop(self) -> None:
        while True:
            frame = await read_frame(self.reader, self._decomp)
            if frame is None:
                return
            self.last_activity = time.monotonic()
            if frame.type == 0:
                await self._on_data(frame)
            elif frame.type == SYN_STREAM:
                await self._on_syn_stream(frame)
            elif frame.type == RST_STREAM:
                stream = self.streams.pop(frame.stream_id, None)
                if stream is not None:
                    stream._on_reset()
                    self._window_changed.set()
            elif frame.type == SETTINGS:
                self.peer_flow_control = True
                if SETTINGS_INITIAL_WINDOW_SIZE in frame.settings:
                    new = frame.settings[SETTINGS_INITIAL_WINDOW_SIZE]
                    diff = new - self.peer_initial_window
                    self.peer_initial_window = new
                    for s in self.streams.values():
                        s.send_window += diff
                    self._window_changed.set()
            elif frame.type == WINDOW_UPDATE:
                self.peer_flow_control = True
                if frame.stream_id == 0:
                    self.session_send_window += frame.delta
                elif frame.stream_id in self.streams:
                    self.streams[frame.stream_id].send_window += frame.delta
                self._window_changed.set()
            elif frame.type == PING:
                # Client pings have odd ids, server pings even ones: echo the peer's.
                if bool(frame.ping_id & 1) != self.client:
                    await self.send(ping(frame.ping_id))
            elif frame.type == SYN_REPLY:
                if frame.stream_id in self.streams:
                    self.streams[frame.stream_id].reply_received.set()
            elif frame.type == GOAWAY:
                self.goaway_received = True
                return
            # SYN_REPLY/HEADERS for streams we never open: ignored.

    async def _on_syn_stream(self, frame: Frame) -> None:
        sid = frame.stream_id
        if sid == 0 or (sid % 2 == 1) == self.client or sid <= self._last_good:
            # Ids must grow; like spdystream (the kubelet's), refuse just this stream.
            log.debug("refusing spdy stream with a reused or out-of-order id", stream=sid)
            await self.send(rst_stream(sid, PROTOCOL_ERROR))
            return
        self._last_good = sid
        stream = SpdyStream(self, sid, frame.headers)
        if len(self.streams) >= MAX_STREAMS:
            await self.send(rst_stream(sid, REFUSED_STREAM))
            return
        problem = self.validator(stream) if self.validator else None
        if problem is not None:
            log.debug("rejecting spdy stream", stream=sid, reason=problem)
            await self.send(rst_stream(sid, PROTOCOL_ERROR))
            return
        self.streams[sid] = stream
        if frame.flags & FLAG_FIN:
            stream.remote_closed = True
        if frame.flags & FLAG_UNIDIRECTIONAL:
            stream.local_closed = True
        await stream.send_reply()
        await self.new_streams.put(stream)

    async def _on_data(self, frame: Frame) -> None:
        stream = self.streams.get(frame.stream_id)
        if stream is None or stream.remote_closed:
            # Data for a stream that is gone (e.g. we reset it): drop, but keep the
            # session window honest for a flow-controlled peer.
            if frame.data:
                self._session_unacked += len(frame.data)
            return
        if frame.data:
            # A peer ignoring our window stalls here until the consumer catches up.
            await stream.wait_drained()
            stream._feed(frame.data)
        if frame.flags & FLAG_FIN:
            stream._remote_fin()
            self.forget_if_done(stream)

    async def _idle_watchdog(self) -> None:
        while True:
            remaining = self.last_activity + self.idle_timeout - time.monotonic()
            if remaining <= 0:
                log.info("closing idle streaming connection", idle_timeout=self.idle_timeout)
                await self.shutdown()
                return
            await asyncio.sleep(min(remaining, 60.0))

    async def open_stream(self, headers: dict[str, str], fin: bool = False) -> SpdyStream:
        """Open a stream (the client side of the protocol)."""
        async with self._wlock:
            if self.closed.is_set():
                raise ConnectionError("connection closed")
            sid = self._next_id
            self._next_id += 2
            stream = SpdyStream(self, sid, {k.lower(): [v] for k, v in headers.items()})
            stream.replied = True  # the opener never sends SYN_REPLY
            stream.local_closed = fin
            self.streams[sid] = stream
            self.writer.write(syn_stream(self._comp, sid, stream.headers,
                                         FLAG_FIN if fin else 0))
            await self.writer.drain()
        return stream

    async def announce_flow_control(self) -> None:
        """Tell the peer we do SPDY/3.1 flow control (a SETTINGS frame, as browsers do)."""
        await self.send(settings({SETTINGS_INITIAL_WINDOW_SIZE: INITIAL_WINDOW}))

    async def accept(self) -> SpdyStream | None:
        """The next stream the peer opened; None once the connection is closed."""
        if self.closed.is_set() and self.new_streams.empty():
            return None
        return await self.new_streams.get()

    async def shutdown(self, send_goaway: bool = True) -> None:
        """GOAWAY, close the socket and wake everybody waiting. Idempotent."""
        if self.closed.is_set():
            return
        if send_goaway and not self.goaway_received:
            # Bounded: a writer stuck on a client that stopped reading holds the lock.
            with contextlib.suppress(OSError, RuntimeError):
                async with asyncio.timeout(2):
                    async with self._wlock:
                        self.writer.write(goaway(self._last_good))
                        await self.writer.drain()
        self.closed.set()
        for stream in list(self.streams.values()):
            stream._on_reset()
        self.streams.clear()
        self._window_changed.set()
        self.new_streams.put_nowait(None)
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 5)
