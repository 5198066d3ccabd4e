"""Download one layer and unpack it in the same pass: network -> digest -> decompress
(bounded: registry.max_layer_uncompressed_size) -> diff ID -> safe unpack, into a temp dir
that is renamed into place only when every check passed, and then marked verified."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from crishim.errors import Unavailable
from crishim.host import libc
from crishim.image.client import BACKOFF, RegistrySession
from crishim.image.progress import ProgressFeed, Transfer
from crishim.image.store import Paths, fsync_dir
from crishim.image.stream import (
    CHUNK,
    ChunkQueue,
    HashingReader,
    LayerTooLarge,
    StreamMismatch,
    VerifyingSource,
    decompressor,
    sniff,
)
from crishim.image.unpack import UnsafeLayer, unpack
from crishim.log import get_logger
from crishim.observe import metrics, tracing
from crishim.proc.crashpoint import crash_point

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
                   what: str, max_uncompressed: int = 0) -> None:
    try:
        src = VerifyingSource(q, digest, size, what)
        kind = sniff(src.peek())
        reader = HashingReader(decompressor(src, kind), diff_id.partition(":")[0],
                               max_uncompressed, what)
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


def _commit(tmp: str, paths: Paths, diff_id: str) -> None:
    """Publish a verified layer: its files reach the disk before its name does, and its
    marker after both, so after an OS crash a layer is either complete and marked, or
    unmarked (removed at the next start), never a torn tree taken for good. One syncfs per
    layer rather than an fsync per file."""
    final = paths.layer(diff_id)
    _syncfs(tmp)
    if os.path.lexists(final):
        # Not ours (the caller found no marker): a leftover of a crash or something planted
        # there. Only this job may write the layer, so it is replaced, never trusted.
        log.warning("replacing an unverified layer directory", layer=diff_id)
        paths.drop_layer(diff_id)
    os.rename(tmp, final)
    fsync_dir(os.path.dirname(final))
    paths.mark_verified(diff_id)


def _syncfs(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc.syncfs(fd, f"syncfs {path}")
    finally:
        os.close(fd)


async def fetch_layer(session: RegistrySession, pool: ThreadPoolExecutor, digest: str,
                      size: int, diff_id: str, paths: Paths, feed: ProgressFeed,
                      max_uncompressed: int = 0) -> None:
    """Make paths.layer(diff_id) hold the verified, unpacked layer, marked as such; retries
    dropped connections. The bytes that arrive are reported to `feed` (the pulls waiting
    for this layer). `max_uncompressed` > 0 bounds the layer's tar size."""
    what = f"layer {session.ref.name}@{digest}"
    tmp_root = paths.tmp
    loop = asyncio.get_running_loop()
    for attempt in range(ATTEMPTS):
        # Inline, not in a thread: two quick syscalls, and no await means a cancelled pull
        # cannot leave a directory that was created after its task stopped listening.
        tmp = _new_tmp(tmp_root)
        q = _Closing()
        thread = pool.submit(_unpack_thread, q, digest, size, diff_id, tmp, what,
                             max_uncompressed)
        worker = asyncio.wrap_future(thread, loop=loop)
        try:
            try:
                # The download; the unpack thread verifies and unpacks as bytes arrive.
                with feed.transfer(f"layer {digest}", session.ref.domain, size) as t, \
                        tracing.span("image layer fetch", **{"attempt": attempt}), \
                        metrics.timed(metrics.IMAGE_LAYER_DURATION, "fetch"):
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
                # What the unpack thread still had to do once the last byte arrived.
                with tracing.span("image layer unpack"), \
                        metrics.timed(metrics.IMAGE_LAYER_DURATION, "unpack"):
                    await worker
            except UnsafeLayer as exc:
                raise UnsafeLayer(f"image {session.ref}: layer {digest} refused: {exc}") from None
            except LayerTooLarge as exc:
                raise LayerTooLarge(f"image {session.ref}: {exc}") from None
            crash_point("image-after-layer-download")
            with tracing.span("image layer commit"), \
                    metrics.timed(metrics.IMAGE_LAYER_DURATION, "commit"):
                await _to_the_end(asyncio.to_thread(_commit, tmp, paths, diff_id))
            crash_point("image-after-layer-unpack")
            return
        except (httpx.TransportError, Unavailable) as exc:
            if attempt == ATTEMPTS - 1:
                raise Unavailable(f"{what}: download failed after {ATTEMPTS} attempts: "
                                  f"{session.pool.describe(exc)}") from None
            log.info("layer download interrupted, retrying", layer=digest, attempt=attempt + 1,
                     error=session.pool.describe(exc))
            await asyncio.sleep(BACKOFF[attempt])
        finally:
            # A cancellation can arrive while we await the unpack thread; it keeps writing
            # into tmp until it sees the abort, and must be done before tmp is removed.
            if not thread.done():
                q.abort(StreamMismatch("cancelled"))
                await _uncancellable(asyncio.wrap_future(thread, loop=loop))
            await _remove_tree(paths, tmp)
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


async def _remove_tree(paths: Paths, path: str) -> None:
    """rm -rf in a thread that is waited for even when the caller is cancelled, so a
    failed or cancelled pull has removed its temp data by the time it reports back."""
    await _uncancellable(asyncio.to_thread(paths.remove, path))


async def _to_the_end(aw: Awaitable[None]) -> None:
    """Await `aw`; if we are cancelled meanwhile, re-raise that only once `aw` has finished.
    A thread publishing a layer goes on after a cancel: the pull must not report back (and
    drop the layers it put in place) before the layer is in place or has failed."""
    done = asyncio.ensure_future(aw)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        if done.cancelled():
            raise
        await asyncio.gather(done, return_exceptions=True)
        raise


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
