"""Writable-layer usage: the cache that keeps stats calls off the disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from crishim.stats.layerusage import FsUsageCache
from tests.fakes.fstree import make_tree


async def test_cache_walks_once_and_refreshes_in_background(tmp_path: Path) -> None:
    make_tree(tmp_path)
    cache = FsUsageCache(refresh=3600)
    results = await asyncio.gather(*(cache.get("c1", str(tmp_path)) for _ in range(20)))
    assert cache.walks == 1 and len({r.inodes_used for r in results if r}) == 1
    for _ in range(100):  # 100 stats calls: answered from the cache
        await cache.get("c1", str(tmp_path))
    assert cache.walks == 1

    cache.refresh_ns = 0  # now everything is stale
    (tmp_path / "new").write_bytes(b"z" * 50_000)
    stale = await cache.get("c1", str(tmp_path))
    assert stale is not None and stale.inodes_used == 6  # answered at once from cache
    for _ in range(50):
        await asyncio.sleep(0.01)
        if cache.walks == 2:
            break
    cache.refresh_ns = 3600 * 10**9
    fresh = await cache.get("c1", str(tmp_path))
    assert fresh is not None and fresh.inodes_used == 7


async def test_forget_drops_entry(tmp_path: Path) -> None:
    make_tree(tmp_path)
    cache = FsUsageCache()
    await cache.get("c1", str(tmp_path))
    cache.retain(set())
    await cache.get("c1", str(tmp_path))
    assert cache.walks == 2


async def test_slow_first_walk_does_not_stall_the_call(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from crishim.host import fsusage

    release = threading.Event()
    real = fsusage.walk_usage

    def slow_walk(path: str) -> fsusage.FsUsage:
        release.wait(10)  # a huge layer
        return real(path)

    monkeypatch.setattr(fsusage, "walk_usage", slow_walk)
    make_tree(tmp_path)
    cache = FsUsageCache(first_wait=0.05)
    assert await cache.get("big", str(tmp_path)) is None  # answered without the usage
    release.set()
    for _ in range(100):
        if cache.walks:
            break
        await asyncio.sleep(0.01)
    got = await cache.get("big", str(tmp_path))
    assert got is not None and got.inodes_used == 6
