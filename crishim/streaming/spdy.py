"""A SPDY/3.1 connection with streams, flow control and backpressure (the frames are
spdyframes.py).

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
import time
from collections.abc import Callable

from crishim.log import get_logger
from crishim.streaming.spdyframes import (
    CANCEL,
    FLAG_FIN,
    FLAG_UNIDIRECTIONAL,
    GOAWAY,
    INITIAL_WINDOW,
    MAX_DATA_CHUNK,
    MAX_STREAMS,
    PING,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SYN_REPLY,
    SYN_STREAM,
    WINDOW_UPDATE,
    ByteReader,
    ByteWriter,
    Frame,
    HeaderCompressor,
    HeaderDecompressor,
    Headers,
    ProtocolError,
    data_frame,
    goaway,
    ping,
    read_frame,
    rst_stream,
    settings,
    syn_reply,
    syn_stream,
    window_update,
)

log = get_logger(__name__)


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
