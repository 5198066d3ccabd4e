"""Download one layer and unpack it in the same pass: network -> digest -> decompress ->
diff ID -> safe unpack, into a temp dir that is renamed into place only when every check
passed."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from crishim.crashpoint import crash_point
from crishim.errors import Unavailable
from crishim.host import libc
from crishim.image.client import BACKOFF, RegistrySession
from crishim.image.progress import ProgressFeed, Transfer
from crishim.image.stream import (
    CHUNK,
    ChunkQueue,
    HashingReader,
    StreamMismatch,
    VerifyingSource,
    decompressor,
    sniff,
)
from crishim.image.unpack import UnsafeLayer, unpack
from crishim.log import get_logger

log = get_logger(__name__)

ATTEMPTS = 3


class _Closing(ChunkQueue):
    """A ChunkQueue whose producer stops waiting once the consumer thread has ended."""

    def __init__(self) -> None:
        super().__init__(slots=16)
        self.consumer_done = False

    def consumer_exit(self) -> None:
        # Wake a producer blocked on a full queue; it then sees consumer_done.
        self.consumer_done = True
        try:
            for _ in range(16):
                self._loop.call_soon_threadsafe(self._free.release)
        except RuntimeError:
            pass  # the loop is already closed (daemon exiting): nobody is waiting


def _unpack_thread(q: _Closing, digest: str, size: int, diff_id: str, dest: str,
                   what: str) -> None:
    try:
        src = VerifyingSource(q, digest, size, what)
        kind = sniff(src.peek())
        reader = HashingReader(decompressor(src, kind))
        try:
            unpack(reader, dest)
        except (UnsafeLayer, StreamMismatch):
            # A corrupted download usually shows up as a broken archive first; report the
            # root cause (digest mismatch) when that is what it is.
            src.finish()
            raise
        reader.drain()  # tar end-of-archive padding still counts for the diff ID
        src.finish()
        if reader.digest != diff_id:
            raise StreamMismatch(f"{what}: uncompressed content {reader.digest} does not "
                                 f"match the image config's diff ID {diff_id}")
    finally:
        q.consumer_exit()


def _new_tmp(tmp_root: str) -> str:
    tmp = tempfile.mkdtemp(dir=tmp_root, prefix="layer-")
    os.chmod(tmp, 0o755)  # becomes the layer root: readable like any image dir
    return tmp


def _commit(tmp: str, final: str) -> None:
    """Publish a verified layer: its files reach the disk before its name does, so after
    an OS crash a layer dir is either complete or absent (never a torn tree that the next
    start would take for good). One syncfs per layer rather than an fsync per file."""
    _syncfs(tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):  # else: the same layer landed meanwhile; fine
            raise
    _fsync_dir(os.path.dirname(final))


def _syncfs(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc.syncfs(fd, f"syncfs {path}")
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def fetch_layer(session: RegistrySession, pool: ThreadPoolExecutor, digest: str,
                      size: int, diff_id: str, final: str, tmp_root: str,
                      feed: ProgressFeed) -> None:
    """Make `final` hold the verified, unpacked layer; retries dropped connections.
    The bytes that arrive are reported to `feed` (the pulls waiting for this layer)."""
    what = f"layer {session.ref.name}@{digest}"
    loop = asyncio.get_running_loop()
    for attempt in range(ATTEMPTS):
        # Inline, not in a thread: two quick syscalls, and no await means a cancelled pull
        # cannot leave a directory that was created after its task stopped listening.
        tmp = _new_tmp(tmp_root)
        q = _Closing()
        thread = pool.submit(_unpack_thread, q, digest, size, diff_id, tmp, what)
        worker = asyncio.wrap_future(thread, loop=loop)
        try:
            try:
                with feed.transfer(f"layer {digest}", session.ref.domain, size) as t:
                    async with session.open_blob(digest, t) as resp:
                        async for chunk in _batches(resp, t):
                            if q.consumer_done:
                                break
                            if q.full():
                                with t.paused():  # the disk is behind, not the registry
                                    await q.put(chunk)
                            else:
                                await q.put(chunk)
                q.close()
            except BaseException as exc:
                q.abort(exc if isinstance(exc, Exception) else StreamMismatch("cancelled"))
                await asyncio.gather(worker, return_exceptions=True)
                raise
            try:
                await worker
            except UnsafeLayer as exc:
                raise UnsafeLayer(f"image {session.ref}: layer {digest} refused: {exc}") from None
            crash_point("image-after-layer-download")
            await asyncio.to_thread(_commit, tmp, final)
            crash_point("image-after-layer-unpack")
            return
        except (httpx.TransportError, Unavailable) as exc:
            if attempt == ATTEMPTS - 1:
                raise Unavailable(f"{what}: download failed after {ATTEMPTS} attempts: "
                                  f"{type(exc).__name__}") from None
            log.info("layer download interrupted, retrying", layer=digest, attempt=attempt + 1,
                     error=type(exc).__name__)
            await asyncio.sleep(BACKOFF[attempt])
        finally:
            # A cancellation can arrive while we await the unpack thread; it keeps writing
            # into tmp until it sees the abort, and must be done before tmp is removed.
            if not thread.done():
                q.abort(StreamMismatch("cancelled"))
                await _uncancellable(asyncio.wrap_future(thread, loop=loop))
            await _remove_tree(tmp)
    raise AssertionError("unreachable")


async def _batches(resp: httpx.Response, t: Transfer) -> AsyncIterator[bytes]:
    """The body in CHUNK-sized pieces for the unpack thread; every read from the network
    counts as progress as it arrives (a trickling registry is not a stalled one)."""
    parts: list[bytes] = []
    held = 0
    async for piece in resp.aiter_raw():
        t.advance(len(piece))
        parts.append(piece)
        held += len(piece)
        if held >= CHUNK:
            yield b"".join(parts)
            parts, held = [], 0
    if parts:
        yield b"".join(parts)


async def _remove_tree(path: str) -> None:
    """rmtree in a thread that is waited for even when the caller is cancelled, so a
    failed or cancelled pull has removed its temp data by the time it reports back."""
    await _uncancellable(asyncio.to_thread(shutil.rmtree, path, True))


async def _uncancellable(aw: Awaitable[Any]) -> None:
    """Wait for `aw` to finish even if we are cancelled meanwhile (then re-raise that);
    its own outcome is ignored (the caller has already handled or reported errors)."""
    done = asyncio.ensure_future(aw)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        if done.cancelled():
            return  # `aw` itself was cancelled (e.g. its pool shut down), not us
        await asyncio.gather(done, return_exceptions=True)
        raise
    except Exception:
        pass
