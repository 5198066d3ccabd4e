"""RFC 6455 WebSocket framing for the streaming server (and the test/CLI client).

Messages are reassembled from fragments up to `max_message` bytes (bigger ones close the
connection with 1009, so a client cannot make us buffer without bound). PING is answered
with PONG; CLOSE is echoed. The server sends unmasked frames and requires masked ones;
a client (`client=True`) does the opposite.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import struct
import time

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_TOO_BIG = 1009

MAX_MESSAGE = 1 << 20


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


class WebSocketError(ConnectionError):
    pass


def _mask(data: bytes, key: bytes) -> bytes:
    if not data:
        return data
    # XOR with the 4-byte key repeated; done on big ints so it is fast in pure Python.
    reps = (len(data) + 3) // 4
    mask = int.from_bytes((key * reps)[: len(data)], "big")
    return (int.from_bytes(data, "big") ^ mask).to_bytes(len(data), "big")


def encode_frame(opcode: int, payload: bytes, fin: bool = True, mask: bool = False) -> bytes:
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        head = struct.pack(">BB", first, mbit | n)
    elif n < 1 << 16:
        head = struct.pack(">BBH", first, mbit | 126, n)
    else:
        head = struct.pack(">BBQ", first, mbit | 127, n)
    if mask:
        key = os.urandom(4)
        return head + key + _mask(payload, key)
    return head + payload


class WebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client: bool = False, max_message: int = MAX_MESSAGE) -> None:
        self.reader = reader
        self.writer = writer
        self.client = client
        self.max_message = max_message
        self._wlock = asyncio.Lock()
        self.closed = False
        self.close_sent = False
        self.peer_gone = asyncio.Event()  # set once recv() has seen CLOSE or EOF
        self.last_activity = time.monotonic()

    async def send(self, payload: bytes, opcode: int = OP_BINARY) -> None:
        if self.close_sent:
            raise WebSocketError("websocket is closing")
        await self._write(encode_frame(opcode, payload, mask=self.client))

    async def _write(self, frame: bytes) -> None:
        async with self._wlock:
            if self.writer.is_closing():
                raise WebSocketError("websocket connection is closed")
            self.writer.write(frame)
            self.last_activity = time.monotonic()
            await self.writer.drain()

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        try:
            b1, b2 = await self.reader.readexactly(2)
            n = b2 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", await self.reader.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", await self.reader.readexactly(8))
            masked = bool(b2 & 0x80)
            if masked == self.client:
                raise WebSocketError("frame masking is wrong for this side")
            if n > self.max_message:
                await self.close(CLOSE_TOO_BIG, "message too big")
                raise WebSocketError("message too big")
            key = await self.reader.readexactly(4) if masked else b""
            payload = await self.reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise WebSocketError("connection closed") from None
        self.last_activity = time.monotonic()
        if masked:
            payload = _mask(payload, key)
        return bool(b1 & 0x80), b1 & 0x0F, payload

    async def recv(self) -> tuple[int, bytes] | None:
        """The next data message (opcode, payload); None when the peer closed."""
        parts: list[bytes] = []
        size = 0
        opcode = 0
        while True:
            try:
                fin, op, payload = await self._read_frame()
            except (WebSocketError, OSError):
                self.closed = True
                self.peer_gone.set()
                return None
            if op == OP_PING:
                with contextlib.suppress(WebSocketError, OSError):
                    await self._write(encode_frame(OP_PONG, payload, mask=self.client))
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else CLOSE_NORMAL
                await self.close(code)
                self.closed = True
                self.peer_gone.set()
                return None
            if op != OP_CONT:
                opcode = op
            parts.append(payload)
            size += len(payload)
            if size > self.max_message:
                await self.close(CLOSE_TOO_BIG, "message too big")
                self.closed = True
                self.peer_gone.set()
                return None
            if fin:
                return opcode, b"".join(parts)

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Send CLOSE once (the peer answers with its own; the socket closes after)."""
        if self.close_sent:
            return
        self.close_sent = True
        with contextlib.suppress(WebSocketError, OSError):
            await self._write(encode_frame(OP_CLOSE, struct.pack(">H", code) + reason.encode(),
                                           mask=self.client))

    async def shutdown(self, code: int = CLOSE_NORMAL, wait: float = 2.0,
                       read: bool = False) -> None:
        """Close handshake (bounded wait for the peer's CLOSE) and close the socket.

        `read=True` when no other task reads the socket: then we read until the peer's
        CLOSE ourselves; otherwise the reading task notices it.
        """
        await self.close(code)
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(wait):
                if read:
                    while await self.recv() is not None:
                        pass
                else:
                    await self.peer_gone.wait()
        self.closed = True
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2)
