"""Bounded in-memory byte pipes and the copy loop between sources and sinks.

A `Pipe` sits between a protocol reader (which feeds client data) and a consumer (the
exec's stdin, a pod socket). `feed` waits while the pipe is full, so a consumer that does
not keep up stalls the protocol reader and, through TCP, the client: memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from crishim.streaming.interface import ByteSink, ByteSource

PIPE_LIMIT = 64 * 1024


class Pipe:
    def __init__(self, limit: int = PIPE_LIMIT) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._eof = False
        self._aborted = False
        self._changed = asyncio.Event()

    async def feed(self, data: bytes) -> None:
        while len(self._buf) >= self.limit and not self._aborted:
            self._changed.clear()
            await self._changed.wait()
        if self._aborted or self._eof:
            return  # nobody will read it
        self._buf += data
        self._changed.set()

    def feed_eof(self) -> None:
        self._eof = True
        self._changed.set()

    def abort(self) -> None:
        """The consumer is gone: drop what is buffered and whatever comes."""
        self._aborted = True
        self._buf.clear()
        self._changed.set()

    @property
    def at_eof(self) -> bool:
        return self._eof and not self._buf

    async def read(self, n: int = 65536) -> bytes:
        while not self._buf and not self._eof and not self._aborted:
            self._changed.clear()
            await self._changed.wait()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._changed.set()
        return data


class SafeSink:
    """Wraps a client sink: after the client went away, writes are dropped silently.

    The backend then need not care whether anybody still listens; the session notices
    the client leaving by other means and stops the process.
    """

    def __init__(self, sink: ByteSink) -> None:
        self.sink = sink
        self.failed = False

    async def write(self, data: bytes) -> None:
        if self.failed or not data:
            await asyncio.sleep(0)  # a writer looping on a dead sink must not starve others
            return
        try:
            await self.sink.write(data)
        except (ConnectionError, OSError):
            self.failed = True

    async def close(self) -> None:
        if self.failed:
            return
        with contextlib.suppress(ConnectionError, OSError):
            await self.sink.close()


class StreamWriterSink:
    """A ByteSink over an asyncio StreamWriter (close = half-close when possible)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close(self) -> None:
        if self.writer.can_write_eof() and not self.writer.is_closing():
            with contextlib.suppress(OSError):
                self.writer.write_eof()


async def copy(src: ByteSource, write: Callable[[bytes], Awaitable[None]],
               chunk: int = 32 * 1024) -> int:
    """Copy until EOF; return the byte count. Exceptions of `write` propagate."""
    total = 0
    while True:
        data = await src.read(chunk)
        if not data:
            return total
        await write(data)
        total += len(data)
