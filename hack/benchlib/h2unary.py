"""A thin, blocking gRPC unary caller over a unix socket: HTTP/2 frames written by hand.

What a call costs a runtime shows best through a client that adds next to nothing:
grpcio's client hands each call between its own threads (about a millisecond after an
idle second on this VM, the same for every server it times), which hides most of the
difference between servers. This client sends one pre-encoded request and reads the
reply in the calling thread: a write, a blocking read, a few frames parsed.

It speaks just what a unary call over a trusted local socket needs: the connection
preface, SETTINGS (and their ACK), PING ACK, HEADERS with literal (unindexed, unencoded)
fields, DATA; a window large enough that the server never waits for a WINDOW_UPDATE.
A request goes in one DATA frame, so it must fit the smallest frame and window a server
may announce (16 KiB): the CRI requests a kubelet sends most are far smaller.
The reply's headers are not decoded: a reply with a message is a success, one without
is reported with the HPACK block's raw bytes (grpc-status is in it when literal).
"""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_WINDOW = 2**31 - 1
MAX_REQUEST = 16384 - 5  # one frame of the default size, less gRPC's message prefix
DEFAULT_WINDOW = 65535
# Settings: no push, the largest stream window, the largest frame.
OUR_SETTINGS = struct.pack(">HIHIHI", 0x2, 0, 0x4, MAX_WINDOW, 0x5, 2**24 - 1)


class CallError(RuntimeError):
    pass


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + \
        struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal field without indexing, new name, no Huffman (RFC 7541 6.2.2);
    lengths below 127 fit the 7-bit prefix."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


class H2Unary:
    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._buf = bytearray()
        self._next_stream = 1
        self._received = 0  # connection-level bytes since our last WINDOW_UPDATE
        self._sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, OUR_SETTINGS)
                           + _frame(WINDOW_UPDATE, 0, 0,
                                    struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))
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
            block = b"".join(_literal(n, v) for n, v in (
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
        body = b"\x00" + struct.pack(">I", len(request)) + request
        self._sock.sendall(_frame(HEADERS, END_HEADERS, stream, self._request_head(method))
                           + _frame(DATA, END_STREAM, stream, body))
        data = bytearray()
        trailer = b""
        while True:
            kind, flags, sid, payload = self._read_frame()
            if kind == SETTINGS:
                if not flags & ACK:
                    self._sock.sendall(_frame(SETTINGS, ACK, 0, b""))
            elif kind == PING:
                if not flags & ACK:
                    self._sock.sendall(_frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise CallError(f"{method}: the server closed the connection (GOAWAY)")
            elif sid != stream:
                continue
            elif kind == RST_STREAM:
                raise CallError(f"{method}: stream reset, code "
                                f"{struct.unpack('>I', payload)[0]}")
            elif kind == DATA:
                if flags & PADDED:
                    payload = payload[1:len(payload) - payload[0]]
                data += payload
                self._credit(len(payload))
                if flags & END_STREAM:
                    break
            elif kind == HEADERS:
                if flags & END_STREAM:
                    trailer = payload
                    break
        if len(data) < 5:
            raise CallError(f"{method}: no reply message; trailers {trailer!r}")
        (size,) = struct.unpack(">I", data[1:5])
        return bytes(data[5:5 + size])

    def _credit(self, n: int) -> None:
        self._received += n
        if self._received > MAX_WINDOW // 2:
            self._sock.sendall(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
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
                        payload = _strip_headers_extras(flags, payload)
                    return kind, flags, sid, payload
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise CallError("the server closed the socket")
            self._buf += chunk


def _strip_headers_extras(flags: int, payload: bytes) -> bytes:
    pad = 0
    if flags & PADDED:
        pad, payload = payload[0], payload[1:]
    if flags & PRIORITY:
        payload = payload[5:]
    return payload[:len(payload) - pad] if pad else payload
