"""Disk usage of the image store and of container writable layers, for ImageFsInfo.

Walking a big store costs seconds, so results are cached and refreshed at most every
REFRESH seconds (one walk at a time, in a thread)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from crishim.host.fsusage import FsUsage, mountpoint, walk_usage

REFRESH = 10.0


@dataclass(frozen=True)
class FsInfo:
    """One filesystem as ImageFsInfo reports it: where it is mounted and what the
    directory crishim keeps on it uses."""

    mountpoint: str
    usage: FsUsage


def fs_info(path: str) -> FsInfo:
    return FsInfo(mountpoint(path), walk_usage(path))


class UsageCache:
    def __init__(self, images_dir: str, containers_dir: str) -> None:
        self.images_dir = images_dir
        self.containers_dir = containers_dir
        self._value: tuple[FsInfo, FsInfo] | None = None
        self._at = 0.0
        self._job: asyncio.Task[tuple[FsInfo, FsInfo]] | None = None

    def _walk(self) -> tuple[FsInfo, FsInfo]:
        return fs_info(self.images_dir), fs_info(self.containers_dir)

    async def get(self) -> tuple[FsInfo, FsInfo]:
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
