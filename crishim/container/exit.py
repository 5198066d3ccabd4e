"""A container's end: how it ended (exit code, OOM kill, termination message), and the
release of what it held (rootfs unmount, runc delete) as soon as it is dead, as a
containerd shim deletes its task when the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Coroutine
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import idmapvolume, imagevolume, oom, rovolume
from crishim.container.events import ContainerEvents
from crishim.container.registry import ContainerRegistry
from crishim.host.facts import HostFacts
from crishim.image import rootfs as rootfs_mod
from crishim.log import get_logger
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import OCIRuntimeError, RuntimeRegistry
from crishim.store.container import EXITED, KIND, MAX_MESSAGE, Container
from crishim.store.db import Database

log = get_logger(__name__)


class ContainerExits:
    """How each container ended, recorded once per exit (reported by the ExitFileWatcher
    or found by a stop or start), and the release of what it held."""

    def __init__(self, db: Database, containers: ContainerRegistry, events: ContainerEvents,
                 runtimes: RuntimeRegistry, exit_files: ExitFileWatcher,
                 facts: HostFacts) -> None:
        self.db = db
        self.containers = containers
        self.events = events
        self.runtimes = runtimes
        self.exit_files = exit_files
        self.facts = facts
        # Containers crishim is SIGKILLing (StopContainer): their SIGKILL is no OOM kill.
        self.killing: set[str] = set()
        # Exit clean-ups in flight (runc delete + unmount).
        self._releasing: dict[str, asyncio.Task[None]] = {}
        # Exits being handled: a second report of one waits for the first.
        self._exiting: dict[str, asyncio.Task[None]] = {}

    def watch(self, cid: str) -> None:
        """Have conmon's exit file for `cid` reported to on_exit."""
        self.exit_files.watch(cid, self.on_exit)

    async def save(self, rec: Container) -> None:
        await self.db.put(KIND, rec.id, rec.to_dict())

    async def on_exit(self, cid: str, code: int, finished_ns: int) -> None:
        """`cid` ended with `code`; once this returns it is EXITED, also when the same
        exit was reported twice (the exit-file watcher and a stop's own check)."""
        task = self._exiting.get(cid)
        if task is None:
            rec = self.containers.exact(cid)
            if rec is None or rec.state == EXITED:
                return
            task = _shared(self._exiting, cid, self._exited(rec, code, finished_ns))
        await asyncio.shield(task)

    async def _exited(self, rec: Container, code: int, finished_ns: int) -> None:
        # The termination log is a file in the pod's directory, on disk: read off the loop,
        # with the OOM evidence, in one hop.
        oom_killed, message = await asyncio.to_thread(how_it_ended, rec, code,
                                                      rec.id in self.killing)
        if rec.state == EXITED:  # a failed start or a stop before start finished it meanwhile
            return
        reason = "OOMKilled" if oom_killed else ("Completed" if code == 0 else "Error")
        await self.finish(rec, code, reason, message, finished_ns)
        log.info("container exited", id=rec.id, code=code, reason=rec.reason)
        self.events.publish(rec, pb.CONTAINER_STOPPED_EVENT)

    async def finish(self, rec: Container, code: int, reason: str, message: str,
                     finished_ns: int) -> None:
        """The container ended: record how (EXITED before the first await, so a second
        report of the same exit is ignored), release what it held, persist, then wake a
        waiting stop: StopContainer returns with its exit on disk, and the RemoveContainer
        a kubelet sends next does not queue behind this write on the database thread."""
        # An exit file's mtime comes from the kernel's coarse clock, which can lag the
        # clock started_at was read from by a few ms; a container never ends before it starts.
        rec.state, rec.exit_code = EXITED, code
        rec.finished_at = max(finished_ns, rec.started_at)
        rec.reason, rec.message = reason, message
        await self.release(rec)
        try:
            await self.save(rec)
        finally:
            self.containers.exited(rec.id).set()

    async def start_failed(self, rec: Container, exc: Exception) -> None:
        """Like containerd: a container that could not start is EXITED with StartError."""
        await self.finish(rec, 128, "StartError", str(exc), time.time_ns())

    async def stop_unstarted(self, rec: Container) -> None:
        """A container that was created but never started has no process: it just ends."""
        await self.finish(rec, 128 + signal.SIGKILL, "Error", "stopped before it was started",
                          time.time_ns())
        log.info("container stopped", id=rec.id, started=False)
        self.events.publish(rec, pb.CONTAINER_STOPPED_EVENT)

    async def check_exit(self, rec: Container) -> None:
        """Pick up an exit the exit-file watcher may not have delivered yet; without an
        exit file (its conmon died) trust runc: a stopped container was killed."""
        res = self.exit_files.read_exit(rec.id)
        if res is not None:
            await self.on_exit(rec.id, *res)
            return
        st = await self.runtimes.get(rec.runtime_handler).state(rec.id)
        if st is None or st.get("status") == "stopped":
            await self.on_exit(rec.id, 128 + signal.SIGKILL, time.time_ns())

    async def release(self, rec: Container) -> None:
        """Once the container is dead: delete its runc container and unmount its rootfs
        (and image volumes). The bundle's files stay until RemoveContainer. Failures leave
        `released` False; Remove then does the full cleanup."""
        task = self._releasing.get(rec.id)
        if task is None:
            task = _shared(self._releasing, rec.id, self._release(rec))
        await asyncio.shield(task)

    async def wait_finished(self, rec: Container) -> None:
        """Let an exit in flight finish: released, then written. RemoveContainer waits
        for it so that its delete comes after that write: a write after the delete would
        bring the container back at the next start, its pod gone."""
        task = self._releasing.get(rec.id)
        if task is not None:
            await asyncio.shield(task)
        if rec.state == EXITED:
            await self.containers.exited(rec.id).wait()

    async def _release(self, rec: Container) -> None:
        if rec.released:
            return
        try:
            runtime = self.runtimes.get(rec.runtime_handler)  # raises for a handler gone
            # The host's mounts first, `runc delete` last: its rmdir of the cgroup leaves
            # the kernel a millisecond of work (offlining the memory cgroup, on the CPU
            # that removed it) an RCU grace period later. Done last, that work comes
            # after this exit's stop has replied, mostly after the remove sent next too.
            # A process that outlived the init (a pod-wide pid namespace) keeps its own
            # mount namespace's copy of the rootfs until the delete kills it.
            image_mounts = any(imagevolume.is_image_mount(m) or idmapvolume.is_idmapped(m)
                               for m in rec.config.mounts)
            await asyncio.to_thread(_unmount_all, rec, image_mounts)
            if rec.launched:
                try:
                    await runtime.delete(rec.id)
                except OCIRuntimeError as exc:
                    # Still "running" for runc (e.g. other processes in a shared pid
                    # namespace): force it.
                    log.debug("plain delete failed; forcing", id=rec.id, error=str(exc))
                    await runtime.delete(rec.id, force=True)
        except Exception as exc:
            log.warning("releasing the exited container failed; RemoveContainer will retry",
                        id=rec.id, error=str(exc))
            return
        rec.released = True


def _shared(tasks: dict[str, asyncio.Task[None]], cid: str,
            work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """`work` as the task in flight for `cid` in `tasks`, which it leaves when it ends;
    a later caller awaits the same task."""
    task = asyncio.get_running_loop().create_task(work)
    tasks[cid] = task

    def done(_t: asyncio.Task[None]) -> None:
        tasks.pop(cid, None)

    task.add_done_callback(done)
    return task


def how_it_ended(rec: Container, code: int, killed_by_us: bool) -> tuple[bool, str]:
    """(OOM-killed, termination message) of a container that ended with `code`; blocking
    (reads files). `killed_by_us`: StopContainer's SIGKILL, which is no OOM kill."""
    return _oom_killed(rec, code, killed_by_us), termination_message(rec)


def _oom_killed(rec: Container, code: int, killed_by_us: bool) -> bool:
    # conmon watches the cgroup's OOM events and leaves a file named "oom".
    if os.path.exists(os.path.join(rec.persist_dir, "oom")):
        return True
    if not rec.cgroups_path:
        return False
    if oom.own_oom_kills(rec.cgroups_path) > 0:
        return True  # the cgroup is still there (cgroupfs: until runc delete)
    # The systemd driver's scope is gone by now: the parent's counter (see oom.py).
    if code != oom.SIGKILL_EXIT or rec.oom_base < 0 or killed_by_us:
        return False
    return oom.parent_oom_kills(rec.cgroups_path) > rec.oom_base


def termination_message(rec: Container) -> str:
    if not rec.termination_log:
        return ""
    with contextlib.suppress(OSError), open(rec.termination_log, "rb") as fh:
        return fh.read(MAX_MESSAGE).decode(errors="replace")
    return ""


def _unmount_all(rec: Container, image_mounts: bool) -> None:
    # The read-only copies of a user-namespaced container's binds are under its bundle too.
    rootfs_mod.unmount_all(rec.rootfs, rec.bundle,
                           image_mounts or rovolume.made(rec.bundle))
