"""The streaming server end to end over loopback with a fake backend (local processes).

The clients are crishim.streaming.client (SPDY and WebSocket), the backend runs commands
on this machine instead of in a container and port-forwards to local TCP servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest

from crishim.config import StreamingConfig
from crishim.streaming.client import (
    SpdyPortForward,
    UpgradeFailed,
    exec_spdy,
    exec_websocket,
    spdy_connect,
    websocket_portforward,
)
from crishim.streaming.interface import (
    AttachRequest,
    ExecRequest,
    PortForwardRequest,
)
from crishim.streaming.server import StreamingServer
from tests.fakes.streaming import FakeBackend


@pytest.fixture
async def server() -> AsyncIterator[tuple[StreamingServer, FakeBackend]]:
    backend = FakeBackend()
    srv = StreamingServer(StreamingConfig(address="127.0.0.1", port=0, idle_timeout=30),
                          backend, stream_creation_timeout=5)
    await srv.start()
    try:
        yield srv, backend
    finally:
        await srv.stop()


def _exec(srv: StreamingServer, cmd: list[str], **kw: bool) -> str:
    return srv.url_for(ExecRequest("c1", cmd, **kw))


@pytest.mark.parametrize("code", [0, 7])
async def test_spdy_v4_exec_exit_code(server: tuple[StreamingServer, FakeBackend],
                                      code: int) -> None:
    srv, _ = server
    url = _exec(srv, ["sh", "-c", f"echo hello; echo oops >&2; exit {code}"])
    res = await asyncio.wait_for(exec_spdy(url), 10)
    assert res.protocol == "v4.channel.k8s.io"
    assert res.stdout == b"hello\n"
    assert res.stderr == b"oops\n"
    assert res.exit_code == code
    if code == 0:
        assert res.status == {"metadata": {}, "status": "Success"}
    else:
        assert res.status["reason"] == "NonZeroExitCode"
        assert res.status["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]


@pytest.mark.parametrize("code", [0, 7])
async def test_websocket_v5_exec_exit_code(server: tuple[StreamingServer, FakeBackend],
                                           code: int) -> None:
    srv, _ = server
    url = _exec(srv, ["sh", "-c", f"echo hello; echo oops >&2; exit {code}"])
    res = await asyncio.wait_for(exec_websocket(url), 10)
    assert res.protocol == "v5.channel.k8s.io"
    assert (res.stdout, res.stderr, res.exit_code) == (b"hello\n", b"oops\n", code)


async def test_spdy_older_protocols_report_failure_as_text(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    res = await exec_spdy(_exec(srv, ["sh", "-c", "exit 3"]),
                          protocols=["v9.channel.k8s.io", "v3.channel.k8s.io"])
    assert res.protocol == "v3.channel.k8s.io"
    assert b"non-zero exit code" in res.error and b"3" in res.error
    ok = await exec_spdy(_exec(srv, ["true"]), protocols=["v2.channel.k8s.io"])
    assert ok.error == b""  # v1-v3 write nothing on success


async def test_stdin_round_trip_spdy_and_websocket(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    payload = os.urandom(300 * 1024).hex().encode()  # 600 KiB: many windows' worth
    res = await asyncio.wait_for(
        exec_spdy(_exec(srv, ["cat"], stdin=True, stderr=False), stdin=payload), 20)
    assert res.stdout == payload and res.exit_code == 0
    res = await asyncio.wait_for(
        exec_websocket(_exec(srv, ["cat"], stdin=True, stderr=False), stdin=b"ping\n"), 10)
    assert res.stdout == b"ping\n" and res.exit_code == 0


async def test_spdy_peer_without_flow_control_still_gets_everything(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    # kubectl's spdystream never sends WINDOW_UPDATE: output beyond 64 KiB must still flow.
    srv, _ = server
    url = _exec(srv, ["sh", "-c", "head -c 300000 /dev/zero"], stderr=False)
    res = await asyncio.wait_for(exec_spdy(url, flow_control=False), 20)
    assert len(res.stdout) == 300000 and res.exit_code == 0


@pytest.mark.parametrize("proto", ["spdy", "websocket"])
async def test_tty_with_resize(server: tuple[StreamingServer, FakeBackend],
                               proto: str) -> None:
    srv, _ = server
    # Wait (bounded by the test timeout) until the resize arrived, then print the size.
    script = 'while [ "$(stty size)" != "45 123" ]; do sleep 0.05; done; stty size; exit 4'
    url = srv.url_for(ExecRequest("c1", ["sh", "-c", script], tty=True, stdin=False,
                                  stderr=False))
    if proto == "spdy":
        res = await asyncio.wait_for(exec_spdy(url, tty=True, resize=[(123, 45)]), 10)
    else:
        res = await asyncio.wait_for(exec_websocket(url, resize=[(123, 45)]), 10)
    assert b"45 123" in res.stdout
    assert res.stderr == b""
    assert res.exit_code == 4


async def test_attach_over_both(server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    res = await exec_spdy(srv.url_for(AttachRequest("c9", stderr=False)), stderr=False)
    assert res.stdout == b"attached to c9\n" and res.exit_code == 0
    res = await exec_websocket(srv.url_for(AttachRequest("c9", stderr=False)))
    assert res.stdout == b"attached to c9\n"


async def test_replayed_or_guessed_token_is_404(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    url = _exec(srv, ["echo", "once"])
    assert (await exec_spdy(url)).stdout == b"once\n"
    for bad in (url, url.rsplit("/", 1)[0] + "/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                url.replace("/exec/", "/attach/")):
        with pytest.raises(UpgradeFailed) as exc:
            await exec_spdy(bad)
        assert exc.value.status == 404
        with pytest.raises(UpgradeFailed) as exc:
            await exec_websocket(bad)
        assert exc.value.status == 404
    assert backend.started == [["echo", "once"]]


async def test_token_for_other_kind_is_404_and_consumed(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    url = _exec(srv, ["echo", "x"])
    with pytest.raises(UpgradeFailed) as exc:
        await exec_spdy(url.replace("/exec/", "/portforward/"))
    assert exc.value.status == 404
    with pytest.raises(UpgradeFailed):
        await exec_spdy(url)
    assert backend.started == []


async def test_protocol_negotiation_failure_is_403(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    with pytest.raises(UpgradeFailed) as exc:
        await exec_spdy(_exec(srv, ["true"]), protocols=["v99.channel.k8s.io"])
    assert exc.value.status == 403 and "unable to negotiate" in exc.value.body
    assert backend.started == []


async def test_client_leaving_kills_the_exec(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, backend = server
    url = _exec(srv, ["sleep", "300"], stderr=False)
    task = asyncio.create_task(exec_spdy(url, stderr=False))
    for _ in range(100):
        if backend.started:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    task.cancel()  # the client goes away mid-session
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for _ in range(100):
        if backend.killed:
            break
        await asyncio.sleep(0.05)
    assert backend.killed == 1


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


@pytest.mark.parametrize("tunnel", [False, True], ids=["spdy", "spdy-over-websocket"])
async def test_spdy_portforward_20_concurrent(
        server: tuple[StreamingServer, FakeBackend], tunnel: bool) -> None:
    srv, backend = server
    echo, port = await _echo_server()
    try:
        url = srv.url_for(PortForwardRequest("p1", [port]))
        pf = await (SpdyPortForward.connect_tunnel(url) if tunnel
                    else SpdyPortForward.connect(url))
        try:
            payloads = [os.urandom(20_000 + i) for i in range(20)]
            answers = await asyncio.wait_for(
                asyncio.gather(*(pf.request(port, p) for p in payloads)), 20)
            assert [a[0] for a in answers] == payloads
            assert all(a[1] == b"" for a in answers)
            assert backend.dials == 20
        finally:
            await pf.close()
    finally:
        echo.close()


async def test_spdy_portforward_refused_port_reports_error(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pf = await SpdyPortForward.connect(srv.url_for(PortForwardRequest("p1", [])))
    try:
        data, err = await asyncio.wait_for(pf.request(port, b"x"), 10)
        assert data == b""
        assert f"error forwarding port {port}".encode() in err
    finally:
        await pf.close()


async def _one_line_server() -> tuple[asyncio.Server, int]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        line = await r.readline()
        w.write(b"got " + line)
        await w.drain()
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_websocket_portforward_20_concurrent(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    line_srv, port = await _one_line_server()
    try:
        urls = [srv.url_for(PortForwardRequest("p1", [port])) for _ in range(20)]
        answers = await asyncio.wait_for(asyncio.gather(
            *(websocket_portforward(u, port, f"hello {i}\n".encode())
              for i, u in enumerate(urls))), 20)
        assert [a[0] for a in answers] == [f"got hello {i}\n".encode() for i in range(20)]
        assert all(a[1] == b"" for a in answers)
    finally:
        line_srv.close()


async def test_websocket_portforward_port_prefix_and_protocol(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    line_srv, port = await _one_line_server()
    try:
        url = srv.url_for(PortForwardRequest("p1", [port]))
        # The client checks the little-endian port prefix of both channels.
        data, err = await websocket_portforward(url, port, b"x\n",
                                                protocols=["portforward.k8s.io"])
        assert (data, err) == (b"got x\n", b"")
    finally:
        line_srv.close()


async def test_out_of_order_stream_id_is_refused_not_fatal(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    srv, _ = server
    # SPDY ids must grow: like the kubelet's spdystream we reset just the offending stream.
    url = _exec(srv, ["echo", "still fine"], stderr=False)
    conn, _, reader = await spdy_connect(url, ["v4.channel.k8s.io"])
    try:
        conn._next_id = 5
        err = await conn.open_stream({"streamType": "error"})
        await err.close()
        conn._next_id = 3
        bad = await conn.open_stream({"streamType": "stdout"})
        conn._next_id = 7
        out = await conn.open_stream({"streamType": "stdout"})
        await out.close()
        assert await asyncio.wait_for(out.read(), 10) == b"still fine\n"
        assert bad.reset_received
    finally:
        await conn.shutdown()
        reader.cancel()


async def test_spdy_stdin_stream_is_never_half_closed_by_the_server(
        server: tuple[StreamingServer, FakeBackend]) -> None:
    """crictl/kubectl (spdystream) stop forwarding keystrokes once the server sends FIN on
    the stdin stream, so an interactive `crictl exec -it` would hang: stdin typed after the
    session started must still arrive, and the server must not have closed that stream."""
    srv, _ = server
    url = _exec(srv, ["cat"], stdin=True, stdout=True, stderr=False)
    conn, _, reader = await spdy_connect(url, ("v4.channel.k8s.io",), flow_control=False)
    try:
        await conn.open_stream({"streamType": "error"})
        sin = await conn.open_stream({"streamType": "stdin"})
        out = await conn.open_stream({"streamType": "stdout"})
        await asyncio.sleep(0.3)  # the session is running; a typed line comes later
        assert not sin.remote_closed, "server half-closed the client's stdin stream"
        await sin.write(b"typed later\n")
        await sin.close()
        got = b""
        async with asyncio.timeout(10):
            while chunk := await out.read():
                got += chunk
        assert got == b"typed later\n"
    finally:
        await conn.shutdown()
        reader.cancel()
