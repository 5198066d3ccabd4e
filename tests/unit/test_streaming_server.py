"""Streaming server edges: TLS, plain HTTP errors, websocket idle timeout, v1 websocket,
the SPDY-over-WebSocket tunnel's tokens, idle timeout and negotiation."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crishim.config import StreamingConfig
from crishim.streaming.client import (
    SpdyPortForward,
    UpgradeFailed,
    exec_spdy,
    exec_websocket,
    websocket_connect,
)
from crishim.streaming.interface import ExecRequest, PortForwardRequest
from crishim.streaming.server import StreamingServer
from crishim.streaming.tunnel import tunnel_protocols
from tests.fakes.streaming import FakeBackend


async def _raw(srv: StreamingServer, data: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", srv.port)
    w.write(data)
    await w.drain()
    out = await asyncio.wait_for(r.read(), 5)
    w.close()
    return out


@pytest.fixture
async def server() -> AsyncIterator[tuple[StreamingServer, FakeBackend]]:
    backend = FakeBackend()
    srv = StreamingServer(StreamingConfig(idle_timeout=1.0), backend)
    await srv.start()
    try:
        yield srv, backend
    finally:
        await srv.stop()


async def test_plain_http_errors(server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    assert (await _raw(srv, b"GET /nothing HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
    assert (await _raw(srv, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
    url = srv.url_for(ExecRequest("c", ["true"]))
    path = url.split(str(srv.port), 1)[1]
    # A GET without an upgrade is refused with 400 (and the token is spent).
    assert (await _raw(srv, f"GET {path} HTTP/1.1\r\n\r\n".encode())).startswith(
        b"HTTP/1.1 400")
    assert backend.started == []


async def test_websocket_idle_timeout_stops_the_session(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    # idle_timeout = 1 s: a silent client and a silent command get disconnected, and the
    # command is killed.
    url = srv.url_for(ExecRequest("c", ["sleep", "60"], stderr=False))
    ws, _ = await websocket_connect(url, ["v5.channel.k8s.io"])
    try:
        assert await asyncio.wait_for(ws.recv(), 5) == (2, b"\x01")  # ready message
        assert await asyncio.wait_for(ws.recv(), 10) is None  # server went away
        for _ in range(100):
            if backend.killed:
                break
            await asyncio.sleep(0.05)
        assert backend.killed == 1
    finally:
        ws.writer.close()


async def test_websocket_v1_protocol_and_no_subprotocol(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    res = await exec_websocket(srv.url_for(ExecRequest("c", ["sh", "-c", "echo a; exit 2"])),
                               protocols=["channel.k8s.io"])
    assert res.protocol == "channel.k8s.io"
    assert res.stdout == b"a\n" and b"exit status 2" in res.error  # v1: plain text error
    res = await exec_websocket(srv.url_for(ExecRequest("c", ["echo", "b"])), protocols=[])
    assert res.stdout == b"b\n"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
async def test_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    proc = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    assert await proc.wait() == 0
    srv = StreamingServer(StreamingConfig(tls_cert=str(cert), tls_key=str(key)), FakeBackend())
    await srv.start()
    try:
        url = srv.url_for(ExecRequest("c", ["echo", "secure"], stderr=False))
        assert url.startswith("https://127.0.0.1:")
        res = await asyncio.wait_for(exec_spdy(url, stderr=False), 10)
        assert res.stdout == b"secure\n" and res.exit_code == 0
        res = await asyncio.wait_for(
            exec_websocket(srv.url_for(ExecRequest("c", ["echo", "ws"]))), 10)
        assert res.stdout == b"ws\n"
    finally:
        await srv.stop()


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
