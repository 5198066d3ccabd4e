"""Single-pass verify + decompress + unpack of a layer stream (the thread side of a pull)."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import zstandard

from crishim.image import layerfetch
from crishim.image.layerfetch import _Closing, _unpack_thread
from crishim.image.progress import ProgressFeed
from crishim.image.store import Paths
from crishim.image.stream import LayerTooLarge, StreamMismatch
from tests.e2e.imagebuild import file, make_tar


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


TAR = make_tar([file("hello", "world" * 1000), file("dir/x", b"\0" * 200_000)])


async def feed(blob: bytes, digest: str, size: int, diff_id: str, dest: Path,
               chunk: int = 4096, limit: int = 0) -> None:
    q = _Closing()
    worker = asyncio.get_running_loop().run_in_executor(
        None, _unpack_thread, q, digest, size, diff_id, str(dest), "layer test", limit)
    for i in range(0, len(blob), chunk):
        if q.consumer_done:
            break
        await q.put(blob[i:i + chunk])
    q.close()
    await worker


@pytest.mark.parametrize("kind", ["gzip", "zstd", "none", "gzip-multimember"])
async def test_formats(tmp_path: Path, kind: str) -> None:
    blob = {"gzip": lambda: gzip.compress(TAR),
            "zstd": lambda: zstandard.ZstdCompressor().compress(TAR),
            "none": lambda: TAR,
            "gzip-multimember": lambda: gzip.compress(TAR[:5000]) + gzip.compress(TAR[5000:]),
            }[kind]()
    await feed(blob, sha(blob), len(blob), sha(TAR), tmp_path)
    assert (tmp_path / "hello").read_text() == "world" * 1000
    assert (tmp_path / "dir/x").stat().st_size == 200_000


async def test_digest_mismatch(tmp_path: Path) -> None:
    blob = gzip.compress(TAR)
    with pytest.raises(StreamMismatch, match="digest"):
        await feed(blob, sha(blob + b"x"), len(blob), sha(TAR), tmp_path)


async def test_diff_id_mismatch(tmp_path: Path) -> None:
    blob = gzip.compress(TAR)
    with pytest.raises(StreamMismatch, match="diff ID"):
        await feed(blob, sha(blob), len(blob), sha(b"other"), tmp_path)


def _bytes_under(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files)


@pytest.mark.parametrize("kind", ["gzip", "zstd", "none"])
async def test_uncompressed_size_over_the_limit_is_refused(tmp_path: Path, kind: str) -> None:
    bomb = make_tar([file("zeros", b"\0" * (4 << 20))])
    blob = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress,
            "none": bytes}[kind](bomb)
    with pytest.raises(LayerTooLarge, match=r"layer test: uncompressed size exceeds the "
                       r"limit of 1048576 bytes \(registry.max_layer_uncompressed_size\)"):
        await feed(blob, sha(blob), len(blob), sha(bomb), tmp_path, chunk=1 << 16,
                   limit=1 << 20)
    # It stopped at the limit: no more than that was written.
    assert await asyncio.to_thread(_bytes_under, tmp_path) <= 1 << 20


async def test_limit_exactly_met_passes(tmp_path: Path) -> None:
    blob = gzip.compress(TAR)
    await feed(blob, sha(blob), len(blob), sha(TAR), tmp_path, limit=len(TAR))
    assert (tmp_path / "hello").read_text() == "world" * 1000


async def test_sha512_diff_id_is_verified_with_sha512(tmp_path: Path) -> None:
    blob = gzip.compress(TAR)
    await feed(blob, sha(blob), len(blob), "sha512:" + hashlib.sha512(TAR).hexdigest(),
               tmp_path)
    assert (tmp_path / "hello").exists()


async def test_more_than_declared_size(tmp_path: Path) -> None:
    blob = gzip.compress(TAR)
    with pytest.raises(StreamMismatch, match="size"):
        await feed(blob, sha(blob), len(blob) - 10, sha(TAR), tmp_path)


async def test_truncated_gzip(tmp_path: Path) -> None:
    blob = gzip.compress(TAR)[:-100]
    with pytest.raises(StreamMismatch):
        await feed(blob, sha(blob), len(blob), sha(TAR), tmp_path)


async def test_producer_abort_reaches_thread(tmp_path: Path) -> None:
    q = _Closing()
    worker = asyncio.get_running_loop().run_in_executor(
        None, _unpack_thread, q, sha(b""), -1, sha(b""), str(tmp_path), "layer test")
    await q.put(gzip.compress(TAR)[:100])
    q.abort(ConnectionResetError("peer reset"))
    with pytest.raises(ConnectionResetError):
        await worker


class _FakeBlob:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aenter__(self) -> _FakeBlob:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c


class _FakeSession:
    ref = SimpleNamespace(name="test/layer", domain="registry.test")

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def open_blob(self, _digest: str, _transfer: object) -> _FakeBlob:
        return _FakeBlob(self.chunks)


async def test_cancelled_fetch_waits_for_its_unpack_thread_before_removing_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull cancelled while its unpack thread still writes (a sibling layer failed) must
    not remove the temp dir under the thread's feet: the thread would recreate it."""
    started = threading.Event()

    def slow_unpack(q: _Closing, _digest: str, _size: int, _diff_id: str, dest: str,
                    _what: str, _limit: int = 0) -> None:
        try:
            started.set()
            for i in itertools.count():
                chunk = q.get()  # raises once the producer aborts
                time.sleep(0.03)
                os.makedirs(os.path.join(dest, f"d{i}"), exist_ok=True)  # recreates dest
                if not chunk:
                    return
        finally:
            q.consumer_exit()

    monkeypatch.setattr(layerfetch, "_unpack_thread", slow_unpack)
    paths = Paths(str(tmp_path))
    paths.ensure()
    with ThreadPoolExecutor(1) as pool:
        task = asyncio.create_task(layerfetch.fetch_layer(
            _FakeSession([b"x"] * 8), pool, "sha256:" + "a" * 64, 8,  # type: ignore[arg-type]
            "sha256:" + "b" * 64, paths, ProgressFeed()))
        await asyncio.to_thread(started.wait)
        await asyncio.sleep(0.05)  # all chunks queued; fetch_layer awaits the thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)  # what an unfinished thread would still write
    assert os.listdir(paths.tmp) == []
    assert os.listdir(paths.layers) == []
