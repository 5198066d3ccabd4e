"""Writable-layer disk usage, cached: walking 100 upper dirs on every stats call is too slow;
and the capacity of the filesystem the layers live on.

`FsUsageCache.get(key, path)` answers from the cache. A missing entry is computed once
(concurrent callers share the walk) and waited for at most `first_wait` seconds, so a huge
layer cannot stall a stats call (it is reported once its walk is done); a stale entry is
returned as-is while one background refresh runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from crishim.host import fsusage
from crishim.host.fsusage import FsUsage
from crishim.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class FsCapacity:
    """The filesystem a writable layer lives on: its device and what is left on it."""

    device: str
    limit_bytes: int
    inodes_free: int


_MOUNT_SOURCES: dict[int, str] = {}


def mount_source(st_dev: int, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The source ("/dev/vda1", "overlay", ...) of the mount whose device is `st_dev`."""
    name = _MOUNT_SOURCES.get(st_dev)
    if name is not None:
        return name
    want = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    name = want
    try:
        with open(mountinfo) as fh:
            for line in fh:
                left, sep, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if sep and len(fields) > 2 and fields[2] == want and len(rfields) > 1:
                    name = rfields[1]
                    break
    except OSError:
        pass
    _MOUNT_SOURCES[st_dev] = name
    return name


def fs_capacity(path: str) -> FsCapacity | None:
    """statvfs of the filesystem holding `path` (cheap: no walk); None if it is gone."""
    try:
        st = os.stat(path)
        vfs = os.statvfs(path)
    except OSError:
        return None
    return FsCapacity(device=mount_source(st.st_dev), limit_bytes=vfs.f_blocks * vfs.f_frsize,
                      inodes_free=vfs.f_favail)


class FsUsageCache:
    def __init__(self, refresh: float = 10.0, concurrency: int = 2,
                 first_wait: float = 1.0) -> None:
        self.refresh_ns = int(refresh * 1e9)
        self.first_wait = first_wait
        self._entries: dict[str, FsUsage] = {}
        self._paths: dict[str, str] = {}
        self._inflight: dict[str, asyncio.Task[FsUsage]] = {}
        self._sem = asyncio.Semaphore(concurrency)
        self.walks = 0  # number of directory walks done (tests and metrics)

    async def get(self, key: str, path: str) -> FsUsage | None:
        """Usage of `path` (cached under `key`); None while a first walk is still running."""
        entry = self._entries.get(key)
        if entry is not None and self._paths.get(key) == path:
            if time.time_ns() - entry.timestamp_ns >= self.refresh_ns:
                self._start(key, path)  # refresh in the background; answer from cache
            return entry
        try:
            return await asyncio.wait_for(asyncio.shield(self._start(key, path)),
                                          self.first_wait)
        except TimeoutError:
            return None  # still walking; the next call gets the result

    def _start(self, key: str, path: str) -> asyncio.Task[FsUsage]:
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._walk(key, path))
            self._inflight[key] = task
        return task

    async def _walk(self, key: str, path: str) -> FsUsage:
        try:
            async with self._sem:
                usage = await asyncio.to_thread(fsusage.walk_usage, path)
            self.walks += 1
            if self._inflight.get(key) is asyncio.current_task():  # not forgotten meanwhile
                self._entries[key] = usage
                self._paths[key] = path
            return usage
        except Exception as exc:
            log.warning("writable layer walk failed", key=key, path=path, error=exc)
            return FsUsage(0, 0, time.time_ns())
        finally:
            self._inflight.pop(key, None)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
        self._paths.pop(key, None)
        # A walk in flight finishes in its thread; its result is dropped (not in _inflight).
        self._inflight.pop(key, None)

    def retain(self, keys: set[str]) -> None:
        for key in [k for k in self._entries if k not in keys]:
            self.forget(key)
