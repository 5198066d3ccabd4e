"""crishim/rpc, the gRPC server on the event loop, driven by grpcio's own client (as a
kubelet's Go client would drive it): replies, statuses, streams, deadlines, large
messages both ways, cancellation, and a graceful stop."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest

from crishim.rpc import frames as fr
from crishim.rpc import grpcwire
from crishim.rpc.connection import Connection
from crishim.rpc.method import Answer, Context, Method
from crishim.rpc.server import Server

SERVICE = "/test.Svc/"
MAX = 1024 * 1024
BIG = os.urandom(300_000)  # several default windows and frames


def _identity(b: bytes) -> bytes:
    return b


def _crash(b: bytes) -> bytes:
    raise RuntimeError("boom")


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.started = asyncio.Event()  # a slow call reached its handler
        self.waited = 0

    async def echo(self, request: bytes, ctx: Context) -> bytes:
        return request

    async def big(self, request: bytes, ctx: Context) -> bytes:
        return BIG

    async def fail(self, request: bytes, ctx: Context) -> bytes:
        await ctx.abort(grpc.StatusCode.NOT_FOUND, "pod 'x' not found: ünïcode 100%")

    async def crash(self, request: bytes, ctx: Context) -> bytes:
        raise RuntimeError("boom")

    async def slow(self, request: bytes, ctx: Context) -> bytes:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"done"

    async def count(self, request: bytes, ctx: Context) -> AsyncIterator[bytes]:
        for i in range(int(request or b"3")):
            yield str(i).encode()

    async def meta(self, request: bytes, ctx: Context) -> bytes:
        return repr(ctx.invocation_metadata()).encode()

    async def too_big(self, request: bytes, ctx: Context) -> bytes:
        return bytes(MAX + 1)

    async def waits(self, request: bytes, ctx: Context) -> bytes:
        self.waited += 1
        await asyncio.sleep(0.01)
        return b"waited"

    def methods(self) -> dict[str, Method]:
        unary: dict[str, Callable[..., Any]] = {
            "Echo": self.echo, "Big": self.big, "Fail": self.fail, "Crash": self.crash,
            "Slow": self.slow, "TooBig": self.too_big, "Meta": self.meta}
        out = {SERVICE + n: Method(_identity, _identity, h, False) for n, h in unary.items()}
        out[SERVICE + "Count"] = Method(_identity, _identity, self.count, True)
        # Answered where the request is read, as the server answers the relist; when
        # the answer gives no reply, the handler runs.
        answers: dict[str, tuple[Answer, Callable[..., Any]]] = {
            "Echo": (_identity, self.echo), "Big": (lambda b: BIG, self.big),
            "None": (lambda b: None, self.waits), "Crash": (_crash, self.fail),
            "TooBig": (lambda b: bytes(MAX + 1), self.too_big)}
        for n, (answer, h) in answers.items():
            out[SERVICE + "Answer" + n] = Method(_identity, _identity, h, False, answer)
        return out


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, Server, Handlers, str]]:
    """The server on a loop in its own thread; tests call it with grpcio's blocking client."""
    loop = asyncio.new_event_loop()
    handlers = Handlers()
    path = str(tmp_path / "s.sock")

    async def make() -> tuple[Server, Handlers]:
        h = Handlers()  # its events belong to this loop
        srv = Server(h.methods(), MAX)
        await srv.start(path)
        return srv, h

    import threading
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    srv, handlers = asyncio.run_coroutine_threadsafe(make(), loop).result(10)
    try:
        yield loop, srv, handlers, path
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(1), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()


def _call(path: str, method: str, request: bytes = b"", timeout: float = 10,
          ch: grpc.Channel | None = None) -> bytes:
    own = ch is None
    ch = ch or grpc.insecure_channel("unix://" + path, options=[
        ("grpc.max_receive_message_length", 16 * MAX)])
    try:
        fn = ch.unary_unary(SERVICE + method, request_serializer=_identity,
                            response_deserializer=_identity)
        return fn(request, timeout=timeout)  # type: ignore[no-any-return]
    finally:
        if own:
            ch.close()


def test_unary_replies_small_and_large(served: Any) -> None:
    _, _, _, path = served
    with grpc.insecure_channel("unix://" + path, options=[
            ("grpc.max_receive_message_length", 16 * MAX)]) as ch:
        assert _call(path, "Echo", b"hello", ch=ch) == b"hello"
        assert _call(path, "Echo", b"", ch=ch) == b""
        big_request = os.urandom(200_000)  # past the server's default frame, many frames
        assert _call(path, "Echo", big_request, ch=ch) == big_request
        for _ in range(3):
            assert _call(path, "Big", ch=ch) == BIG


def test_statuses_reach_the_client(served: Any) -> None:
    _, _, _, path = served
    with pytest.raises(grpc.RpcError) as err:
        _call(path, "Fail")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "pod 'x' not found: ünïcode 100%"
    with pytest.raises(grpc.RpcError) as err:
        _call(path, "NoSuchMethod")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as err:
        _call(path, "Crash")
    assert err.value.code() == grpc.StatusCode.UNKNOWN and "boom" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        _call(path, "TooBig")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as err:
        _call(path, "Echo", bytes(MAX + 1))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _call(path, "Echo", b"after errors") == b"after errors"


def test_handlers_see_the_trace_context_of_their_own_call(served: Any) -> None:
    _, _, _, path = served
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with grpc.insecure_channel("unix://" + path) as ch:
        meta = ch.unary_unary(SERVICE + "Meta", request_serializer=_identity,
                              response_deserializer=_identity)
        # Only the W3C keys are kept; the same header block again (read once, then
        # cached) and a different one each give their own.
        for _ in range(2):
            assert meta(b"", metadata=[("traceparent", parent), ("tracestate", "k=v"),
                                       ("x-other", "1")], timeout=10) == \
                repr((("traceparent", parent), ("tracestate", "k=v"))).encode()
        other = parent.replace("b7ad", "c7ad")
        assert meta(b"", metadata=[("traceparent", other)], timeout=10) == \
            repr((("traceparent", other),)).encode()
        assert meta(b"", timeout=10) == b"()"


def test_server_streaming(served: Any) -> None:
    _, _, _, path = served
    with grpc.insecure_channel("unix://" + path) as ch:
        fn = ch.unary_stream(SERVICE + "Count", request_serializer=_identity,
                             response_deserializer=_identity)
        assert list(fn(b"5", timeout=10)) == [b"0", b"1", b"2", b"3", b"4"]
        assert list(fn(b"0", timeout=10)) == []


def test_a_deadline_ends_the_call_and_cancels_the_handler(served: Any) -> None:
    loop, _, handlers, path = served
    with pytest.raises(grpc.RpcError) as err:
        _call(path, "Slow", timeout=0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    asyncio.run_coroutine_threadsafe(asyncio.wait_for(handlers.cancelled.wait(), 5),
                                     loop).result(10)


def test_a_cancelled_call_cancels_the_handler(served: Any) -> None:
    loop, _, handlers, path = served
    with grpc.insecure_channel("unix://" + path) as ch:
        fn = ch.unary_unary(SERVICE + "Slow", request_serializer=_identity,
                            response_deserializer=_identity)
        fut = fn.future(b"", timeout=30)
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(handlers.started.wait(), 30),
                                         loop).result(40)
        fut.cancel()
    asyncio.run_coroutine_threadsafe(asyncio.wait_for(handlers.cancelled.wait(), 5),
                                     loop).result(10)


def test_stop_lets_calls_under_way_finish_and_refuses_new_ones(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Handlers()
        srv = Server(h.methods(), MAX)
        path = str(tmp_path / "stop.sock")
        await srv.start(path)
        ch = grpc.aio.insecure_channel("unix://" + path)
        slow = ch.unary_unary(SERVICE + "Slow", request_serializer=_identity,
                              response_deserializer=_identity)
        under_way = asyncio.ensure_future(slow(b"", timeout=30))
        await asyncio.wait_for(h.started.wait(), 30)
        stopping = asyncio.ensure_future(srv.stop(5))
        await asyncio.sleep(0.2)
        h.release.set()
        assert await under_way == b"done"
        await stopping
        with pytest.raises(grpc.aio.AioRpcError):
            await slow(b"", timeout=2)
        await ch.close()

    asyncio.run(scenario())


def test_garbage_closes_the_connection_only(served: Any) -> None:
    _, _, _, path = served
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data  # SETTINGS, then GOAWAY, then the socket closes
    assert _call(path, "Echo", b"still serving") == b"still serving"


def test_answered_methods_reply_as_their_handlers_would(served: Any) -> None:
    _, _, handlers, path = served
    with grpc.insecure_channel("unix://" + path, options=[
            ("grpc.max_receive_message_length", 16 * MAX)]) as ch:
        for _ in range(3):
            assert _call(path, "AnswerEcho", b"hi", ch=ch) == b"hi"
            assert _call(path, "AnswerEcho", b"", ch=ch) == b""
        for _ in range(3):  # larger than the client's first window: the handler sends it
            assert _call(path, "AnswerBig", ch=ch) == BIG
        assert _call(path, "AnswerNone", ch=ch) == b"waited"  # no answer: the handler's
        for name, code in (("AnswerCrash", grpc.StatusCode.NOT_FOUND),
                           ("AnswerTooBig", grpc.StatusCode.RESOURCE_EXHAUSTED)):
            with pytest.raises(grpc.RpcError) as err:
                _call(path, name, ch=ch)
            assert err.value.code() == code  # the handler's status
    assert handlers.waited == 1


def _feed(conn: Connection, data: bytes) -> None:
    """As the transport hands a connection what it reads."""
    while data:
        room = conn.get_buffer(-1)
        n = min(len(room), len(data))
        room[:n] = data[:n]
        del room
        conn.buffer_updated(n)
        data = data[n:]


class _Wire(asyncio.Transport):
    """A transport that keeps what the connection writes."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()

    def write(self, data: Any) -> None:
        self.out += data

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _SlowWire(_Wire):
    """One whose peer reads nothing: it holds what it was given (as Python 3.12's
    transports hold a view of a write they could not send whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Any] = []

    def write(self, data: Any) -> None:
        self.held.append(data)
        super().write(data)

    def get_write_buffer_size(self) -> int:
        return sum(len(d) for d in self.held)

    def close(self) -> None:
        pass


def test_a_repeated_header_block_is_read_again_once_the_table_changes() -> None:
    """The same bytes of table references mean other fields after the client's encoder
    adds an entry: the server must not answer them from what they meant before."""
    async def scenario() -> None:
        handlers = Handlers()
        conn = Connection(handlers.methods(), MAX, lambda c: None)
        wire = _Wire()
        conn.connection_made(wire)
        _feed(conn, fr.PREFACE + fr.settings({}))
        encoder, replies = hpack.Encoder(), hpack.Decoder()
        stream = iter(range(1, 99, 2))

        def call(block: bytes) -> list[tuple[str, str]]:
            sid = next(stream)
            wire.out.clear()
            _feed(conn, fr.frame(fr.HEADERS, fr.END_HEADERS, sid, block)
                  + fr.frame(fr.DATA, fr.END_STREAM, sid, grpcwire.message(b"hi")))
            fields: list[tuple[str, str]] = []
            out = bytes(wire.out)
            while out:
                length, kind = int.from_bytes(out[:3], "big"), out[3]
                if kind == fr.HEADERS and int.from_bytes(out[5:9], "big") == sid:
                    fields += replies.decode(out[9:9 + length])
                elif kind == fr.DATA and out[9 + 5:9 + length] == b"hi":
                    fields.append(("echo", "hi"))
                out = out[9 + length:]
            return fields

        def head(path: str) -> list[tuple[str, str]]:
            return [(":method", "POST"), (":scheme", "http"),
                    ("content-type", "application/grpc"), ("te", "trailers"), (":path", path)]

        first = encoder.encode(head(SERVICE + "AnswerEcho"))
        assert ("echo", "hi") in call(first)
        again = encoder.encode(head(SERVICE + "AnswerEcho"))
        assert len(again) == 5  # table references only
        assert ("echo", "hi") in call(again)
        assert ("echo", "hi") in call(again)  # read once, answered the same
        assert ("grpc-status", "12") in call(encoder.encode(head(SERVICE + "Nowhere")))
        # A new entry shifted the table: `again` now names te as its content-type and
        # two paths, and that is no gRPC request.
        assert (":status", "415") in call(again)

    asyncio.run(scenario())


def _connected(methods: dict[str, Method], wire: _Wire) -> Connection:
    conn = Connection(methods, MAX, lambda c: None)
    conn.connection_made(wire)
    _feed(conn, fr.PREFACE + fr.settings({}))
    return conn


def _request(encoder: hpack.Encoder, sid: int, path: str, message: bytes = b"") -> bytes:
    """A unary call's frames (its message in one frame, so at most 16 KiB)."""
    block = encoder.encode([(":method", "POST"), (":path", path),
                            ("content-type", "application/grpc")])
    return (fr.frame(fr.HEADERS, fr.END_HEADERS, sid, block)
            + fr.frame(fr.DATA, fr.END_STREAM, sid, grpcwire.message(message)))


def _frames(out: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of each frame."""
    frames = []
    while out:
        length = int.from_bytes(out[:3], "big")
        frames.append((out[3], int.from_bytes(out[5:9], "big"), out[9:9 + length]))
        out = out[9 + length:]
    return frames


def test_an_answer_is_framed_once_and_sent_on_each_call_s_stream() -> None:
    """The relist's reply is the same bytes call after call: framed once, it must still
    go out on the stream of the call it answers, and a changed reply must go out
    changed."""
    async def scenario() -> None:
        reply = [b"first"]

        async def unused(request: bytes, ctx: Context) -> bytes:
            raise AssertionError("answered without the handler")

        methods = {SERVICE + "Read": Method(_identity, _identity, unused, False,
                                            lambda b: reply[0])}
        wire = _Wire()
        conn = _connected(methods, wire)
        encoder, trailers = hpack.Encoder(), hpack.Decoder()
        for sid, want in ((1, b"first"), (3, b"first"), (5, b"second"), (7, bytes(40_000))):
            reply[0] = want
            wire.out.clear()
            _feed(conn, _request(encoder, sid, SERVICE + "Read"))
            frames = _frames(bytes(wire.out))
            data = b"".join(payload for kind, _, payload in frames if kind == fr.DATA)
            assert data == grpcwire.message(want)
            assert {s for _, s, _ in frames} == {sid}
            assert [k for k, _, _ in frames] == (
                [fr.HEADERS] + [fr.DATA] * (len(data) // fr.DEFAULT_MAX_FRAME + 1) + [fr.HEADERS])
            assert ("grpc-status", "0") in trailers.decode(frames[-1][2])

        # A reply still held by the transport is never written into again.
        slow = _SlowWire()
        conn, encoder = _connected(methods, slow), hpack.Encoder()
        reply[0] = b"same"
        for sid in (1, 3):
            _feed(conn, _request(encoder, sid, SERVICE + "Read"))
        first, second = (bytes(d) for d in slow.held[-2:])
        assert int.from_bytes(first[5:9], "big") == 1
        assert int.from_bytes(second[5:9], "big") == 3

    asyncio.run(scenario())


def test_a_call_read_a_byte_at_a_time_is_answered() -> None:
    """Frames split anywhere across reads (the preface too) are put back together."""
    async def scenario() -> None:
        async def unused(request: bytes, ctx: Context) -> bytes:
            raise AssertionError("answered without the handler")

        wire = _Wire()
        conn = Connection({SERVICE + "Echo": Method(_identity, _identity, unused, False,
                                                     _identity)}, MAX, lambda c: None)
        conn.connection_made(wire)
        block = hpack.Encoder().encode([(":method", "POST"), (":path", SERVICE + "Echo"),
                                        ("content-type", "application/grpc")])
        message = grpcwire.message(os.urandom(40_000))
        data = fr.PREFACE + fr.settings({}) + fr.frame(fr.HEADERS, fr.END_HEADERS, 1, block)
        for at in range(0, len(message), fr.DEFAULT_MAX_FRAME):
            last = at + fr.DEFAULT_MAX_FRAME >= len(message)
            data += fr.frame(fr.DATA, fr.END_STREAM if last else 0, 1,
                             message[at:at + fr.DEFAULT_MAX_FRAME])
        for at in range(len(data)):
            _feed(conn, data[at:at + 1])
        echoed = b"".join(payload for kind, sid, payload in _frames(bytes(wire.out))
                          if kind == fr.DATA and sid == 1)
        assert echoed == message

    asyncio.run(scenario())


def test_headers_after_the_request_ended_reset_the_stream_and_run_nothing_again() -> None:
    """A second HEADERS with END_STREAM on a stream whose request has ended (half-closed
    remote, RFC 9113 5.1) is a stream error STREAM_CLOSED: the call does not run twice."""
    async def scenario() -> None:
        runs: list[bytes] = []
        release = asyncio.Event()

        async def slow(request: bytes, ctx: Context) -> bytes:
            runs.append(request)
            await release.wait()
            return b"done"

        wire = _Wire()
        conn = _connected({SERVICE + "Slow": Method(_identity, _identity, slow, False)}, wire)
        encoder = hpack.Encoder()
        _feed(conn, _request(encoder, 1, SERVICE + "Slow", b"once"))
        await asyncio.sleep(0)
        block = encoder.encode([(":method", "POST"), (":path", SERVICE + "Slow"),
                                ("content-type", "application/grpc")])
        wire.out.clear()
        _feed(conn, fr.frame(fr.HEADERS, fr.END_HEADERS | fr.END_STREAM, 1, block))
        for _ in range(5):
            await asyncio.sleep(0)
        assert runs == [b"once"]
        assert (fr.RST_STREAM, 1, (fr.STREAM_CLOSED).to_bytes(4, "big")) in _frames(
            bytes(wire.out))
        release.set()
        await asyncio.sleep(0.01)
        assert conn.tasks() == []

    asyncio.run(scenario())


def test_the_read_buffer_grows_for_a_burst_and_shrinks_when_reads_are_small() -> None:
    """An idle connection does not keep a large read buffer."""
    async def scenario() -> None:
        from crishim.rpc import connection

        wire = _Wire()
        conn = _connected({SERVICE + "Echo": Method(_identity, _identity, Handlers().echo,
                                                     False, _identity)}, wire)
        assert len(conn.get_buffer(-1)) <= connection.READ_SMALL
        encoder = hpack.Encoder()
        burst = b"".join(_request(encoder, 1 + 2 * i, SERVICE + "Echo", bytes(1000))
                         for i in range(40))
        _feed(conn, burst)  # fills the small buffer: the next read gets a large one
        assert len(conn.get_buffer(-1)) >= connection.READ_LARGE - fr.HEADER_LEN
        _feed(conn, _request(encoder, 101, SERVICE + "Echo", b"small"))
        assert len(conn.get_buffer(-1)) == connection.READ_SMALL
        replies = [sid for kind, sid, _ in _frames(bytes(wire.out)) if kind == fr.DATA]
        assert replies == [1 + 2 * i for i in range(40)] + [101]

    asyncio.run(scenario())


def test_a_connection_without_the_preface_is_closed(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    from crishim.rpc import connection

    monkeypatch.setattr(connection, "PREFACE_TIMEOUT", 0.2)

    async def scenario() -> None:
        srv = Server(Handlers().methods(), MAX)
        path = str(tmp_path / "p.sock")
        await srv.start(path)
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"PRI * HTTP/2.0")  # and nothing more
        data = await asyncio.wait_for(reader.read(), 5)  # until the server closes
        assert data.startswith(fr.frame_head(fr.SETTINGS, 0, 0, 24))
        writer.close()
        await srv.stop(1)

    asyncio.run(scenario())
