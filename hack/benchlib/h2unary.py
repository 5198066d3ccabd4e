"""A thin, blocking gRPC unary caller over a unix socket: HTTP/2 frames written by hand.

What a call costs a runtime shows best through a client that adds next to nothing:
grpcio's client hands each call between its own threads (half a millisecond to a
millisecond and more after an idle second on this VM, whatever the server), which hides
much of the difference between servers. This client sends one pre-encoded request and reads the
reply in the calling thread: a write, a blocking read, a few frames parsed.

It speaks just what a unary call over a trusted local socket needs (the frames are
crishim/rpc/frames.py's): the connection preface, SETTINGS (and their ACK), PING ACK,
HEADERS with literal (unindexed, unencoded) fields, DATA; a window large enough that
the server never waits for a WINDOW_UPDATE. A request goes in one DATA frame, so it must
fit the smallest frame and window a server may announce (16 KiB): the CRI requests a
kubelet sends most are far smaller.
The reply's headers are not decoded: a reply with a message is a success, one without
is reported with the HPACK block's raw bytes (grpc-status is in it when literal).
"""

from __future__ import annotations

import socket
import struct

from crishim.rpc import grpcwire
from crishim.rpc.frames import (
    ACK,
    DATA,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    frame,
    literal,
    settings,
    strip_padding,
    window_update,
)

MAX_REQUEST = DEFAULT_MAX_FRAME - grpcwire.PREFIX_LEN  # one frame of the default size
# No push, the largest stream window, the largest frame.
OUR_SETTINGS = settings({ENABLE_PUSH: 0, INITIAL_WINDOW_SIZE: MAX_WINDOW,
                         MAX_FRAME_SIZE: 2**24 - 1})


class CallError(RuntimeError):
    pass


class H2Unary:
    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._buf = bytearray()
        self._next_stream = 1
        self._received = 0  # connection-level bytes since our last WINDOW_UPDATE
        self._sock.sendall(PREFACE + OUR_SETTINGS
                           + window_update(0, MAX_WINDOW - DEFAULT_WINDOW))
        self._headers: dict[str, bytes] = {}

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> H2Unary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request_head(self, method: str) -> bytes:
        block = self._headers.get(method)
        if block is None:
            block = b"".join(literal(n, v) for n, v in (
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
                (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
                (b"te", b"trailers")))
            self._headers[method] = block
        return block

    def call(self, method: str, request: bytes) -> bytes:
        """The serialized reply of unary `method` ("/pkg.Service/Method")."""
        if len(request) > MAX_REQUEST:
            raise ValueError(f"{method}: a request of {len(request)} bytes does not fit "
                             f"one frame (at most {MAX_REQUEST})")
        stream = self._next_stream
        self._next_stream += 2
        body = grpcwire.message(request)
        self._sock.sendall(frame(HEADERS, END_HEADERS, stream, self._request_head(method))
                           + frame(DATA, END_STREAM, stream, body))
        data = bytearray()
        trailer = b""
        while True:
            kind, flags, sid, payload = self._read_frame()
            if kind == SETTINGS:
                if not flags & ACK:
                    self._sock.sendall(frame(SETTINGS, ACK, 0, b""))
            elif kind == PING:
                if not flags & ACK:
                    self._sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise CallError(f"{method}: the server closed the connection (GOAWAY)")
            elif sid != stream:
                continue
            elif kind == RST_STREAM:
                raise CallError(f"{method}: stream reset, code "
                                f"{struct.unpack('>I', payload)[0]}")
            elif kind == DATA:
                data += strip_padding(flags, payload)
                self._credit(len(payload))
                if flags & END_STREAM:
                    break
            elif kind == HEADERS:
                if flags & END_STREAM:
                    trailer = payload
                    break
        if len(data) < grpcwire.PREFIX_LEN:
            raise CallError(f"{method}: no reply message; trailers {trailer!r}")
        (size,) = struct.unpack(">I", data[1:grpcwire.PREFIX_LEN])
        return bytes(data[grpcwire.PREFIX_LEN:grpcwire.PREFIX_LEN + size])

    def _credit(self, n: int) -> None:
        self._received += n
        if self._received > MAX_WINDOW // 2:
            self._sock.sendall(window_update(0, self._received))
            self._received = 0

    def _read_frame(self) -> tuple[int, int, int, bytes]:
        while True:
            if len(self._buf) >= 9:
                length = int.from_bytes(self._buf[:3], "big")
                if len(self._buf) >= 9 + length:
                    kind, flags = self._buf[3], self._buf[4]
                    sid = int.from_bytes(self._buf[5:9], "big") & MAX_WINDOW
                    payload = bytes(self._buf[9:9 + length])
                    del self._buf[:9 + length]
                    if kind == HEADERS:
                        payload = strip_padding(flags, payload)
                    return kind, flags, sid, payload
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise CallError("the server closed the socket")
            self._buf += chunk
