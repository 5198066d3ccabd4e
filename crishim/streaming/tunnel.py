"""SPDY/3.1 tunnelled through a WebSocket: client-go's port-forward transport since 1.31.

The client offers the subprotocol `SPDY/3.1+<protocol>` (today only
`SPDY/3.1+portforward.k8s.io`) and then speaks plain SPDY/3.1 inside binary messages, as
over a TCP connection: message boundaries carry no meaning and a frame may span messages.
`MessageReader` and `MessageWriter` give `SpdyConnection` the byte stream it reads and
writes over TCP, so the tunnelled session is the very same SPDY code (limits, flow
control, idle timeout, cleanup).
"""

from __future__ import annotations

import asyncio
import contextlib

from crishim.streaming.websocket import CLOSE_NORMAL, OP_BINARY, WebSocket, WebSocketError

PREFIX = "SPDY/3.1+"


def tunnel_protocols(protocols: list[str]) -> list[str]:
    """The WebSocket subprotocols that tunnel each SPDY protocol."""
    return [PREFIX + p for p in protocols]


def tunnelled(subprotocol: str) -> str | None:
    """The SPDY protocol inside a tunnelling subprotocol; None for any other one."""
    return subprotocol[len(PREFIX):] if subprotocol.startswith(PREFIX) else None


class MessageReader:
    """The payloads of binary messages, read as one byte stream.

    Messages are taken from the socket only when the reader needs more bytes, so a
    stalled consumer stalls the socket (TCP backpressure) instead of growing a buffer.
    """

    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws
        self._buf = bytearray()

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            msg = await self._ws.recv()
            if msg is None:
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n)
            opcode, payload = msg
            if opcode != OP_BINARY:
                raise WebSocketError("a SPDY tunnel carries binary messages only")
            self._buf += payload
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class MessageWriter:
    """Sends what `write` gathered as one binary message on each `drain`.

    SpdyConnection writes under its own lock and drains after every frame (or batch of
    frames), so a message holds whole frames and messages never interleave.
    """

    def __init__(self, ws: WebSocket, close_timeout: float = 2.0) -> None:
        self._ws = ws
        self._pending: list[bytes] = []
        self._close_timeout = close_timeout

    def write(self, data: bytes) -> None:
        self._pending.append(data)

    async def drain(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        await self._ws.send(data, OP_BINARY)

    def close(self) -> None:
        self._pending.clear()

    async def wait_closed(self) -> None:
        """A normal CLOSE (client-go reads it as EOF, not an error), then the socket."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._close_timeout):
                await self._ws.close(CLOSE_NORMAL)
        self._ws.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.writer.wait_closed(), self._close_timeout)
