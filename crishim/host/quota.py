"""Caps on containers' writable layers. Only XFS mounted with project quotas (`prjquota`)
can enforce one: the container's bundle dir gets a project id with the inherit flag
before its overlay upper and work dirs are made in it, and that project a hard block limit,
so the container's writes fail with ENOSPC at the cap (as CRI-O's `overlay.size` does).
Anywhere else a cap asked for is refused, never silently dropped.

Project ids come from a fixed range, PROJECT_IDS (docs/storage.md): nothing else may use
it on that filesystem. They are handed out in turn (the next after the last, wrapping), so
an id just freed, whose files may still be being deleted, is not reused at once. The id is
recorded in the create intent and the container record; removal and a create's rollback
clear its limit, and start-up clears the limit of every id of the range that no record
owns (what a crash between setting a quota and writing the record, or between deleting a
record and clearing its quota, left).

The filesystem is probed once, on the first container that asks for a cap or at start-up
when caps are configured (a node that never caps never reads mountinfo for it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from crishim.errors import FailedPrecondition
from crishim.host import modes, xfsquota
from crishim.host.xfsquota import ProjectQuota
from crishim.log import get_logger

log = get_logger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
# crishim's project ids: above the ones xfs_quota's /etc/projects users and the kubelet's
# emptyDir quotas (from 1048577 up) take.
PROJECT_IDS = range(3_000_000_000, 3_001_000_000)


class QuotaCalls(Protocol):
    """The kernel calls (host/xfsquota.py); a fake in unit tests."""

    def set_project(self, path: str, project_id: int) -> None: ...
    def set_limit(self, device: str, project_id: int, hard_bytes: int) -> None: ...
    def get_quota(self, device: str, project_id: int) -> ProjectQuota: ...
    def next_quota(self, device: str, project_id: int) -> ProjectQuota | None: ...


class KernelQuotas:
    def set_project(self, path: str, project_id: int) -> None:
        xfsquota.set_project(path, project_id)

    def set_limit(self, device: str, project_id: int, hard_bytes: int) -> None:
        xfsquota.set_limit(device, project_id, hard_bytes)

    def get_quota(self, device: str, project_id: int) -> ProjectQuota:
        return xfsquota.get_quota(device, project_id)

    def next_quota(self, device: str, project_id: int) -> ProjectQuota | None:
        return xfsquota.next_quota(device, project_id)


@dataclass(frozen=True)
class FsProbe:
    """The mount a directory is on: its type and its mount and superblock options."""

    path: str
    mountpoint: str
    fs_type: str
    options: frozenset[str]
    source: str = ""  # the block device quotactl(2) names the filesystem by
    error: str = ""  # why quotactl(2) failed there, if it did

    def refusal(self) -> str:
        """Why a writable-layer cap cannot be applied on this filesystem ("": it can)."""
        where = f"{self.path} is on {self.fs_type or 'an unknown filesystem'} " \
                f"(mounted at {self.mountpoint})"
        if self.fs_type != "xfs":
            return f"{where}; a writable-layer cap needs XFS mounted with prjquota"
        if not self.options & {"prjquota", "pquota"}:
            return f"{where} without project quotas; remount it with -o prjquota"
        if "pqnoenforce" in self.options:
            return f"{where} with project quotas counted but not enforced (pqnoenforce)"
        if self.error:
            return f"{where} with prjquota, but its quotas cannot be set: {self.error}"
        return ""


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
                best = FsProbe(path, point, rfields[0], opts, _unescape(rfields[1]))
                best_len = len(point)
    return best


def _probe_quotas(path: str, mountinfo: str, calls: QuotaCalls) -> FsProbe:
    """probe(), and where the mount can take caps, whether quotactl(2) answers there (a
    kernel without quota support, or a source that is not the device, fails)."""
    found = probe(path, mountinfo)
    if found.refusal():
        return found
    try:
        calls.get_quota(found.source, PROJECT_IDS.start)
    except FileNotFoundError:
        pass  # XFS answers ENOENT for a project without a quota record: it works
    except OSError as exc:
        return FsProbe(found.path, found.mountpoint, found.fs_type, found.options,
                       found.source, str(exc))
    return found


class WritableLayerQuotas:
    """Caps on the writable layers under `containers_dir`: the probe (lazy, once), the
    project ids in use, setting and clearing their limits."""

    def __init__(self, containers_dir: str, mountinfo: str = MOUNTINFO,
                 calls: QuotaCalls | None = None, ids: range = PROJECT_IDS) -> None:
        self.containers_dir = containers_dir
        self.mountinfo = mountinfo
        self.calls: QuotaCalls = calls or KernelQuotas()
        self.ids = ids
        self._probe: asyncio.Future[FsProbe] | None = None
        self._used: set[int] = set()
        self._next = ids.start

    async def probed(self) -> FsProbe:
        if self._probe is None:
            self._probe = asyncio.ensure_future(asyncio.to_thread(
                _probe_quotas, self.containers_dir, self.mountinfo, self.calls))
        job = self._probe
        try:
            return await asyncio.shield(job)
        except OSError:
            if self._probe is job:
                self._probe = None  # probed again next time rather than failing for ever
            raise

    @property
    def device(self) -> str:
        """The device of the layers' filesystem once probed able to take caps, else ""
        (container stats then read usage from the quota, not by walking)."""
        job = self._probe
        if job is None or not job.done() or job.cancelled() or job.exception() is not None:
            return ""
        found = job.result()
        return "" if found.refusal() else found.source

    async def check(self, size: int, what: str) -> None:
        """Refuse (FailedPrecondition) a cap of `size` bytes asked for by `what` where it
        cannot be applied."""
        try:
            found = await self.probed()
        except OSError as exc:
            raise FailedPrecondition(f"{what} asks for a writable-layer cap, but the "
                                     f"filesystem of {self.containers_dir} could not be "
                                     f"probed: {exc}") from None
        why = found.refusal()
        if why:
            raise FailedPrecondition(f"{what} asks for a writable-layer cap of {size} "
                                     f"bytes, which this node cannot enforce: {why} "
                                     "(docs/storage.md)")

    # -- project ids ----------------------------------------------------------------------
    def allocate(self) -> int:
        """A project id no container holds: the next after the last one handed out."""
        if len(self._used) >= len(self.ids):
            raise FailedPrecondition(f"all {len(self.ids)} writable-layer project ids are "
                                     "in use")
        pid = self._next
        while pid in self._used:
            pid = pid + 1 if pid + 1 < self.ids.stop else self.ids.start
        self._used.add(pid)
        self._next = pid + 1 if pid + 1 < self.ids.stop else self.ids.start
        return pid

    def adopt(self, ids: Iterable[int]) -> None:
        """The ids the records hold (at start-up): in use, handed out after the highest."""
        held = [i for i in ids if i in self.ids]
        self._used.update(held)
        if held:
            top = max(held) + 1
            self._next = top if top < self.ids.stop else self.ids.start

    async def apply(self, bundle: str, project_id: int, size: int) -> None:
        """Make the (empty) bundle dir `bundle`, give it `project_id` (inherited by the
        upper and work dirs made in it next) and the project a hard limit of `size`."""
        device = (await self.probed()).source
        try:
            await asyncio.to_thread(self._apply, bundle, device, project_id, size)
        except OSError as exc:
            raise FailedPrecondition(f"setting a writable-layer cap of {size} bytes on "
                                     f"{bundle} failed: {exc}") from None

    def _apply(self, bundle: str, device: str, project_id: int, size: int) -> None:
        modes.make_dir(bundle, modes.PRIVATE)
        self.calls.set_project(bundle, project_id)
        self.calls.set_limit(device, project_id, size)

    async def free(self, project_id: int) -> None:
        """Clear the limit of `project_id` and let it be handed out again (0: nothing)."""
        if not project_id:
            return
        try:
            device = (await self.probed()).source
            await asyncio.to_thread(self.calls.set_limit, device, project_id, 0)
        except OSError as exc:
            log.warning("clearing a writable-layer quota failed; the next start clears it",
                        project=project_id, error=exc)
            return
        self._used.discard(project_id)

    async def sweep(self, owned: Iterable[int]) -> list[int]:
        """At start-up: adopt `owned` (the records' ids) and clear the limit of every other
        id of the range that has one. Returns the ids cleared."""
        self.adopt(owned)
        try:
            found = await self.probed()
        except OSError:
            return []
        if found.refusal():
            return []
        return await asyncio.to_thread(self._sweep, found.source)

    def _sweep(self, device: str) -> list[int]:
        cleared: list[int] = []
        pid = self.ids.start
        while pid < self.ids.stop:
            q = self.calls.next_quota(device, pid)
            if q is None or q.project_id >= self.ids.stop:
                break
            if q.project_id not in self._used and q.hard_bytes:
                log.warning("clearing the quota of a writable layer no container owns",
                            project=q.project_id)
                self.calls.set_limit(device, q.project_id, 0)
                cleared.append(q.project_id)
            pid = max(q.project_id, pid) + 1
        return cleared

    def usage(self, device: str, project_id: int) -> ProjectQuota:
        """Blocking: the quota's usage of `project_id`."""
        return self.calls.get_quota(device, project_id)
