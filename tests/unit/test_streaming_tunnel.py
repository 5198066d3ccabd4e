"""SPDY/3.1 tunnelled through a WebSocket (client-go's port-forward since 1.31): the byte
stream adapters and protocol names (whole port-forward sessions run in
test_streaming_protocols.py over plain and tunnelled SPDY alike; tokens, idle timeout and
negotiation in test_streaming_server.py)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from crishim.streaming import spdyframes
from crishim.streaming.tunnel import (
    MessageReader,
    MessageWriter,
    tunnel_protocols,
    tunnelled,
)
from crishim.streaming.websocket import OP_BINARY, OP_TEXT, WebSocket, WebSocketError


async def _ws_pair() -> tuple[WebSocket, WebSocket, asyncio.Server]:
    """A connected (server, client) WebSocket pair over loopback TCP."""
    accepted: asyncio.Future[WebSocket] = asyncio.get_running_loop().create_future()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.set_result(WebSocket(r, w))

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    r, w = await asyncio.open_connection("127.0.0.1", srv.sockets[0].getsockname()[1])
    return await accepted, WebSocket(r, w, client=True), srv


def test_protocol_names() -> None:
    assert tunnel_protocols(["portforward.k8s.io"]) == ["SPDY/3.1+portforward.k8s.io"]
    assert tunnelled("SPDY/3.1+portforward.k8s.io") == "portforward.k8s.io"
    assert tunnelled("v4.channel.k8s.io") is None
    assert tunnelled("") is None


async def test_reader_joins_messages_and_splits_frames() -> None:
    server, client, srv = await _ws_pair()
    try:
        # One frame split over three messages, then two frames in one message.
        frame = spdyframes.data_frame(1, 0, b"hello")
        await client.send(frame[:3])
        await client.send(frame[3:9])
        await client.send(frame[9:] + spdyframes.ping(1) + spdyframes.ping(3))
        reader = MessageReader(server)
        decomp = spdyframes.HeaderDecompressor()
        got = await spdyframes.read_frame(reader, decomp)
        assert got is not None and (got.stream_id, got.data) == (1, b"hello")
        for ping_id in (1, 3):
            got = await spdyframes.read_frame(reader, decomp)
            assert got is not None and got.type == spdyframes.PING and got.ping_id == ping_id
        await client.close()
        assert await spdyframes.read_frame(reader, decomp) is None  # clean end between frames
    finally:
        srv.close()


async def test_reader_refuses_text_and_reports_a_cut_frame() -> None:
    server, client, srv = await _ws_pair()
    try:
        await client.send(b"x", OP_TEXT)
        with pytest.raises(WebSocketError):
            await MessageReader(server).readexactly(1)
        await client.send(spdyframes.data_frame(1, 0, b"abcdef")[:10])
        await client.close()
        with pytest.raises(spdyframes.ProtocolError):
            await spdyframes.read_frame(MessageReader(server), spdyframes.HeaderDecompressor())
    finally:
        srv.close()


async def test_writer_sends_one_message_per_drain_and_closes_normally() -> None:
    server, client, srv = await _ws_pair()
    try:
        writer = MessageWriter(server)
        writer.write(b"ab")
        writer.write(b"cd")
        await writer.drain()
        await writer.drain()  # nothing pending: no empty message
        writer.write(b"ef")
        await writer.drain()
        assert await client.recv() == (OP_BINARY, b"abcd")
        assert await client.recv() == (OP_BINARY, b"ef")
        writer.close()
        await writer.wait_closed()
        # The peer saw CLOSE 1000 (client-go turns it into EOF, not an error).
        raw = await client.reader.readexactly(4)
        assert raw[0] & 0x0F == 0x8 and struct.unpack(">H", raw[2:4])[0] == 1000
    finally:
        srv.close()
