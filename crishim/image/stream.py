"""Streaming plumbing between an async download and a blocking unpack thread.

    async side:  await queue.put(chunk) ... queue.close()   (or queue.abort(exc))
    thread side: src = VerifyingSource(queue, digest, size)
                 reader = decompressor(src, kind)  -> .read(n) of the uncompressed tar

Bytes are hashed as they pass, so a layer is verified in the same single pass that
decompresses and unpacks it.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import zlib
from collections import deque
from typing import Protocol

from crishim.errors import FailedPrecondition

CHUNK = 1 << 20


class StreamMismatch(FailedPrecondition):
    """The streamed blob does not match its digest/size: the registry served other
    content than the image names (as containerd, FAILED_PRECONDITION)."""


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class ChunkQueue:
    """A bounded hand-off of byte chunks from the event loop to one reader thread.

    `put` waits (without blocking the loop) while `slots` chunks are unread, so a fast
    network cannot buffer a whole layer in memory.
    """

    def __init__(self, slots: int = 16) -> None:
        self._loop = asyncio.get_running_loop()
        self._free = asyncio.Semaphore(slots)
        self._items: deque[bytes | BaseException | None] = deque()
        self._cond = threading.Condition()

    async def put(self, chunk: bytes) -> None:
        await self._free.acquire()
        self._push(chunk)

    def full(self) -> bool:
        """`put` would wait for the reader thread."""
        return self._free.locked()

    def close(self) -> None:
        self._push(None)

    def abort(self, exc: BaseException) -> None:
        self._push(exc)

    def _push(self, item: bytes | BaseException | None) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def get(self) -> bytes:
        """Thread side: the next chunk, b"" at the end; raises what `abort` was given."""
        with self._cond:
            while not self._items:
                self._cond.wait()
            item = self._items[0]
            if isinstance(item, bytes):
                self._items.popleft()
            else:
                return self._end(item)
        self._loop.call_soon_threadsafe(self._free.release)
        return item

    @staticmethod
    def _end(item: BaseException | None) -> bytes:
        if item is None:
            return b""
        raise item


class VerifyingSource:
    """Compressed bytes from a ChunkQueue; hashes them and enforces the expected size."""

    def __init__(self, queue: ChunkQueue, digest: str, size: int, what: str) -> None:
        algo, _, self._hex = digest.partition(":")
        if algo not in ("sha256", "sha512"):
            raise StreamMismatch(f"{what}: unsupported digest algorithm {algo!r}")
        self._hash = hashlib.new(algo)
        self._queue = queue
        self._size = size
        self._what = what
        self._buf = b""
        self._pos = 0
        self.total = 0
        self.eof = False

    def next_chunk(self) -> bytes:
        """The next raw chunk (b"" at the end), for consumers that take any size."""
        if self._pos < len(self._buf):
            out = self._buf[self._pos:]
            self._buf, self._pos = b"", 0
            return out
        if self.eof:
            return b""
        chunk = self._queue.get()
        if not chunk:
            self.eof = True
            return b""
        self.total += len(chunk)
        if self._size >= 0 and self.total > self._size:
            raise StreamMismatch(f"{self._what}: more data than its declared size "
                                 f"{self._size}")
        self._hash.update(chunk)
        return chunk

    def peek(self) -> bytes:
        """The first bytes of the stream without consuming them (for sniffing)."""
        if self._pos >= len(self._buf):
            self._buf, self._pos = self.next_chunk(), 0
        return self._buf[self._pos:self._pos + 8]

    def read(self, n: int = -1, /) -> bytes:
        if self._pos >= len(self._buf):
            self._buf, self._pos = self.next_chunk(), 0
        if n < 0:
            n = len(self._buf) - self._pos
        out = self._buf[self._pos:self._pos + n]
        self._pos += len(out)
        return out

    def readable(self) -> bool:
        return True

    def finish(self) -> None:
        """Drain to the end and verify size and digest."""
        while self.next_chunk():
            pass
        if self._size >= 0 and self.total != self._size:
            raise StreamMismatch(f"{self._what}: got {self.total} bytes, expected "
                                 f"{self._size}")
        if self._hash.hexdigest() != self._hex:
            raise StreamMismatch(f"{self._what}: content digest does not match "
                                 f"(got {self._hash.name}:{self._hash.hexdigest()})")


class LayerTooLarge(FailedPrecondition):
    """The uncompressed layer is bigger than registry.max_layer_uncompressed_size."""


class HashingReader:
    """Uncompressed tar bytes out of a decompressor, hashed for the diff ID (with the diff
    ID's own algorithm) and counted: past `limit` bytes (> 0) the layer is refused, so a
    decompression bomb stops at a known size instead of filling the disk."""

    def __init__(self, inner: Readable, algorithm: str = "sha256", limit: int = 0,
                 what: str = "layer") -> None:
        self._inner = inner
        self.hash = hashlib.new(algorithm if algorithm in ("sha256", "sha512") else "sha256")
        self._limit = limit
        self._what = what
        self.total = 0

    def read(self, n: int = -1, /) -> bytes:
        data = self._inner.read(n)
        self.total += len(data)
        if 0 < self._limit < self.total:
            raise LayerTooLarge(
                f"{self._what}: uncompressed size exceeds the limit of {self._limit} bytes "
                "(registry.max_layer_uncompressed_size)")
        self.hash.update(data)
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass

    @property
    def digest(self) -> str:
        return f"{self.hash.name}:{self.hash.hexdigest()}"


class GzipReader:
    """Multi-member gzip via zlib with bounded output per call (no zip bombs in memory).

    Reads may be short (like a pipe's); tarfile and drain() loop until they have enough.
    """

    def __init__(self, src: VerifyingSource) -> None:
        self._src = src
        self._d = zlib.decompressobj(31)
        self._pending = b""
        self._out = b""
        self._pos = 0
        self._started = False

    def _fill(self, want: int) -> bool:
        data = self._pending or self._d.unconsumed_tail
        self._pending = b""
        if not data:
            data = self._src.next_chunk()
            if not data:
                if self._started and not self._d.eof:
                    raise StreamMismatch("gzip stream ends early (truncated layer)")
                return False
        self._started = True
        self._out, self._pos = self._d.decompress(data, max(want, CHUNK)), 0
        if self._d.eof:
            rest = self._d.unused_data
            self._d = zlib.decompressobj(31)
            # Another gzip member may follow; trailing zero padding is tolerated.
            if rest.strip(b"\0"):
                self._pending = rest
            else:
                self._started = False
        return True

    def read(self, n: int = -1, /) -> bytes:
        if n < 0:
            n = CHUNK
        while self._pos >= len(self._out):
            try:
                if not self._fill(n):
                    return b""
            except zlib.error as exc:
                raise StreamMismatch(f"layer is not valid gzip: {exc}") from None
        out = self._out[self._pos:self._pos + n]
        self._pos += len(out)
        return out


def decompressor(src: VerifyingSource, kind: str) -> Readable:
    if kind == "gzip":
        return GzipReader(src)
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(  # type: ignore[no-any-return]
            src, read_size=CHUNK, read_across_frames=True)  # type: ignore[arg-type]
    return src


def sniff(first: bytes) -> str:
    """Compression from magic bytes: gzip, zstd or none."""
    if first[:2] == b"\x1f\x8b":
        return "gzip"
    if first[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    return "none"
