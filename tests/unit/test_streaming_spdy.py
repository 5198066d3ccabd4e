"""SPDY/3.1 wire format, header compression, flow control, backpressure and idle timeout."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable

import pytest

from crishim.config import StreamingConfig
from crishim.streaming import spdy, spdyframes
from crishim.streaming.client import spdy_connect
from crishim.streaming.interface import ByteSink, ByteSource, ExecRequest, TerminalSize
from crishim.streaming.server import StreamingServer

# SHA-256 of the 1423-byte SPDY/3 dictionary as Go's spdy package (kubectl) carries it.
SPDY3_DICT_SHA256 = "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"


async def _steady(count: Callable[[], int], settle: float = 0.3, after: float = 0.0,
                  slack: int = 16384, seconds: float = 30) -> None:
    """Wait until `count()` is above 0 and grows by no more than `slack` over `settle`
    seconds (after at least `after` seconds): it has stopped, however slowly a loaded
    machine got there."""
    start = time.monotonic()
    deadline = start + seconds
    last: int | None = None
    while True:
        now = count()
        if (last is not None and 0 < now and now - last <= slack
                and time.monotonic() - start >= after):
            return
        assert time.monotonic() < deadline, f"still growing after {seconds:g}s: {now}"
        last = now
        await asyncio.sleep(settle)


def test_dictionary_is_byte_exact() -> None:
    assert len(spdyframes.DICTIONARY) == 1423
    assert hashlib.sha256(spdyframes.DICTIONARY).hexdigest() == SPDY3_DICT_SHA256


def test_control_and_data_frame_layout() -> None:
    # Control bit + version 3, type, flags, 24-bit length, payload.
    assert spdyframes.ping(1) == bytes.fromhex("80030006 00000004 00000001")
    assert spdyframes.window_update(5, 1000) == bytes.fromhex(
        "80030009 00000008 00000005 000003e8")
    assert spdyframes.rst_stream(3, spdyframes.CANCEL) == bytes.fromhex(
        "80030003 00000008 00000003 00000005")
    assert spdyframes.goaway(7) == bytes.fromhex("80030007 00000008 00000007 00000000")
    assert spdyframes.data_frame(3, spdyframes.FLAG_FIN, b"hi") == bytes.fromhex(
        "00000003 01000002 6869")
    assert spdyframes.settings({spdyframes.SETTINGS_INITIAL_WINDOW_SIZE: 65536}) == bytes.fromhex(
        "80030004 0000000c 00000001 00000007 00010000")


def test_header_blocks_interoperate_with_plain_zlib() -> None:
    # Our compressor's output decodes with an independent zlib context + the dictionary,
    # across several blocks that share one compression context (as on a connection).
    comp = spdyframes.HeaderCompressor()
    d = zlib.decompressobj(zdict=spdyframes.DICTIONARY)
    for i in range(3):
        block = comp.compress({"streamtype": ["stdout"], "requestid": [str(i)]})
        raw = d.decompress(block)
        assert spdyframes.decode_header_block(raw) == {"streamtype": ["stdout"],
                                                 "requestid": [str(i)]}
    # ...and blocks from an independent compressor decode with ours.
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, spdyframes.DICTIONARY)
    ours = spdyframes.HeaderDecompressor()
    for name in ("error", "stdin"):
        raw = struct.pack(">I", 1) + struct.pack(">I", 10) + b"streamtype" + \
            struct.pack(">I", len(name)) + name.encode()
        block = z.compress(raw) + z.flush(zlib.Z_SYNC_FLUSH)
        assert ours.decompress(block) == {"streamtype": [name]}


def test_uppercase_header_name_is_a_protocol_error() -> None:
    raw = struct.pack(">I", 1) + struct.pack(">I", 4) + b"Port" + struct.pack(">I", 2) + b"80"
    with pytest.raises(spdyframes.ProtocolError):
        spdyframes.decode_header_block(raw)


async def test_read_frame_parses_syn_stream() -> None:
    comp = spdyframes.HeaderCompressor()
    reader = asyncio.StreamReader()
    reader.feed_data(spdyframes.syn_stream(comp, 1, {"streamtype": ["error"]}, spdyframes.FLAG_FIN))
    reader.feed_eof()
    frame = await spdyframes.read_frame(reader, spdyframes.HeaderDecompressor())
    assert frame is not None
    assert (frame.type, frame.stream_id, frame.flags) == (spdyframes.SYN_STREAM, 1,
                                                          spdyframes.FLAG_FIN)
    assert frame.headers == {"streamtype": ["error"]}
    assert await spdyframes.read_frame(reader, spdyframes.HeaderDecompressor()) is None


class Firehose:
    """A backend whose exec writes to stdout as fast as the client lets it."""

    def __init__(self) -> None:
        self.written = 0
        self.cancelled = asyncio.Event()

    async def exec(self, container_id: str, cmd: list[str], tty: bool,
                   stdin: ByteSource | None, stdout: ByteSink | None,
                   stderr: ByteSink | None,
                   resize: AsyncIterator[TerminalSize] | None) -> int:
        assert stdout is not None
        chunk = b"x" * 16384
        try:
            while True:
                await stdout.write(chunk)
                self.written += len(chunk)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def attach(self, *args: object) -> None:
        raise NotImplementedError

    async def port_forward(self, pod_id: str, port: int) -> tuple[asyncio.StreamReader,
                                                                  asyncio.StreamWriter]:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def _firehose(idle: float) -> AsyncIterator[tuple[StreamingServer, Firehose]]:
    backend = Firehose()
    srv = StreamingServer(StreamingConfig(idle_timeout=idle), backend,
                          stream_creation_timeout=30)
    await srv.start()
    try:
        yield srv, backend
    finally:
        await srv.stop()


@pytest.fixture
async def firehose() -> AsyncIterator[tuple[StreamingServer, Firehose]]:
    async with _firehose(60.0) as pair:
        yield pair


async def _open_exec(url: str, flow_control: bool) -> tuple[spdy.SpdyConnection,
                                                            asyncio.Task[None]]:
    conn, _, reader = await spdy_connect(url, ["v4.channel.k8s.io"], flow_control)
    for kind in ("error", "stdout"):
        stream = await conn.open_stream({"streamType": kind})
        await stream.close()
    return conn, reader


async def test_slow_flow_controlled_client_gets_one_window(
        firehose: tuple[StreamingServer, Firehose]) -> None:
    srv, backend = firehose
    # The client announces flow control but never reads: the server must stop at the
    # 64 KiB stream window instead of buffering.
    conn, reader = await _open_exec(srv.url_for(ExecRequest("c", ["x"], stderr=False)), True)
    conn.grant_windows = False
    try:
        await _steady(lambda: backend.written)
        assert 0 < backend.written <= spdyframes.INITIAL_WINDOW + 16384
    finally:
        reader.cancel()
        await conn.shutdown()


async def test_client_not_reading_the_socket_bounds_memory(
        firehose: tuple[StreamingServer, Firehose]) -> None:
    srv, backend = firehose
    # No flow control and the client stops reading its socket: only TCP buffers fill up.
    conn, reader = await _open_exec(srv.url_for(ExecRequest("c", ["x"], stderr=False)), False)
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    try:
        # Past the 1 s grace before TCP-only backpressure, it stops growing.
        await _steady(lambda: backend.written, settle=0.3, after=1.0)
        assert 0 < backend.written < 32 * 1024 * 1024
    finally:
        conn.writer.close()


async def test_idle_connection_is_closed_and_session_stopped() -> None:
    async with _firehose(1.0) as (srv, backend):
        await _idle_check(srv, backend)


async def _idle_check(srv: StreamingServer, backend: Firehose) -> None:
    # Idle timeout 1 s: a client that opens the streams, never reads and never sends
    # anything loses the connection, and the running command is stopped.
    conn, reader = await _open_exec(srv.url_for(ExecRequest("c", ["x"], stderr=False)), True)
    conn.grant_windows = False
    try:
        await asyncio.wait_for(backend.cancelled.wait(), 10)
        await asyncio.wait_for(reader, 10)  # the server closed the connection
    finally:
        reader.cancel()
        await conn.shutdown()


async def test_oversized_frame_is_a_protocol_error() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">II", 1, spdyframes.MAX_FRAME + 1))
    with pytest.raises(spdyframes.ProtocolError):
        await spdyframes.read_frame(reader, spdyframes.HeaderDecompressor())
