"""hack/benchlib/h2unary.py, the bench's thin client, against a real grpcio server: the
reply's bytes come back whole (large replies too, past the default flow-control window
and frame size), and a failed call is an error, never an empty reply."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from crishim.rpc.hpackdecoder import Decoder
from hack.benchlib import listfloor
from hack.benchlib.h2unary import (
    READ_BUFFER,
    USER_AGENT,
    CallError,
    H2Unary,
    Request,
    grpc_timeout,
)

SERVICE = "bench.test.Echo"
BIG = bytes(range(256)) * 1024  # 256 KiB: four default windows, sixteen default frames


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    def echo(request: bytes, context: Any) -> bytes:
        return request

    def big(request: bytes, context: Any) -> bytes:
        return BIG

    def fail(request: bytes, context: Any) -> bytes:
        context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        return b""

    handlers = {name: grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=_identity, response_serializer=_identity)
        for name, fn in (("Echo", echo), ("Big", big), ("Fail", fail))}
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    sock = str(tmp_path / "echo.sock")
    srv.add_insecure_port("unix:" + sock)
    srv.start()
    try:
        yield sock
    finally:
        srv.stop(grace=None)


def test_request_and_reply_bytes_cross_whole(server: str) -> None:
    with H2Unary(server, timeout=10) as client:
        for payload in (b"", b"hello", bytes(16_000)):
            assert client.call(f"/{SERVICE}/Echo", payload) == payload
        with pytest.raises(ValueError, match="does not fit one frame"):
            client.call(f"/{SERVICE}/Echo", bytes(17_000))


def test_a_reply_larger_than_the_default_window_arrives_whole(server: str) -> None:
    with H2Unary(server, timeout=10) as client:
        for _ in range(3):  # the connection's window is not used up by earlier calls
            assert client.call(f"/{SERVICE}/Big", b"") == BIG


def test_an_error_status_is_an_error(server: str) -> None:
    with H2Unary(server, timeout=10) as client:
        with pytest.raises(CallError, match="no reply message"):
            client.call(f"/{SERVICE}/Fail", b"")
        with pytest.raises(CallError):
            client.call(f"/{SERVICE}/NoSuchMethod", b"")
        assert client.call(f"/{SERVICE}/Echo", b"still usable") == b"still usable"


def test_deadlines_are_written_as_grpc_go_writes_them() -> None:
    assert grpc_timeout(120.0 - 1e-6) == b"120000m"  # the kubelet's two minutes
    assert grpc_timeout(0.05) == b"50000000n"
    assert grpc_timeout(1.5) == b"1500000u"
    assert grpc_timeout(200_000) == b"200000S"
    assert grpc_timeout(0) == b"0n"


def test_requests_carry_the_kubelets_headers_indexed_after_the_first(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen()
    with H2Unary(str(tmp_path / "s.sock")) as client:
        first = client.request(f"/{SERVICE}/Echo", b"")
        second = client.request(f"/{SERVICE}/Echo", b"")
    listener.close()
    assert (first.stream, second.stream) == (1, 3)
    decoder = Decoder(max_header_list_size=16384)

    def block(req: Request) -> bytes:
        length = int.from_bytes(req.frames[:3], "big")
        return req.frames[9:9 + length]

    want = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", f"/{SERVICE}/Echo".encode()),
            (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
            (b"user-agent", USER_AGENT), (b"te", b"trailers"), (b"grpc-timeout", b"120000m")]
    assert decoder.decode(block(first)) == want
    assert decoder.decode(block(second)) == want
    assert len(block(second)) == len(want)  # each field one byte: a table reference


def test_one_frame_larger_than_the_read_buffer_arrives_whole(tmp_path: Path) -> None:
    """crishim's server sends a reply in one DATA frame up to the client's frame size
    (16 MiB here): a frame larger than the client's read buffer still comes back whole,
    and the next, small, reply after it too."""
    huge = bytes(range(256)) * (3 * READ_BUFFER // 256 + 7)
    small = b"\x0a\x03abc"
    replies = {"ListPodSandbox": huge, "ListContainers": small}
    with listfloor.running(str(tmp_path), replies) as sock, H2Unary(sock, timeout=10) as client:
        for _ in range(2):
            assert client.call("/runtime.v1.RuntimeService/ListPodSandbox", b"") == huge
            assert client.call("/runtime.v1.RuntimeService/ListContainers", b"") == small
