"""HTTP/2 frames (RFC 9113) and the HPACK literals (RFC 7541) the server writes.

Replies carry a handful of fixed header fields; they are written as literals that never
enter the peer's dynamic table, so the server keeps no encoder state.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_LEN = 9

# Frame types.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9

NAMES = {DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM",
         SETTINGS: "SETTINGS", PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY",
         WINDOW_UPDATE: "WINDOW_UPDATE", CONTINUATION: "CONTINUATION"}

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1


def frame_head(kind: int, flags: int, stream: int, length: int) -> bytes:
    """A frame's 9-byte header, for a payload written after it."""
    return length.to_bytes(3, "big") + struct.pack(">BBI", kind, flags, stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return frame_head(kind, flags, stream, len(payload)) + payload


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in values.items()))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug)


def parse_settings(payload: bytes) -> dict[int, int]:
    return {k: v for k, v in struct.iter_unpack(">HI", payload[:len(payload) // 6 * 6])}


def strip_padding(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding (and HEADERS' priority fields)."""
    pad = 0
    if flags & PADDED:
        if not payload:
            raise ValueError("padded frame without a pad length")
        pad, payload = payload[0], payload[1:]
    if flags & PRIORITY_FLAG:
        payload = payload[5:]
    if pad > len(payload):
        raise ValueError("padding longer than the frame")
    return payload[:len(payload) - pad] if pad else payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) in a prefix of `prefix_bits`, with the first
    byte's other bits from `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A field "without indexing" with a literal name (RFC 7541 6.2.2), no Huffman."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


# ":status: 200" is entry 8 of the static table; "content-type" is entry 31's name.
STATUS_200 = b"\x88"
CONTENT_TYPE_GRPC = hpack_int(31, 4) + hpack_int(16, 7) + b"application/grpc"
REPLY_HEADERS = STATUS_200 + CONTENT_TYPE_GRPC


def status_line(code: int) -> bytes:
    """":status: <code>", with the static table's name (entry 8)."""
    text = str(code).encode()
    return hpack_int(8, 4) + hpack_int(len(text), 7) + text
