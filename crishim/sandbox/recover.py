"""Start-up reconciliation of pods, before the socket serves: roll back every
RunPodSandbox an intent says was interrupted, watch the pause of each READY pod again (or
mark the pod NOTREADY), delete pauses and sandbox dirs no record owns, and let the
network manager drop CNI state of pods that are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Protocol

from crishim.config import Config
from crishim.errors import CrishimError
from crishim.host import idmap
from crishim.host.remove import OutsideRoots, Roots, remove
from crishim.log import get_logger
from crishim.runtime.kill import kill_and_delete
from crishim.runtime.runc import RuntimeRegistry, unowned_containers
from crishim.sandbox import pause as pausemod
from crishim.sandbox import podfiles
from crishim.sandbox.registry import SandboxRegistry
from crishim.sandbox.slices import MadeSlices
from crishim.store.db import Database
from crishim.store.sandbox import KIND, NOTREADY, READY, Sandbox

log = get_logger(__name__)


class NetworkReconciler(Protocol):
    """What recovery needs of the network manager."""

    async def reconcile(self, live_pod_ids: set[str]) -> None: ...


class SandboxRecovery:
    """The start-up reconcile of pods, given what it works on; the steps it needs of
    others (rolling back a RunPodSandbox: build.py's, watching a pause: pausewatch.py's)
    are passed in as calls."""

    def __init__(self, cfg: Config, db: Database, pods: SandboxRegistry, slices: MadeSlices,
                 runtimes: RuntimeRegistry, network: NetworkReconciler, roots: Roots,
                 rollback: Callable[[Sandbox], Awaitable[None]],
                 watch_pause: Callable[[Sandbox], bool]) -> None:
        self.cfg = cfg
        self.db = db
        self.pods = pods
        self.slices = slices
        self.runtimes = runtimes
        self.network = network
        self.roots = roots
        self.rollback = rollback
        self.watch_pause = watch_pause

    async def reconcile(self) -> None:
        """Bring pod records in line with runc's state and the files on disk."""
        db = self.db
        intents = await db.intents(KIND)
        for sid, data in intents.items():
            try:
                sb = Sandbox.from_dict(data)
            except Exception as exc:
                log.error("dropping unreadable sandbox intent", id=sid, error=str(exc))
                await db.remove_intent(sid)
                continue
            log.info("rolling back interrupted RunPodSandbox", id=sid, name=sb.name)
            await self.rollback(sb)
        records = await db.load_all(KIND)
        for sid, data in records.items():
            if sid in intents:
                continue
            try:
                sb = Sandbox.from_dict(data)
            except Exception as exc:
                log.error("dropping unreadable sandbox record", id=sid, error=str(exc))
                await db.delete(KIND, sid)
                continue
            self.pods.add(sb)
            self.slices.adopt(sb.made_slices)
            if sb.state == READY:
                await self._recover_ready(sb)
        await self._delete_orphan_pauses()
        await self._delete_orphan_dirs()
        live = {sb.id for sb in self.pods.all() if sb.netns_path and not sb.stopped}
        await self.network.reconcile(live)
        await self._delete_orphan_userns_pins({sb.id for sb in self.pods.all()
                                               if sb.userns_path and not sb.stopped})

    async def _recover_ready(self, sb: Sandbox) -> None:
        """A READY record at start: watch its pause again by the pid runc reports (runc
        checks that it is still the process it started), or mark the pod NOTREADY."""
        try:
            state = await self.runtimes.get(sb.runtime_handler).state(sb.id)
        except CrishimError as exc:
            log.error("cannot read pause state", id=sb.id, error=str(exc))
            state = None
        pid = int((state or {}).get("pid") or 0)
        if state is not None and state.get("status") == "running" and pid > 0:
            sb.pid = pid
            if self.watch_pause(sb):
                return
        log.warning("pause is gone since last start; sandbox is NOTREADY", id=sb.id)
        sb.state = NOTREADY
        await self.db.put(KIND, sb.id, sb.to_dict())

    async def _delete_orphan_pauses(self) -> None:
        """Pause containers under our runtime roots that no record owns (a crash after runc
        create, before the intent could be written, cannot happen; this catches a lost
        database or a foreign cleanup)."""
        for runtime, cid in await unowned_containers(
                self.runtimes, pausemod.CONTAINER_TYPE_SANDBOX, self.pods.ids()):
            log.warning("deleting orphan pause container", id=cid, runtime=runtime.name)
            with contextlib.suppress(CrishimError):
                await kill_and_delete(runtime, cid, all_procs=True)

    async def _delete_orphan_dirs(self) -> None:
        """Sandbox dirs (with their shm / pause-rootfs mounts) that no record owns."""
        base = os.path.join(self.cfg.root, "sandboxes")
        for sid in await asyncio.to_thread(os.listdir, base):
            if self.pods.exact(sid) is not None:
                continue
            log.warning("removing orphan sandbox dir", id=sid)
            sandbox_dir = os.path.join(base, sid)
            for mount in ("shm", "rootfs"):
                with contextlib.suppress(OSError, OutsideRoots):
                    await asyncio.to_thread(podfiles.unmount_shm, os.path.join(sandbox_dir, mount),
                                            self.roots)
            await asyncio.to_thread(remove, sandbox_dir, self.roots, same_fs=True)

    async def _delete_orphan_userns_pins(self, live: set[str]) -> None:
        """Pinned user namespaces of pods that are gone or stopped (a crash between the
        network teardown and the unpin, or a lost database)."""
        base = os.path.join(self.cfg.state, "userns")
        with contextlib.suppress(FileNotFoundError):
            for sid in await asyncio.to_thread(os.listdir, base):
                if sid not in live:
                    log.warning("removing orphan user namespace pin", id=sid)
                    await asyncio.to_thread(idmap.remove_pins, os.path.join(base, sid),
                                            roots=self.roots)
