"""gRPC's use of HTTP/2 (the "gRPC over HTTP2" protocol): message prefixes, the
grpc-timeout header, status trailers."""

from __future__ import annotations

import struct

import grpc

from crishim.rpc import frames

PREFIX_LEN = 5
_OK = frames.literal(b"grpc-status", b"0")  # every successful call's trailers
_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def message(data: bytes | bytearray) -> bytes:
    """One uncompressed length-prefixed message."""
    return prefix(len(data)) + data


def prefix(size: int) -> bytes:
    """The prefix of an uncompressed message of `size` bytes."""
    return b"\x00" + struct.pack(">I", size)


def unary_reply(data: bytes, max_frame: int) -> tuple[bytes, tuple[int, ...]]:
    """A successful unary call's reply on stream 0: the headers, `data` as one message in
    DATA frames of at most `max_frame` bytes, and OK trailers; with the offsets of the
    frames' stream ids, for the same reply on another stream."""
    body = message(data)
    parts = [frames.frame(frames.HEADERS, frames.END_HEADERS, 0, frames.REPLY_HEADERS)]
    for at in range(0, len(body), max_frame):
        chunk = body[at:at + max_frame]
        parts.append(frames.frame_head(frames.DATA, 0, 0, len(chunk)) + chunk)
    parts.append(frames.frame(frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 0, _OK))
    offsets, at = [], 0
    for part in parts:
        offsets.append(at + 5)
        at += len(part)
    return b"".join(parts), tuple(offsets)


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout ("100m", "2S", ...) in seconds; None when malformed."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _UNITS:
        return None
    return int(digits) * _UNITS[unit]


def _percent_encode(text: str) -> bytes:
    """grpc-message: printable ASCII but "%" as is, every other byte as %XX."""
    out = bytearray()
    for b in text.encode("utf-8", "replace"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def status_fields(code: grpc.StatusCode, details: str) -> bytes:
    if code is grpc.StatusCode.OK and not details:
        return _OK
    block = frames.literal(b"grpc-status", str(code.value[0]).encode())
    if details:
        block += frames.literal(b"grpc-message", _percent_encode(details))
    return block
