"""Broken and hostile HTTP/2 clients against the gRPC servers, in-process: crishim/rpc
(`grpc_server = "native"`) with small limits, and grpcio's aio server. Each malformed
frame gets RFC 9113's answer from the native server; every attack leaves both servers
answering a normal call at once. (tests/e2e/test_rpc_hostile.py runs the attacks at
full size against real daemons and measures their memory.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crishim.rpc import frames as fr
from crishim.rpc.limits import Limits
from crishim.rpc.method import Context, Method
from crishim.rpc.server import Server
from tests.e2e import h2raw

LIMITS = Limits(max_connections=16, max_concurrent_streams=8, connection_window=1 << 17,
                max_buffered=1 << 20)
MAX = 4 << 20


def _identity(b: bytes) -> bytes:
    return b


async def _echo(request: bytes, ctx: Context | Any) -> bytes:
    return request


SLOW_RUNNING: list[int] = [0]  # Slow calls the server is running now


async def _slow(request: bytes, ctx: Context | Any) -> bytes:
    SLOW_RUNNING[0] += 1
    try:
        await asyncio.sleep(30)
    finally:
        SLOW_RUNNING[0] -= 1
    return b""


def _until(cond: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g}s"
        time.sleep(0.01)


async def _fail(request: bytes, ctx: Context | Any) -> bytes:
    await ctx.abort(grpc.StatusCode.NOT_FOUND, "no such container")
    raise AssertionError("aborted")


async def _big(request: bytes, ctx: Context | Any) -> bytes:
    return bytes(300_000)


PATHS = {h2raw.VERSION: _echo, "/test.Svc/Slow": _slow, h2raw.STATUS: _fail,
         "/test.Svc/Big": _big}


class Served:
    def __init__(self, kind: str, path: str, loop: asyncio.AbstractEventLoop,
                 native: Server | None) -> None:
        self.kind, self.path, self.loop, self.native = kind, path, loop, native

    def answers(self, within: float = 10.0) -> bool:
        """A normal call on a new connection is answered within `within` seconds (a server
        the attack starved would not answer at all; a loaded machine may be slow)."""
        with grpc.insecure_channel("unix://" + self.path) as ch:
            fn = ch.unary_unary(h2raw.VERSION, request_serializer=_identity,
                                response_deserializer=_identity)
            start = time.monotonic()
            reply = fn(b"hello", timeout=within)
            return reply == b"hello" and time.monotonic() - start < within


async def _start(kind: str, path: str) -> tuple[Any, Server | None]:
    if kind == "native":
        srv = Server({p: Method(_identity, _identity, h, False) for p, h in PATHS.items()},
                     MAX, LIMITS)
        await srv.start(path)
        return srv, srv
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams",
                                       LIMITS.max_concurrent_streams)])
    handlers: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for p, h in PATHS.items():
        service, method = p[1:].split("/")
        handlers.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(
            h, request_deserializer=_identity, response_serializer=_identity)
    server.add_generic_rpc_handlers(tuple(
        grpc.method_handlers_generic_handler(s, m) for s, m in handlers.items()))
    server.add_insecure_port("unix:" + path)
    await server.start()
    return server, None


@pytest.fixture(params=["native", "grpcio"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    kind: str = request.param
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    path = str(tmp_path / "s.sock")
    server, native = asyncio.run_coroutine_threadsafe(_start(kind, path), loop).result(10)
    try:
        yield Served(kind, path, loop, native)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0.1), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()


@pytest.mark.parametrize("name", list(h2raw.FRAME_CASES))
def test_a_malformed_frame_gets_the_rfc_s_error(served: Served, name: str) -> None:
    answer = h2raw.malformed(served.path, name)
    if served.kind == "native":
        assert answer == h2raw.FRAME_CASES[name][1:], name
    assert served.answers()


def test_streams_past_the_limit_are_refused(served: Served) -> None:
    with h2raw.Raw(served.path) as c:
        c.send(b"".join(c.headers(1 + 2 * i) for i in range(20)))
        refused = []
        for _ in range(20 - LIMITS.max_concurrent_streams):
            kind, _, sid, payload = c.read_frame(5)
            while kind != fr.RST_STREAM:
                kind, _, sid, payload = c.read_frame(5)
            refused.append((sid, int.from_bytes(payload, "big")))
        if served.kind == "native":
            assert refused == [(1 + 2 * i, fr.REFUSED_STREAM) for i in range(8, 20)]
        assert served.answers()


def test_connections_past_the_limit_take_idle_ones_places_or_are_refused(
        served: Served) -> None:
    """Idle connections (no call open) make room for new ones; when every connection
    has a call open, a new one gets GOAWAY ENHANCE_YOUR_CALM and is closed."""
    if served.kind == "grpcio":
        pytest.skip("grpcio's server has no connection limit")
    kept, closed = h2raw._connect_many(served.path, LIMITS.max_connections + 5)
    try:
        assert (len(kept), closed) == (LIMITS.max_connections, 5)
        assert served.answers()  # in place of an idle one
    finally:
        for c in kept:
            c.close()
    assert served.native is not None
    native = served.native
    _until(lambda: not native._connections, "the server sees them gone")
    busy = []
    try:
        for _ in range(LIMITS.max_connections):
            c = h2raw.Raw(served.path)
            busy.append(c)
            c.send(c.call(1, "/test.Svc/Slow"))
        _until(lambda: SLOW_RUNNING[0] == LIMITS.max_connections, "every connection busy")
        with h2raw.Raw(served.path) as extra:
            assert extra.answer() == ("goaway", fr.ENHANCE_YOUR_CALM)
    finally:
        for c in busy:
            c.close()
    time.sleep(0.3)
    assert served.answers()


def test_replies_left_unread_stop_the_reads(served: Served) -> None:
    out = h2raw.failing_calls_unread(served.path, calls=60_000)
    try:
        assert "stopped reading: True" in out.answer
        assert served.answers()
    finally:
        out.close()


@pytest.mark.parametrize("kind", [fr.PING, fr.SETTINGS])
def test_control_frames_left_unread_stop_the_reads_or_end_the_connection(
        served: Served, kind: int) -> None:
    out = h2raw.control_flood_unread(served.path, kind, n=300_000)
    try:
        if served.kind == "native":
            assert "stopped reading: True" in out.answer or str(
                ("goaway", fr.ENHANCE_YOUR_CALM)) in out.answer, out.answer
        assert served.answers()
    finally:
        out.close()


def test_request_bytes_held_stay_within_the_budget(served: Served) -> None:
    out = h2raw.never_ending_bodies(served.path, calls=100, body=32_000,
                                    per_connection=LIMITS.max_concurrent_streams)
    try:
        if served.native is not None:
            assert " 0 connections stalled" not in out.answer, out.answer  # windows shut
            held = asyncio.run_coroutine_threadsafe(_held(served.native), served.loop).result(5)
            # The budget, plus what each connection may always hold and its open window.
            assert held <= LIMITS.max_buffered + len(out.held) * (
                65535 + LIMITS.connection_window), out.answer
        out.close()
        time.sleep(0.2)
        assert served.answers()
        if served.native is not None:
            assert asyncio.run_coroutine_threadsafe(_held(served.native),
                                                    served.loop).result(5) == 0
    finally:
        out.close()


async def _held(server: Server) -> int:
    return server._budget.held


@pytest.mark.parametrize("attack", ["rapid_reset", "empty_frames", "continuation_flood",
                                    "zero_length_headers", "hpack_bomb"])
def test_floods_leave_the_server_answering(served: Served, attack: str) -> None:
    out = getattr(h2raw, attack)(served.path)
    try:
        assert served.answers()
    finally:
        out.close()


def test_replies_held_back_by_the_client_s_windows_stay_within_the_budget(
        served: Served) -> None:
    """A client that opens no window for replies: what waits for it is held within the
    budget, and calls past it fail with RESOURCE_EXHAUSTED instead of piling up."""
    conns = [h2raw.Raw(served.path, settings={fr.INITIAL_WINDOW_SIZE: 0}) for _ in range(6)]
    try:
        for c in conns:
            c.send(b"".join(c.call(1 + 2 * i, "/test.Svc/Big")
                            for i in range(LIMITS.max_concurrent_streams)))
        time.sleep(1.0)
        if served.native is not None:
            held = asyncio.run_coroutine_threadsafe(_held(served.native), served.loop).result(5)
            assert held <= LIMITS.max_buffered + len(conns) * 65535
            exhausted = 0
            for c in conns:
                try:
                    while True:
                        kind, _, _, payload = c.read_frame(0.2)
                        exhausted += kind == fr.HEADERS and fr.literal(
                            b"grpc-status", b"8") in payload
                except (TimeoutError, h2raw.Closed):
                    pass
            assert exhausted >= len(conns) * LIMITS.max_concurrent_streams - (
                LIMITS.max_buffered // 300_000 + len(conns))
        assert served.answers()
    finally:
        for c in conns:
            c.close()
