"""A hostile HTTP/2 client for a gRPC unix socket: frames written by hand, including
the ones RFC 9113 forbids, and the attacks of record (never-ending requests, idle
connections, replies and control frames left unread, floods, resets).

`Raw` is one blocking connection; `CASES` are the attacks, each a function of a socket
path that returns what the server answered (a GOAWAY or RST_STREAM code, or what
happened to the client). The tests (tests/e2e/test_rpc_hostile.py,
tests/unit/test_rpc_hostile.py) and `hack/h2hostile` run them against a server and
check it still answers a normal call at once, with its memory bounded.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import hpack

from crishim.rpc import frames as fr
from crishim.rpc import grpcwire

VERSION = "/runtime.v1.RuntimeService/Version"
STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
Frame = tuple[int, int, int, bytes]  # type, flags, stream id, payload


class Closed(Exception):
    """The server closed the connection."""


class Raw:
    """One client connection that sends whatever it is told to."""

    def __init__(self, path: str, timeout: float = 5.0, preface: bool = True,
                 settings: dict[int, int] | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.encoder = hpack.Encoder()
        self.buf = b""
        self.gone = False
        if preface:
            self.send(fr.PREFACE + fr.settings(settings or {}))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def window_updates(self, wait: float) -> int:
        """The connection-window increments the server sent within `wait` seconds (0:
        those already here); `gone` is set if it closed the connection."""
        total = 0
        deadline = time.monotonic() + wait
        try:
            while True:
                if len(self.buf) < fr.HEADER_LEN or len(self.buf) < fr.HEADER_LEN + \
                        int.from_bytes(self.buf[:3], "big"):
                    left = deadline - time.monotonic()
                    if left <= 0 and total:
                        return total
                    self.sock.settimeout(max(left, 0.0001))
                kind, _, sid, payload = self.read_frame()
                if kind == fr.WINDOW_UPDATE and sid == 0:
                    total += int.from_bytes(payload, "big")
                elif kind == fr.GOAWAY:
                    self.gone = True
                    return total
        except Closed:
            self.gone = True
        except (TimeoutError, BlockingIOError, OSError):
            pass
        return total

    def try_send(self, data: bytes, within: float) -> bool:
        """Send `data`; False if the server stopped reading it for `within` seconds (or
        closed the connection)."""
        self.sock.settimeout(within)
        try:
            self.sock.sendall(data)
            return True
        except (TimeoutError, OSError):
            return False

    def block(self, path: str, **extra: str) -> bytes:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path),
                  (":authority", "localhost"), ("content-type", "application/grpc"),
                  ("te", "trailers"), *extra.items()]
        return self.encoder.encode(fields)  # type: ignore[no-any-return]

    def headers(self, sid: int, path: str = VERSION, end: bool = False) -> bytes:
        flags = fr.END_HEADERS | (fr.END_STREAM if end else 0)
        return fr.frame(fr.HEADERS, flags, sid, self.block(path))

    def call(self, sid: int, path: str = VERSION, message: bytes = b"") -> bytes:
        """A whole unary request."""
        return (self.headers(sid, path)
                + fr.frame(fr.DATA, fr.END_STREAM, sid, grpcwire.message(message)))

    def read_frame(self, timeout: float | None = None) -> Frame:
        if timeout is not None:
            self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= fr.HEADER_LEN:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= fr.HEADER_LEN + length:
                    head, self.buf = self.buf[:fr.HEADER_LEN + length], \
                        self.buf[fr.HEADER_LEN + length:]
                    sid = int.from_bytes(head[5:9], "big") & fr.MAX_WINDOW
                    return head[3], head[4], sid, head[fr.HEADER_LEN:]
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise Closed()
            self.buf += chunk

    def answer(self, timeout: float = 5.0) -> tuple[str, int]:
        """The server's first GOAWAY ("goaway", code) or RST_STREAM ("rst", code), or
        ("closed", -1) if it closed the connection without one, ("none", -1) if neither
        came within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                kind, _, _, payload = self.read_frame(left)
                if kind == fr.GOAWAY:
                    return "goaway", struct.unpack(">I", payload[4:8])[0]
                if kind == fr.RST_STREAM:
                    return "rst", struct.unpack(">I", payload[:4])[0]
        except Closed:
            return "closed", -1
        except (TimeoutError, OSError):
            pass
        return "none", -1


# --- the malformed frames of RFC 9113, with the code the RFC asks for ---------------------
def _frame_cases() -> dict[str, tuple[Callable[[Raw], bytes], str, int]]:
    big = 2**31 - 1
    return {
        # The seven of issue 43's table: each ends the connection.
        "short WINDOW_UPDATE": (lambda c: fr.frame(fr.WINDOW_UPDATE, 0, 0, b"\0\0\1"),
                                "goaway", fr.FRAME_SIZE_ERROR),
        "short SETTINGS": (lambda c: fr.frame(fr.SETTINGS, 0, 0, b"\0\4\0\0\0"),
                           "goaway", fr.FRAME_SIZE_ERROR),
        "short PING": (lambda c: fr.frame(fr.PING, 0, 0, b"1234567"),
                       "goaway", fr.FRAME_SIZE_ERROR),
        "short RST_STREAM": (lambda c: c.headers(1) + fr.frame(fr.RST_STREAM, 0, 1, b"\0\0\0"),
                             "goaway", fr.FRAME_SIZE_ERROR),
        "HEADERS on stream 0": (lambda c: c.headers(0, end=True),
                                "goaway", fr.PROTOCOL_ERROR),
        "DATA on stream 0": (lambda c: fr.frame(fr.DATA, 0, 0, b"xxxx"),
                             "goaway", fr.PROTOCOL_ERROR),
        "frame over max size": (lambda c: c.headers(1) + fr.frame(fr.DATA, 0, 1, bytes(16385)),
                                "goaway", fr.FRAME_SIZE_ERROR),
        # And the rest.
        "SETTINGS ACK with a payload": (lambda c: fr.frame(fr.SETTINGS, fr.ACK, 0, bytes(6)),
                                        "goaway", fr.FRAME_SIZE_ERROR),
        "short PRIORITY": (lambda c: fr.frame(fr.PRIORITY, 0, 1, b"\0\0\0\0"),
                           "goaway", fr.FRAME_SIZE_ERROR),
        "PING on a stream": (lambda c: fr.frame(fr.PING, 0, 1, bytes(8)),
                             "goaway", fr.PROTOCOL_ERROR),
        "SETTINGS on a stream": (lambda c: fr.frame(fr.SETTINGS, 0, 1, b""),
                                 "goaway", fr.PROTOCOL_ERROR),
        "WINDOW_UPDATE of 0": (lambda c: fr.window_update(0, 0), "goaway", fr.PROTOCOL_ERROR),
        "connection window past 2^31-1": (lambda c: fr.window_update(0, big),
                                          "goaway", fr.FLOW_CONTROL_ERROR),
        "stream window past 2^31-1": (lambda c: c.headers(1) + fr.window_update(1, big),
                                      "rst", fr.FLOW_CONTROL_ERROR),
        "initial window past 2^31-1": (lambda c: fr.settings({fr.INITIAL_WINDOW_SIZE: big + 1}),
                                       "goaway", fr.FLOW_CONTROL_ERROR),
        "max frame size below 16384": (lambda c: fr.settings({fr.MAX_FRAME_SIZE: 100}),
                                       "goaway", fr.PROTOCOL_ERROR),
        "DATA on an idle stream": (lambda c: fr.frame(fr.DATA, 0, 5, b"xxxx"),
                                   "goaway", fr.PROTOCOL_ERROR),
        "HEADERS on an even stream": (lambda c: c.headers(2, end=True),
                                      "goaway", fr.PROTOCOL_ERROR),
        "decreasing stream ids": (lambda c: c.headers(5) + c.headers(3),
                                  "goaway", fr.PROTOCOL_ERROR),
        "RST_STREAM on an idle stream": (lambda c: fr.rst_stream(7, fr.CANCEL),
                                         "goaway", fr.PROTOCOL_ERROR),
        "WINDOW_UPDATE on an idle stream": (lambda c: fr.window_update(9, 1),
                                            "goaway", fr.PROTOCOL_ERROR),
        "PUSH_PROMISE from a client": (lambda c: fr.frame(fr.PUSH_PROMISE, fr.END_HEADERS, 1,
                                                          bytes(4)),
                                       "goaway", fr.PROTOCOL_ERROR),
        "CONTINUATION without HEADERS": (lambda c: fr.frame(fr.CONTINUATION, fr.END_HEADERS, 1,
                                                            b""),
                                         "goaway", fr.PROTOCOL_ERROR),
        "DATA after the request ended": (
            lambda c: c.headers(1, path="/test.Svc/Slow") + fr.frame(
                fr.DATA, fr.END_STREAM, 1, grpcwire.message(b""))
            + fr.frame(fr.DATA, 0, 1, b"more"), "rst", fr.STREAM_CLOSED),
        "HEADERS after the request ended": (
            lambda c: c.headers(1, path="/test.Svc/Slow") + fr.frame(
                fr.DATA, fr.END_STREAM, 1, grpcwire.message(b""))
            + c.headers(1, path="/test.Svc/Slow", end=True), "rst", fr.STREAM_CLOSED),
    }


FRAME_CASES = _frame_cases()
MALFORMED_SEVEN = list(FRAME_CASES)[:7]


def malformed(path: str, name: str, timeout: float = 2.0) -> tuple[str, int]:
    """Send one malformed frame on a fresh connection; the server's answer."""
    make = FRAME_CASES[name][0]
    with Raw(path) as c:
        c.send(make(c))
        return c.answer(timeout)


# --- the attack classes -------------------------------------------------------------------
@dataclass
class Outcome:
    """What an attack saw of the server, and the connections it keeps open while the
    server's memory is measured."""

    answer: str
    held: list[Raw]

    def close(self) -> None:
        for c in self.held:
            c.close()
        self.held.clear()


def _connect_many(path: str, n: int) -> tuple[list[Raw], int]:
    """Up to `n` connections that keep their preface sent; how many the server refused
    or closed at once."""
    conns, refused = [], 0
    for _ in range(n):
        try:
            c = Raw(path)
        except OSError:
            refused += 1
            continue
        conns.append(c)
    time.sleep(0.3)
    kept = []
    for c in conns:
        c.sock.setblocking(False)
        try:
            data = c.sock.recv(1 << 16)
            gone = data == b"" or bytes([fr.GOAWAY]) in _kinds(data)
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        c.sock.setblocking(True)
        if gone:
            refused += 1
            c.close()
        else:
            kept.append(c)
    return kept, refused


def _kinds(data: bytes) -> bytes:
    out = bytearray()
    while len(data) >= fr.HEADER_LEN:
        out.append(data[3])
        data = data[fr.HEADER_LEN + int.from_bytes(data[:3], "big"):]
    return bytes(out)


def never_ending_bodies(path: str, calls: int = 6000, body: int = 32_000,
                        per_connection: int = 128) -> Outcome:
    """Calls whose request body never ends, `body` bytes each, sent as the server's
    connection window allows (a client that overdraws it is closed at once)."""
    held: list[Raw] = []
    sent = stalled = refused = 0
    payload = bytes(body)
    while sent < calls:
        try:
            c = Raw(path, timeout=2)
        except OSError:
            break
        window = fr.DEFAULT_WINDOW
        state = "open"
        try:
            for i in range(min(per_connection, calls - sent)):
                sid = 1 + 2 * i
                c.send(c.headers(sid))
                at = 0
                while at < len(payload):
                    window += c.window_updates(0.0 if window else 0.2)
                    if not window:
                        state = "stalled"
                        break
                    n = min(16000, window, len(payload) - at)
                    c.send(fr.frame(fr.DATA, 0, sid, payload[at:at + n]))
                    window -= n
                    at += n
                if c.gone:
                    state = "refused"
                if state != "open":
                    break
                sent += 1
        except OSError:
            state = "refused"
        if state == "refused":
            refused += 1
            c.close()
            break
        stalled += state == "stalled"
        held.append(c)
    return Outcome(f"{sent} calls open on {len(held)} connections, {stalled} of them stalled "
                   f"by flow control, {refused} refused", held)


def idle_connections(path: str, n: int = 1500) -> Outcome:
    kept, refused = _connect_many(path, n)
    return Outcome(f"{len(kept)} kept, {refused} refused", kept)


def failing_calls_unread(path: str, calls: int = 100_000) -> Outcome:
    """Calls that fail (a status with no container id), whose replies are never read."""
    c = Raw(path)
    sent, sid, stopped = 0, 1, False
    while sent < calls:
        data = b"".join(c.call(sid + 2 * i, STATUS) for i in range(1000))
        sid += 2000
        if not c.try_send(data, within=2.0):
            stopped = True
            break
        sent += 1000
    return Outcome(f"{sent} sent, server stopped reading: {stopped}", [c])


def control_flood_unread(path: str, kind: int, n: int = 300_000) -> Outcome:
    c = Raw(path)
    one = fr.frame(fr.PING, 0, 0, bytes(8)) if kind == fr.PING else fr.settings({})
    sent, stopped = 0, False
    while sent < n:
        if not c.try_send(one * 1000, within=2.0):
            stopped = True
            break
        sent += 1000
    answer = c.answer(timeout=1.0)
    return Outcome(f"{sent} sent, stopped reading: {stopped}, answer: {answer}", [c])


def continuation_flood(path: str, n: int = 100_000) -> Outcome:
    c = Raw(path)
    c.send(fr.frame(fr.HEADERS, 0, 1, c.block(VERSION)))
    piece = fr.frame(fr.CONTINUATION, 0, 1, b"\x40\x01a\x01b")  # literal x-..., indexed
    for _ in range(n // 1000):
        if not c.try_send(piece * 1000, within=2.0):
            break
    return Outcome(str(c.answer(timeout=2.0)), [c])


def hpack_bomb(path: str, n: int = 5000) -> Outcome:
    """A large header value put in the table once, then referenced many times."""
    c = Raw(path)
    value = b"x" * 4000
    # The request's fields never indexed, so that the bomb is entry 62 of the table.
    fields = b"".join(fr.literal(n, v) for n, v in (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", VERSION.encode()),
        (b"content-type", b"application/grpc")))
    first = b"\x40" + fr.hpack_int(3, 7) + b"bom" + fr.hpack_int(len(value), 7) + value
    c.send(fr.frame(fr.HEADERS, fr.END_HEADERS, 1, fields + first))
    refs = fields + b"\xbe" * 8000  # the bomb, 8000 times
    sid = 3
    for _ in range(n // 100):
        data = b"".join(fr.frame(fr.HEADERS, fr.END_HEADERS, sid + 2 * i, refs[:16000])
                        for i in range(100))
        sid += 200
        if not c.try_send(data, within=2.0):
            break
    return Outcome(str(c.answer(timeout=2.0)), [c])


def zero_length_headers(path: str, n: int = 100_000) -> Outcome:
    c = Raw(path)
    sid = 1
    for _ in range(n // 1000):
        data = b"".join(fr.frame(fr.HEADERS, fr.END_HEADERS, sid + 2 * i, b"")
                        for i in range(1000))
        sid += 2000
        if not c.try_send(data, within=2.0):
            break
    return Outcome(str(c.answer(timeout=2.0)), [c])


def rapid_reset(path: str, n: int = 100_000) -> Outcome:
    c = Raw(path)
    sid = 1
    for _ in range(n // 1000):
        data = b"".join(c.headers(sid + 2 * i) + fr.rst_stream(sid + 2 * i, fr.CANCEL)
                        for i in range(1000))
        sid += 2000
        if not c.try_send(data, within=2.0):
            break
    return Outcome(str(c.answer(timeout=1.0)), [c])


def empty_frames(path: str, n: int = 300_000) -> Outcome:
    c = Raw(path)
    c.send(c.headers(1))
    for _ in range(n // 1000):
        if not c.try_send(fr.frame(fr.DATA, 0, 1, b"") * 1000, within=2.0):
            break
    return Outcome(str(c.answer(timeout=1.0)), [c])


def streams_past_the_limit(path: str, n: int = 10_000) -> Outcome:
    """Streams opened and never ended, many more than MAX_CONCURRENT_STREAMS."""
    c = Raw(path)
    data = b"".join(c.headers(1 + 2 * i) for i in range(n))
    c.try_send(data, within=5.0)
    refused = 0
    try:
        while True:
            kind, _, _, payload = c.read_frame(1.0)
            if kind == fr.RST_STREAM and struct.unpack(">I", payload)[0] == fr.REFUSED_STREAM:
                refused += 1
    except (Closed, TimeoutError, OSError):
        pass
    return Outcome(f"{refused} refused with REFUSED_STREAM", [c])


def malformed_seven(path: str) -> Outcome:
    got = [(name, malformed(path, name)) for name in MALFORMED_SEVEN]
    right = sum(1 for name, ans in got if ans == FRAME_CASES[name][1:])
    closed = sum(1 for _, ans in got if ans[0] in ("goaway", "closed"))
    return Outcome(f"{closed} of 7 closed, {right} with the RFC's code", [])


def window_overflow(path: str) -> Outcome:
    return Outcome(str(malformed(path, "connection window past 2^31-1")), [])


def stream_state_violations(path: str) -> Outcome:
    names = ["DATA on an idle stream", "HEADERS on an even stream", "decreasing stream ids",
             "RST_STREAM on an idle stream"]
    got = [malformed(path, name) for name in names]
    right = sum(1 for name, ans in zip(names, got, strict=True)
                if ans == FRAME_CASES[name][1:])
    return Outcome(f"{right} of {len(names)} answered PROTOCOL_ERROR", [])


CASES: dict[str, Callable[[str], Outcome]] = {
    "6,000 calls whose request body never ends (32 KB each)": never_ending_bodies,
    "1,500 idle connections": idle_connections,
    "100,000 failing calls whose replies are never read": failing_calls_unread,
    "300,000 PINGs never read": lambda p: control_flood_unread(p, fr.PING),
    "300,000 SETTINGS never read": lambda p: control_flood_unread(p, fr.SETTINGS),
    "the 7 malformed frames": malformed_seven,
    "WINDOW_UPDATE past 2^31-1": window_overflow,
    "stream-state violations": stream_state_violations,
    "10,000 streams opened on one connection": streams_past_the_limit,
    "CONTINUATION flood": continuation_flood,
    "HPACK bomb": hpack_bomb,
    "zero-length header blocks": zero_length_headers,
    "rapid reset (100,000)": rapid_reset,
    "empty DATA frames (300,000)": empty_frames,
}


def rss(pid: int) -> int:
    """Resident set size of `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")
