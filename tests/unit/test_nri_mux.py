"""NRI's connection multiplexer (crishim/nri/mux.py), against the frames a real Go plugin
(nri-template, containerd/nri v0.12.0) sent (tests/unit/data/nri-template-*.bin)."""

from __future__ import annotations

import asyncio
import os
import struct

from crishim.nri import mux, ttrpc

DATA = os.path.join(os.path.dirname(__file__), "data")


class _Writer:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, b: bytes) -> None:
        self.data += b

    def close(self) -> None:
        self.closed = True


def _mux(raw: bytes) -> tuple[mux.Mux, _Writer, list[BaseException | None]]:
    reader = asyncio.StreamReader()
    reader.feed_data(raw)
    reader.feed_eof()
    w = _Writer()
    closed: list[BaseException | None] = []
    m = mux.Mux(reader, w, on_close=closed.append)  # type: ignore[arg-type]
    return m, w, closed


def _capture(name: str) -> bytes:
    with open(os.path.join(DATA, name), "rb") as fh:
        return fh.read()


async def test_go_trunk_demultiplexed() -> None:
    raw = _capture("nri-template-from-plugin.bin")
    m, _, closed = _mux(raw)
    plugin_conn = m.open(mux.PLUGIN_SERVICE_CONN)
    runtime_conn = m.open(mux.RUNTIME_SERVICE_CONN)
    await m.run()
    assert closed == [None]  # EOF is a clean close
    hdr, _ = await ttrpc.read_message(runtime_conn)
    assert (hdr.stream_id, hdr.type) == (1, ttrpc.TYPE_REQUEST)
    first, _ = await ttrpc.read_message(plugin_conn)
    second, _ = await ttrpc.read_message(plugin_conn)
    assert [(h.stream_id, h.type) for h in (first, second)] == [(1, ttrpc.TYPE_RESPONSE),
                                                                 (3, ttrpc.TYPE_RESPONSE)]


async def test_writes_match_go_framing() -> None:
    """What we sent the Go plugin, reframed by our mux, is byte for byte the capture."""
    raw = _capture("nri-template-to-plugin.bin")
    m, w, _ = _mux(b"")
    i = 0
    while i < len(raw):
        cid, n = struct.unpack(">II", raw[i:i + 8])
        m.write(cid, raw[i + 8:i + 8 + n])
        i += 8 + n
    assert bytes(w.data) == raw


async def test_unknown_conn_dropped_and_writes_split_for_go() -> None:
    frames = struct.pack(">II", 7, 3) + b"abc" + struct.pack(">II", 1, 2) + b"hi"
    m, _, _ = _mux(frames)
    conn = m.open(1)
    await m.run()
    assert await conn.readexactly(2) == b"hi"
    m2, w2, _ = _mux(b"")
    m2.write(1, b"x" * (2 * mux.FIRST_FRAME + 5))
    sizes = []
    data = bytes(w2.data)
    while data:
        cid, n = struct.unpack(">II", data[:8])
        sizes.append((cid, n))
        data = data[8 + n:]
    # As the Go reader needs them (a 4096-byte bufio.Reader over the mux), and as few
    # as Go's writer sends: its mux closes past 256 unread frames on a connection.
    assert sizes == [(1, 4096), (1, 4096 + 5)]
    m3, w3, _ = _mux(b"")
    m3.write(1, b"y" * 10)
    assert bytes(w3.data) == struct.pack(">II", 1, 10) + b"y" * 10


async def test_oversized_frame_closes_trunk() -> None:
    m, w, closed = _mux(struct.pack(">II", 1, mux.MAX_PAYLOAD + 1) + b"garbage")
    conn = m.open(1)
    await m.run()
    assert w.closed and isinstance(closed[0], mux.MuxError)
    try:
        await conn.readexactly(1)
    except asyncio.IncompleteReadError:
        pass
    else:
        raise AssertionError("connection should see EOF")


async def test_reserved_id_refused() -> None:
    m, _, _ = _mux(b"")
    try:
        m.open(0)
    except mux.MuxError:
        return
    raise AssertionError("id 0 must be refused")
