"""NRI's connection multiplexer (containerd/nri pkg/net/multiplex) on the event loop.

One socket (the trunk) carries several logical byte streams. Each frame is an 8-byte
header, conn id u32 and payload length u32 (big-endian), then the payload. NRI uses two
ids: 1 carries the plugin's ttRPC server (the runtime calls the Plugin service there),
2 the runtime's ttRPC server (the plugin calls RegisterPlugin and UpdateContainers).
Id 0 is reserved. A frame for an id nobody opened is dropped, as the reference drops it.
A write (one ttRPC message) goes out in at most two frames, as Go's own writer sends it
(below).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from crishim.log import get_logger
from crishim.nri import ttrpc

log = get_logger(__name__)

HEADER = struct.Struct(">II")
HEADER_LEN = HEADER.size  # 8
MAX_PAYLOAD = ttrpc.HEADER_LEN + ttrpc.MAX_MESSAGE

PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2

# The first frame of a message. The Go side reads each connection through a 4096-byte
# bufio.Reader, and its mux hands a whole frame to one Read or fails it (ENOMEM), so a
# message's first frame must fit in 4096 bytes. The rest goes as one frame: by then the
# reader's buffer is empty and bufio reads straight into the message's own buffer, which
# holds all of it. That is the shape Go's bufio.Writer gives a message (4096 bytes
# flushed, then the remainder written directly). Smaller frames would break it another
# way: the reference queues at most 256 unread frames per connection and closes the
# whole trunk past that, which a 2 MiB message cut into 4 KiB frames overruns whenever
# the plugin's reader falls behind.
FIRST_FRAME = 4096

# Bytes queued for one logical connection that its reader has not taken yet: beyond
# this the peer is flooding, and the trunk is closed (the reference bounds its queue).
MAX_QUEUED = 2 * MAX_PAYLOAD


class MuxError(Exception):
    pass


class Conn:
    """One logical connection: read with readexactly, write whole messages."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self.id = conn_id
        self._mux = mux
        self._buf = bytearray()
        self._at_eof = False
        self._waiter: asyncio.Future[None] | None = None

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if self._at_eof:
                raise asyncio.IncompleteReadError(bytes(self._buf), n)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def write(self, data: bytes) -> None:
        self._mux.write(self.id, data)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _feed(self, data: bytes) -> bool:
        """Queue `data`; False when more is queued than the reader can be behind by."""
        self._buf += data
        self._wake()
        return len(self._buf) <= MAX_QUEUED

    def _eof(self) -> None:
        self._at_eof = True
        self._wake()


class Mux:
    """The trunk's reader and writer. Open the connections first, then `run()`: frames
    are read only once every id is there (the reference's blocked read)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_close: Callable[[BaseException | None], None] | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, Conn] = {}
        self._on_close = on_close
        self._closed = False
        self.error: BaseException | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def open(self, conn_id: int) -> Conn:
        if conn_id == 0:
            raise MuxError("mux connection id 0 is reserved")
        conn = self._conns.get(conn_id)
        if conn is None:
            conn = self._conns[conn_id] = Conn(self, conn_id)
        return conn

    def write(self, conn_id: int, data: bytes) -> None:
        if self._closed:
            raise ttrpc.ConnectionClosed("nri: mux closed")
        head, rest = data[:FIRST_FRAME], data[FIRST_FRAME:]
        parts = [HEADER.pack(conn_id, len(head)), head]
        if rest:
            parts += [HEADER.pack(conn_id, len(rest)), rest]
        self._writer.write(b"".join(parts))

    async def run(self) -> None:
        """Read frames until the trunk ends or breaks; then every connection sees EOF."""
        err: BaseException | None = None
        try:
            while True:
                cid, length = HEADER.unpack(await self._reader.readexactly(HEADER_LEN))
                if length > MAX_PAYLOAD:
                    raise MuxError(f"mux frame of {length} bytes for connection {cid} "
                                   f"exceeds the maximum of {MAX_PAYLOAD}")
                payload = await self._reader.readexactly(length) if length else b""
                conn = self._conns.get(cid)
                if conn is not None and payload and not conn._feed(payload):
                    raise MuxError(f"mux connection {cid}: more than {MAX_QUEUED} bytes "
                                   "queued unread")
        except asyncio.IncompleteReadError:
            pass
        except asyncio.CancelledError:
            raise
        except (MuxError, OSError, ConnectionError) as exc:
            err = exc
        finally:
            self.close(err)

    def close(self, err: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self.error = err
        for conn in self._conns.values():
            conn._eof()
        try:
            self._writer.close()
        except (OSError, RuntimeError):
            pass
        if self._on_close is not None:
            self._on_close(err)
