"""Disk usage of the image store and of container writable layers, for ImageFsInfo.

Walking a big store costs seconds, so results are cached and refreshed at most every
REFRESH seconds (one walk at a time, in a thread)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

REFRESH = 10.0


@dataclass
class FsUsage:
    timestamp_ns: int
    mountpoint: str
    used_bytes: int
    inodes_used: int


def mountpoint(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def walk_usage(path: str) -> FsUsage:
    """Bytes actually allocated (st_blocks) and inodes below `path`, hardlinks once."""
    used = 0
    inodes = 0
    seen: set[tuple[int, int]] = set()
    stack = [path]
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return FsUsage(time.time_ns(), path, 0, 0)
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                used += st.st_blocks * 512
                inodes += 1
                # Never descend into mounts (a container's merged rootfs lives below
                # containers/): they would count image files as container usage.
                if e.is_dir(follow_symlinks=False) and st.st_dev == dev:
                    stack.append(e.path)
    return FsUsage(time.time_ns(), mountpoint(path), used, inodes)


class UsageCache:
    def __init__(self, images_dir: str, containers_dir: str) -> None:
        self.images_dir = images_dir
        self.containers_dir = containers_dir
        self._value: tuple[FsUsage, FsUsage] | None = None
        self._at = 0.0
        self._job: asyncio.Task[tuple[FsUsage, FsUsage]] | None = None

    def _walk(self) -> tuple[FsUsage, FsUsage]:
        return walk_usage(self.images_dir), walk_usage(self.containers_dir)

    async def get(self) -> tuple[FsUsage, FsUsage]:
        if self._value is not None and time.monotonic() - self._at < REFRESH:
            return self._value
        if self._job is None:
            self._job = asyncio.ensure_future(asyncio.to_thread(self._walk))
        job = self._job
        try:
            value = await asyncio.shield(job)
        finally:
            if self._job is job and job.done():
                self._job = None
        self._value, self._at = value, time.monotonic()
        return value

    def invalidate(self) -> None:
        self._at = 0.0
