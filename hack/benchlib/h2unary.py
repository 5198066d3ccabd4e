"""A thin, blocking gRPC unary caller over a unix socket: HTTP/2 frames written by hand.

What a call costs a runtime shows best through a client that adds next to nothing:
grpcio's client hands each call between its own threads (half a millisecond to a
millisecond and more after an idle second on this VM, whatever the server), which hides
much of the difference between servers. This client encodes a request before it is timed
(`request`), then sends it and reads the reply in the calling thread (`exchange`): a
write, a blocking read, a few frames parsed.

Its request headers are the kubelet's: grpc-go's fields in grpc-go's order, the
kubelet's two-minute deadline as grpc-timeout, HPACK-encoded with indexing and Huffman
(the `hpack` package's encoder) as grpc-go's encoder does, so from its second call on a
method a server decodes table references, as it does for a kubelet.

It speaks just what a unary call over a trusted local socket needs (the frames are
crishim/rpc/frames.py's): the connection preface, SETTINGS (and their ACK), PING ACK,
HEADERS, DATA; a window large enough that the server never waits for a WINDOW_UPDATE.
It reads into one buffer kept for the connection, as grpc-go reads into buffers it
keeps: a fresh megabyte per read is mapped and unmapped by malloc each time, tens of
microseconds of every call on this VM, whichever the server.
A request goes in one DATA frame, so it must fit the smallest frame and window a server
may announce (16 KiB): the CRI requests a kubelet sends most are far smaller.
The reply's headers are not decoded: a reply with a message is a success, one without
is reported with the HPACK block's raw bytes (grpc-status is in it when literal).
"""

from __future__ import annotations

import math
import socket
import struct
import time
from typing import NamedTuple

import hpack

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
    settings,
    strip_padding,
    window_update,
)

MAX_REQUEST = DEFAULT_MAX_FRAME - grpcwire.PREFIX_LEN  # one frame of the default size
READ_BUFFER = 1 << 20  # grown (replaced) for a larger frame
# No push, the largest stream window, the largest frame.
OUR_SETTINGS = settings({ENABLE_PUSH: 0, INITIAL_WINDOW_SIZE: MAX_WINDOW,
                         MAX_FRAME_SIZE: 2**24 - 1})


# grpc-go's user-agent: the kubelet's CRI client adds no prefix of its own.
USER_AGENT = b"grpc-go/1.72.2"
# --runtime-request-timeout's default: the deadline of every CRI call the kubelet makes.
KUBELET_TIMEOUT = 120.0
_MAX_TIMEOUT_VALUE = 99_999_999  # grpc-timeout has at most 8 digits
_TIMEOUT_UNITS = ((b"n", 1e9), (b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60))


def grpc_timeout(seconds: float) -> bytes:
    """A deadline `seconds` away as grpc-go writes it: rounded up in the finest unit whose
    value fits 8 digits (a kubelet's two minutes are "120000m")."""
    if seconds <= 0:
        return b"0n"
    for unit, per_second in _TIMEOUT_UNITS:
        value = math.ceil(seconds * per_second)
        if value <= _MAX_TIMEOUT_VALUE:
            return str(value).encode() + unit
    return str(math.ceil(seconds / 3600)).encode() + b"H"


class CallError(RuntimeError):
    pass


class Request(NamedTuple):
    """A call's frames, encoded: `exchange` them in the order they were made (their
    stream ids and the HPACK table depend on it)."""

    method: str
    stream: int
    frames: bytes


class H2Unary:
    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        # Bytes read and not yet taken as frames: _buf[_start:_end].
        self._buf = bytearray(READ_BUFFER)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._next_stream = 1
        self._received = 0  # connection-level bytes since our last WINDOW_UPDATE
        self._sock.sendall(PREFACE + OUR_SETTINGS
                           + window_update(0, MAX_WINDOW - DEFAULT_WINDOW))
        self._encoder = hpack.Encoder()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> H2Unary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, request: bytes) -> Request:
        """Unary `method`'s ("/pkg.Service/Method") frames for the serialized `request`,
        with the kubelet's headers and deadline (KUBELET_TIMEOUT from now)."""
        if len(request) > MAX_REQUEST:
            raise ValueError(f"{method}: a request of {len(request)} bytes does not fit "
                             f"one frame (at most {MAX_REQUEST})")
        stream = self._next_stream
        self._next_stream += 2
        deadline = time.monotonic() + KUBELET_TIMEOUT
        block = self._encoder.encode([
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
            (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
            (b"user-agent", USER_AGENT), (b"te", b"trailers"),
            (b"grpc-timeout", grpc_timeout(deadline - time.monotonic()))])
        return Request(method, stream, frame(HEADERS, END_HEADERS, stream, block)
                       + frame(DATA, END_STREAM, stream, grpcwire.message(request)))

    def call(self, method: str, request: bytes) -> bytes:
        """The serialized reply of unary `method` ("/pkg.Service/Method")."""
        return self.exchange(self.request(method, request))

    def exchange(self, req: Request) -> bytes:
        """Send `req`; its serialized reply."""
        self.send(req)
        return self.receive(req)

    def send(self, req: Request) -> None:
        self._sock.sendall(req.frames)

    def receive(self, req: Request) -> bytes:
        """The serialized reply to `req`, sent before."""
        method, stream = req.method, req.stream
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
        with memoryview(data) as message:
            return bytes(message[grpcwire.PREFIX_LEN:grpcwire.PREFIX_LEN + size])

    def _credit(self, n: int) -> None:
        self._received += n
        if self._received > MAX_WINDOW // 2:
            self._sock.sendall(window_update(0, self._received))
            self._received = 0

    def _read_frame(self) -> tuple[int, int, int, bytes | memoryview]:
        """The next frame; a DATA payload is a view into the read buffer, valid until
        the next call."""
        while True:
            buf, start = self._buf, self._start
            if self._end - start >= 9:
                length = int.from_bytes(buf[start:start + 3], "big")
                stop = start + 9 + length
                if stop <= self._end:
                    kind, flags = buf[start + 3], buf[start + 4]
                    sid = int.from_bytes(buf[start + 5:start + 9], "big") & MAX_WINDOW
                    self._start = stop
                    if kind == DATA:
                        return kind, flags, sid, self._view[start + 9:stop]
                    payload = bytes(buf[start + 9:stop])
                    if kind == HEADERS:
                        payload = strip_padding(flags, payload)
                    return kind, flags, sid, payload
                if 9 + length > len(buf):  # a frame larger than the buffer
                    self._replace_buffer(9 + length)
                    continue
            if start == self._end:  # all taken: read from the front again
                self._start = self._end = 0
            elif self._end == len(buf):  # the rest of a frame goes to the front
                buf[:self._end - start] = buf[start:self._end]  # same size: no resize
                self._start, self._end = 0, self._end - start
            n = self._sock.recv_into(self._view[self._end:])
            if not n:
                raise CallError("the server closed the socket")
            self._end += n

    def _replace_buffer(self, size: int) -> None:
        held = self._buf[self._start:self._end]
        self._buf = bytearray(max(size, 2 * len(self._buf)))
        self._view = memoryview(self._buf)
        self._buf[:len(held)] = held
        self._start, self._end = 0, len(held)
