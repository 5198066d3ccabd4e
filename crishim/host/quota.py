"""Can the filesystem of containers' writable layers cap one? Only XFS mounted with
project quotas (`prjquota`) can: a project id on a container's upper dir and a hard block
limit for that project make its writes fail with ENOSPC at the cap, as CRI-O's
`overlay.size` does. Anywhere else a cap asked for is refused, never silently dropped.

The filesystem is probed once, on the first container that asks for a cap (a node that
never caps never reads mountinfo for it). This module is where the project quota itself
will be set on the upper dir, recorded and freed; today a cap is refused on every
filesystem, with the reason (docs/storage.md).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from crishim.errors import FailedPrecondition

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class FsProbe:
    """The mount a directory is on: its type and its mount and superblock options."""

    path: str
    mountpoint: str
    fs_type: str
    options: frozenset[str]

    def refusal(self) -> str:
        """Why a writable-layer cap cannot be applied on this filesystem."""
        where = f"{self.path} is on {self.fs_type or 'an unknown filesystem'} " \
                f"(mounted at {self.mountpoint})"
        if self.fs_type != "xfs":
            return f"{where}; a writable-layer cap needs XFS mounted with prjquota"
        if "prjquota" not in self.options:
            return f"{where} without project quotas; remount it with -o prjquota"
        return (f"{where} with prjquota, but this crishim does not set project quotas "
                "yet")


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def probe(path: str, mountinfo: str = MOUNTINFO) -> FsProbe:
    """The mount holding `path` (symlinks resolved): the deepest mount point above it, the
    last one mounted where two share a point. Blocking (reads mountinfo)."""
    real = os.path.realpath(path)
    best = FsProbe(path, "/", "", frozenset())
    best_len = -1
    with open(mountinfo) as fh:
        for line in fh:
            left, sep, right = line.rstrip("\n").partition(" - ")
            fields, rfields = left.split(" "), right.split(" ")
            if not sep or len(fields) < 6 or len(rfields) < 3:
                continue
            point = _unescape(fields[4])
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= best_len:
                opts = frozenset(fields[5].split(",")) | frozenset(rfields[2].split(","))
                best, best_len = FsProbe(path, point, rfields[0], opts), len(point)
    return best


class WritableLayerQuotas:
    """Caps on the writable layers under `containers_dir`, probed lazily, once."""

    def __init__(self, containers_dir: str, mountinfo: str = MOUNTINFO) -> None:
        self.containers_dir = containers_dir
        self.mountinfo = mountinfo
        self._probe: asyncio.Future[FsProbe] | None = None

    async def probed(self) -> FsProbe:
        if self._probe is None:
            self._probe = asyncio.ensure_future(
                asyncio.to_thread(probe, self.containers_dir, self.mountinfo))
        job = self._probe
        try:
            return await asyncio.shield(job)
        except OSError:
            if self._probe is job:
                self._probe = None  # probed again next time rather than failing for ever
            raise

    async def check(self, size: int, what: str) -> None:
        """Refuse (FailedPrecondition) a cap of `size` bytes asked for by `what` where it
        cannot be applied."""
        try:
            found = await self.probed()
        except OSError as exc:
            raise FailedPrecondition(f"{what} asks for a writable-layer cap, but the "
                                     f"filesystem of {self.containers_dir} could not be "
                                     f"probed: {exc}") from None
        raise FailedPrecondition(f"{what} asks for a writable-layer cap of {size} bytes, "
                                 f"which this node cannot enforce: {found.refusal()} "
                                 "(docs/storage.md)")
