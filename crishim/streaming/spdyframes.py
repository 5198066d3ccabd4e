"""SPDY/3.1 framing: the frame types and limits, header blocks zlib-compressed with the
SPDY/3 dictionary (one compression context per direction for the whole connection, so
frames must be compressed in the order they are written), building and reading frames.
spdy.py runs a connection over them.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from dataclasses import dataclass, field
from typing import Protocol

VERSION = 3

SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

# RST_STREAM status codes
PROTOCOL_ERROR = 1
INVALID_STREAM = 2
REFUSED_STREAM = 3
UNSUPPORTED_VERSION = 4
CANCEL = 5
INTERNAL_ERROR = 6
FLOW_CONTROL_ERROR = 7
STREAM_IN_USE = 8
STREAM_ALREADY_CLOSED = 9
FRAME_TOO_LARGE = 11

SETTINGS_INITIAL_WINDOW_SIZE = 7

INITIAL_WINDOW = 64 * 1024
MAX_DATA_CHUNK = 16 * 1024  # what we put in one DATA frame
MAX_FRAME = 1 << 20  # largest frame we accept (the field allows 16 MiB; clients send
                     # 32 KiB data frames, and a huge one would be buffered whole)
MAX_HEADER_BLOCK = 1 << 20  # decompressed header block limit (a zip bomb stops here)
MAX_STREAMS = 1024  # concurrent streams per connection; more are refused

# The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): a list of
# length-prefixed words followed by a plain-text tail. Tests pin it by SHA-256.
_DICT_WORDS = (
    *(
        "options head post put delete trace accept accept-charset accept-encoding "
        "accept-language accept-ranges age allow authorization cache-control connection "
        "content-base content-encoding content-language content-length content-location "
        "content-md5 content-range content-type date etag expect expires from host if-match "
        "if-modified-since if-none-match if-range if-unmodified-since last-modified location "
        "max-forwards pragma proxy-authenticate proxy-authorization range referer "
        "retry-after server te trailer transfer-encoding upgrade user-agent vary via warning "
        "www-authenticate method get status"
    ).split(),
    "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin",
)
_DICT_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417"
    "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
    "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct "
    "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
    "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8"
    "charset=iso-8859-1,utf-,*,enq=0."
)


def _build_dictionary() -> bytes:
    out = bytearray()
    for word in _DICT_WORDS:
        data = word.encode()
        out += struct.pack(">I", len(data)) + data
    return bytes(out) + _DICT_TAIL.encode()


DICTIONARY = _build_dictionary()


class ProtocolError(Exception):
    """The peer broke the SPDY framing; the connection is closed."""


class ByteReader(Protocol):
    """What the frame reader needs of a byte stream: asyncio.StreamReader, or the
    WebSocket tunnel (tunnel.py)."""

    async def readexactly(self, n: int) -> bytes: ...


class ByteWriter(Protocol):
    """What a connection needs to write: asyncio.StreamWriter, or the WebSocket tunnel."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


# ---------------------------------------------------------------- header blocks

Headers = dict[str, list[str]]


def encode_header_block(headers: Headers) -> bytes:
    out = bytearray(struct.pack(">I", len(headers)))
    for name, values in headers.items():
        n = name.lower().encode()
        v = "\x00".join(values).encode()
        out += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
    return bytes(out)


def decode_header_block(data: bytes) -> Headers:
    try:
        (count,) = struct.unpack_from(">I", data, 0)
        pos = 4
        headers: Headers = {}
        for _ in range(count):
            (nlen,) = struct.unpack_from(">I", data, pos)
            pos += 4
            name = data[pos:pos + nlen].decode()
            pos += nlen
            (vlen,) = struct.unpack_from(">I", data, pos)
            pos += 4
            value = data[pos:pos + vlen].decode()
            pos += vlen
            if name != name.lower() or not name:
                raise ProtocolError(f"header name {name!r} is not lowercase")
            headers.setdefault(name, []).extend(value.split("\x00"))
        return headers
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad header block: {exc}") from None


class HeaderCompressor:
    def __init__(self) -> None:
        self._z = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)

    def compress(self, headers: Headers) -> bytes:
        raw = encode_header_block(headers)
        return self._z.compress(raw) + self._z.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    def __init__(self) -> None:
        self._z = zlib.decompressobj(15, zdict=DICTIONARY)

    def decompress(self, data: bytes) -> Headers:
        try:
            raw = self._z.decompress(data, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"header decompression failed: {exc}") from None
        if self._z.unconsumed_tail:
            raise ProtocolError("header block too large")
        return decode_header_block(raw)


# ---------------------------------------------------------------- frames


@dataclass
class Frame:
    """One decoded frame. Control frames have `type` > 0; DATA frames type 0."""

    type: int
    flags: int = 0
    stream_id: int = 0
    data: bytes = b""
    headers: Headers = field(default_factory=dict)
    associated_id: int = 0
    priority: int = 0
    status: int = 0  # RST_STREAM / GOAWAY status
    ping_id: int = 0
    delta: int = 0  # WINDOW_UPDATE
    settings: dict[int, int] = field(default_factory=dict)


def control_frame(ftype: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, ftype, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(payload)) + payload


def syn_stream(comp: HeaderCompressor, stream_id: int, headers: Headers, flags: int = 0,
               priority: int = 0) -> bytes:
    body = struct.pack(">IIBB", stream_id, 0, (priority & 7) << 5, 0) + comp.compress(headers)
    return control_frame(SYN_STREAM, flags, body)


def syn_reply(comp: HeaderCompressor, stream_id: int, headers: Headers, flags: int = 0) -> bytes:
    return control_frame(SYN_REPLY, flags, struct.pack(">I", stream_id) + comp.compress(headers))


def rst_stream(stream_id: int, status: int) -> bytes:
    return control_frame(RST_STREAM, 0, struct.pack(">II", stream_id, status))


def settings(values: dict[int, int]) -> bytes:
    body = struct.pack(">I", len(values))
    for sid, value in values.items():
        body += struct.pack(">II", sid & 0xFFFFFF, value)
    return control_frame(SETTINGS, 0, body)


def ping(ping_id: int) -> bytes:
    return control_frame(PING, 0, struct.pack(">I", ping_id))


def goaway(last_good: int, status: int = 0) -> bytes:
    return control_frame(GOAWAY, 0, struct.pack(">II", last_good, status))


def window_update(stream_id: int, delta: int) -> bytes:
    return control_frame(WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta))


async def read_frame(reader: ByteReader, decomp: HeaderDecompressor) -> Frame | None:
    """Read one frame; None on a clean EOF between frames."""
    try:
        head = await reader.readexactly(8)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError("connection closed inside a frame header") from None
    first, second = struct.unpack(">II", head)
    flags, length = second >> 24, second & 0xFFFFFF
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is larger than {MAX_FRAME}")
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError("connection closed inside a frame") from None
    if not first & 0x80000000:
        return Frame(type=0, flags=flags, stream_id=first & 0x7FFFFFFF, data=payload)
    version, ftype = (first >> 16) & 0x7FFF, first & 0xFFFF
    if version != VERSION:
        raise ProtocolError(f"unsupported SPDY version {version}")
    try:
        return _decode_control(ftype, flags, payload, decomp)
    except struct.error:
        raise ProtocolError(f"short control frame of type {ftype}") from None


def _decode_control(ftype: int, flags: int, p: bytes, decomp: HeaderDecompressor) -> Frame:
    f = Frame(type=ftype, flags=flags)
    if ftype == SYN_STREAM:
        sid, assoc, pri = struct.unpack_from(">IIB", p, 0)
        f.stream_id, f.associated_id, f.priority = sid & 0x7FFFFFFF, assoc & 0x7FFFFFFF, pri >> 5
        f.headers = decomp.decompress(p[10:])
    elif ftype in (SYN_REPLY, HEADERS):
        (sid,) = struct.unpack_from(">I", p, 0)
        f.stream_id = sid & 0x7FFFFFFF
        f.headers = decomp.decompress(p[4:])
    elif ftype == RST_STREAM:
        sid, f.status = struct.unpack_from(">II", p, 0)
        f.stream_id = sid & 0x7FFFFFFF
    elif ftype == SETTINGS:
        (count,) = struct.unpack_from(">I", p, 0)
        for i in range(count):
            idf, value = struct.unpack_from(">II", p, 4 + 8 * i)
            f.settings[idf & 0xFFFFFF] = value
    elif ftype == PING:
        (f.ping_id,) = struct.unpack_from(">I", p, 0)
    elif ftype == GOAWAY:
        sid, f.status = struct.unpack_from(">II", p, 0)
        f.stream_id = sid & 0x7FFFFFFF
    elif ftype == WINDOW_UPDATE:
        sid, delta = struct.unpack_from(">II", p, 0)
        f.stream_id, f.delta = sid & 0x7FFFFFFF, delta & 0x7FFFFFFF
    # Unknown control frame types are ignored, as the spec says.
    return f
