"""SPDY/3.1 tunnelled through a WebSocket (client-go's port-forward since 1.31): the byte
stream adapters, negotiation, and a whole session against the streaming server."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator

import pytest

from crishim.config import StreamingConfig
from crishim.streaming import spdy
from crishim.streaming.client import SpdyPortForward, UpgradeFailed, websocket_connect
from crishim.streaming.interface import ExecRequest, PortForwardRequest
from crishim.streaming.server import StreamingServer
from crishim.streaming.tunnel import (
    MessageReader,
    MessageWriter,
    tunnel_protocols,
    tunnelled,
)
from crishim.streaming.websocket import OP_BINARY, OP_TEXT, WebSocket, WebSocketError
from tests.unit.test_streaming_protocols import FakeBackend, _echo_server


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
        frame = spdy.data_frame(1, 0, b"hello")
        await client.send(frame[:3])
        await client.send(frame[3:9])
        await client.send(frame[9:] + spdy.ping(1) + spdy.ping(3))
        reader = MessageReader(server)
        decomp = spdy.HeaderDecompressor()
        got = await spdy.read_frame(reader, decomp)
        assert got is not None and (got.stream_id, got.data) == (1, b"hello")
        for ping_id in (1, 3):
            got = await spdy.read_frame(reader, decomp)
            assert got is not None and got.type == spdy.PING and got.ping_id == ping_id
        await client.close()
        assert await spdy.read_frame(reader, decomp) is None  # clean end between frames
    finally:
        srv.close()


async def test_reader_refuses_text_and_reports_a_cut_frame() -> None:
    server, client, srv = await _ws_pair()
    try:
        await client.send(b"x", OP_TEXT)
        with pytest.raises(WebSocketError):
            await MessageReader(server).readexactly(1)
        await client.send(spdy.data_frame(1, 0, b"abcdef")[:10])
        await client.close()
        with pytest.raises(spdy.ProtocolError):
            await spdy.read_frame(MessageReader(server), spdy.HeaderDecompressor())
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


@pytest.fixture
async def server() -> AsyncIterator[tuple[StreamingServer, FakeBackend]]:
    backend = FakeBackend()
    srv = StreamingServer(StreamingConfig(address="127.0.0.1", port=0, idle_timeout=1.0),
                          backend, stream_creation_timeout=5)
    await srv.start()
    try:
        yield srv, backend
    finally:
        await srv.stop()


async def test_portforward_session_through_the_tunnel(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    echo, port = await _echo_server()
    try:
        # No ports in the request or URL: the SPDY streams name them, as over plain SPDY.
        pf = await SpdyPortForward.connect_tunnel(srv.url_for(PortForwardRequest("p1", [])))
        try:
            # Bigger than the 64 KiB windows and the 32 KiB client messages.
            payloads = [os.urandom(150_000 + i) for i in range(5)]
            answers = await asyncio.wait_for(
                asyncio.gather(*(pf.request(port, p) for p in payloads)), 20)
            assert [a[0] for a in answers] == payloads
            assert all(a[1] == b"" for a in answers)
            assert backend.dials == 5
        finally:
            await pf.close()
    finally:
        echo.close()


async def test_tunnel_token_is_single_use_and_idle_sessions_end(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    url = srv.url_for(PortForwardRequest("p1", []))
    pf = await SpdyPortForward.connect_tunnel(url)
    try:
        with pytest.raises(UpgradeFailed) as exc:
            await SpdyPortForward.connect_tunnel(url)
        assert exc.value.status == 404
        # idle_timeout = 1 s: the server's SPDY watchdog ends the silent session.
        await asyncio.wait_for(pf.conn.closed.wait(), 10)
    finally:
        await pf.close()


async def test_tunnel_is_for_portforward_only(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    with pytest.raises(UpgradeFailed) as exc:
        await websocket_connect(srv.url_for(ExecRequest("c", ["true"])),
                                tunnel_protocols(["v4.channel.k8s.io"]))
    assert exc.value.status == 400 and "subprotocol" in exc.value.body
    assert backend.started == []
