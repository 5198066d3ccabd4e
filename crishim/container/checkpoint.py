"""CheckpointContainer: a running container's processes (CRIU, through the OCI runtime),
its writable layer, spec and identity, in one archive at the caller's location
(ckptarchive.py has the layout). The container keeps running.

The container is paused (cgroup freezer) for the dump and the copy of its writable layer,
so the files and the memory are one cut; it runs again before the archive is written. All
the parts are gathered in a private dir under crishim's root, removed however the call
ends; the archive is made at `location` only at the end, exclusively, and removed if
writing it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from typing import Any

from crishim.container import ckptarchive as ar
from crishim.errors import DeadlineExceeded, FailedPrecondition
from crishim.image.rootfs import upper_dir
from crishim.log import get_logger
from crishim.runtime.runc import OCIRuntime, OCIRuntimeError
from crishim.store.container import RUNNING, Container

log = get_logger(__name__)

# The CRI's timeout 0 means the runtime's default: CRIU's dump of a small container takes
# seconds, of a large one (or under emulation) minutes.
DEFAULT_TIMEOUT = 300.0
_MAX_ERRORS = 1500  # characters of CRIU's errors quoted


def _read_spec(bundle: str) -> dict[str, Any]:
    with open(os.path.join(bundle, "config.json")) as f:
        spec: dict[str, Any] = json.load(f)
    return spec


def _gather_metadata(work: str, rec: Container, runtime: str) -> dict[str, Any]:
    spec = _read_spec(rec.bundle)
    ar.write_json(os.path.join(work, ar.SPEC_DUMP), spec)
    ar.write_json(os.path.join(work, ar.CONFIG_DUMP),
                  ar.config_dump(rec, runtime, time.time_ns()))
    mounts = ar.bind_mounts(spec)
    if mounts:
        ar.write_json(os.path.join(work, ar.BIND_MOUNTS), mounts)
    return spec


def _gather_files(work: str, rec: Container, spec: dict[str, Any]) -> None:
    deleted = ar.rootfs_diff(upper_dir(rec.bundle), os.path.join(work, ar.ROOTFS_DIFF), spec)
    if deleted:
        ar.write_json(os.path.join(work, ar.DELETED_FILES), deleted)


def _criu_errors(work: str) -> str:
    """The error lines of CRIU's log of a failed dump (the log goes with the work dir)."""
    try:
        with open(os.path.join(work, ar.DUMP_LOG), errors="replace") as f:
            lines = [ln.strip() for ln in f if "Error" in ln or "error" in ln]
    except OSError:
        return ""
    return " | ".join(lines[-5:])[-_MAX_ERRORS:]


def _copy_log(work: str, log_path: str) -> None:
    if log_path and os.path.isfile(log_path):
        shutil.copyfile(log_path, os.path.join(work, ar.CONTAINER_LOG), follow_symlinks=False)


def clear_leftovers(work_root: str) -> None:
    """The parts of checkpoints a crash interrupted (at start, none is under way)."""
    for entry in os.scandir(work_root):
        shutil.rmtree(entry.path, ignore_errors=True)


class Capture:
    """One container's checkpoint while it is gathered: its parts in a private work dir
    (removed by `discard`, however the call ends)."""

    def __init__(self, rec: Container, runtime: OCIRuntime, work: str,
                 spec: dict[str, Any]) -> None:
        self.rec = rec
        self.runtime = runtime
        self.work = work
        self.spec = spec

    @classmethod
    async def begin(cls, rec: Container, runtime: OCIRuntime, work_root: str) -> Capture:
        """The container's spec and identity gathered (it must be running)."""
        if rec.state != RUNNING:
            raise FailedPrecondition(f"container {rec.id} is not running; only a running "
                                     "container can be checkpointed")
        work = await asyncio.to_thread(tempfile.mkdtemp, prefix=f"{rec.id[:12]}-",
                                       dir=work_root)
        try:
            spec = await asyncio.to_thread(_gather_metadata, work, rec, runtime.name)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, work, True))
            raise
        return cls(rec, runtime, work, spec)

    async def dump(self, limit: float) -> None:
        """CRIU's images and the writable layer, of a container the caller has paused."""
        rec = self.rec
        try:
            await self.runtime.checkpoint(rec.id, os.path.join(self.work, ar.CHECKPOINT_DIR),
                                          self.work, timeout=limit)
            await asyncio.to_thread(_gather_files, self.work, rec, self.spec)
        except OCIRuntimeError as exc:
            if "timed out" in str(exc):
                raise DeadlineExceeded(f"checkpoint of container {rec.id} took longer than "
                                       f"{limit:g}s") from None
            why = await asyncio.to_thread(_criu_errors, self.work)
            raise FailedPrecondition(f"checkpoint of container {rec.id}: {exc}"
                                     + (f"; CRIU said: {why}" if why else "")) from None

    async def pause(self) -> None:
        await self.runtime.pause(self.rec.id)

    async def resume(self) -> None:
        await _resume(self.runtime, self.rec.id)

    async def write(self, location: str) -> None:
        """The archive at `location` (made there exclusively)."""
        await asyncio.to_thread(_copy_log, self.work, self.rec.log_path)
        await asyncio.to_thread(ar.write_archive, location, self.work)

    async def discard(self) -> None:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, self.work, True))


async def checkpoint_container(rec: Container, runtime: OCIRuntime, work_root: str,
                               location: str, limit_s: float) -> None:
    """Checkpoint `rec` into the archive `location` (`limit_s`: seconds, 0: the default).
    The caller holds the container's lock."""
    if rec.state != RUNNING:
        raise FailedPrecondition(f"container {rec.id} is not running; only a running "
                                 "container can be checkpointed")
    await asyncio.to_thread(ar.check_location, location)
    limit = limit_s or DEFAULT_TIMEOUT
    t0 = time.monotonic()
    cap = await Capture.begin(rec, runtime, work_root)
    try:
        await cap.pause()
        try:
            await cap.dump(limit)
        finally:
            await cap.resume()
        await cap.write(location)
    finally:
        await cap.discard()
    log.info("container checkpointed", id=rec.id, location=location,
             seconds=round(time.monotonic() - t0, 2))


async def _resume(runtime: OCIRuntime, cid: str) -> None:
    """Thaw the container if it is still frozen (a dump that failed half-way may have left
    it so; one that worked leaves it as it found it)."""
    state = await runtime.state(cid)
    if state is not None and state.get("status") == "paused":
        await runtime.resume(cid)
