"""Start-up reconciliation of containers, before the socket serves: finish or roll back
what an intent says a crash interrupted, bring each record in line with runc's state and
conmon's exit files, release containers that died meanwhile, sweep what no record owns
(runc containers, rootfs mounts, bundles, conmon files), and tell the image store which
images the containers use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from crishim.container.bundle import BundleFiles
from crishim.container.exit import ContainerExits
from crishim.container.registry import ContainerRegistry
from crishim.errors import InvalidArgument
from crishim.host.mount import mounted_under
from crishim.host.remove import OutsideRoots, remove, unlink
from crishim.image import rootfs as rootfs_mod
from crishim.image.manager import ImageManager
from crishim.log import get_logger
from crishim.oci import annotations as cri_ann
from crishim.runtime import conmon
from crishim.runtime.runc import RuntimeRegistry, read_pid_file, unowned_containers
from crishim.store.container import CREATED, EXITED, KIND, RUNNING, Container
from crishim.store.db import Database

log = get_logger(__name__)


class ContainerRecovery:
    def __init__(self, db: Database, containers: ContainerRegistry, exits: ContainerExits,
                 runtimes: RuntimeRegistry, bundles: BundleFiles, images: ImageManager,
                 conmon_dir: str) -> None:
        self.db = db
        self.containers = containers
        self.exits = exits
        self.runtimes = runtimes
        self.bundles = bundles
        self.images = images
        self.conmon_dir = conmon_dir

    async def reconcile(self) -> None:
        """Bring records in line with runc state, exit files and mounts after a restart."""
        records = await self.db.load_all(KIND)
        await self._finish_intents(records)
        unreleased: list[Container] = []
        for cid, data in records.items():
            try:
                rec = Container.from_dict(data)
            except Exception:
                log.exception("unreadable container record dropped", id=cid)
                await self.db.delete(KIND, cid)
                continue
            self.containers.add(rec)
            if rec.state == EXITED:
                self.containers.exited(cid).set()
                if not rec.released:
                    unreleased.append(rec)
                continue
            await self._recover_live(rec)
        await self._delete_orphan_containers()
        await self._unmount_orphans()
        await asyncio.to_thread(self._remove_orphan_monitor_files)
        # Exited before the crash, but not yet released (runc delete + unmount).
        for rec in unreleased:
            await self.exits.release(rec)
            if rec.released:
                await self.exits.save(rec)
        users: dict[str, list[str]] = {}
        for rec in self.containers.all():
            for image_id in rec.image_ids():
                users.setdefault(image_id, []).append(rec.id)
        self.images.set_users(users)

    async def _finish_intents(self, records: dict[str, Any]) -> None:
        """Roll back interrupted creates and finish interrupted removes; what they were
        about leaves `records`."""
        for cid, data in (await self.db.intents(KIND)).items():
            runtime = None
            with contextlib.suppress(InvalidArgument):
                runtime = self.runtimes.get(data.get("runtime", ""))
            creating = data.get("op") == "create"
            log.warning("rolling back interrupted container create" if creating
                        else "finishing interrupted container remove", id=cid)
            await self.bundles.rollback(cid, data["bundle"], data["persist_dir"], runtime)
            await self.db.delete(KIND, cid)
            records.pop(cid, None)
            await self.db.remove_intent(cid)

    async def _recover_live(self, rec: Container) -> None:
        """A CREATED or RUNNING record: watch it again, or record how it ended."""
        cid = rec.id
        try:
            st = await self.runtimes.get(rec.runtime_handler).state(cid)
        except Exception as exc:
            log.warning("cannot read container state", id=cid, error=str(exc))
            st = None
        status = (st or {}).get("status", "")
        if status in ("running", "created", "paused"):
            if not conmon.conmon_alive(rec.persist_dir):
                log.warning("container runs without its conmon; its exit code will be "
                            "lost", id=cid)
            changed = False
            if not rec.launched:  # the crash came between launch and saving the pid
                rec.pid = int((st or {}).get("pid") or 0)
                with contextlib.suppress(OSError, ValueError):
                    rec.conmon_pid = read_pid_file(os.path.join(rec.persist_dir, "conmon.pid"))
                changed = True
            if status == "running" and rec.state == CREATED:
                rec.state, rec.started_at = RUNNING, rec.started_at or time.time_ns()
                changed = True
            if changed:
                await self.exits.save(rec)
            self.exits.watch(cid)
            return
        res = self.exits.exit_files.read_exit(cid)
        if rec.state == CREATED and not rec.launched and res is None:
            self.exits.watch(cid)
            return  # created, never started: nothing to reconcile
        if res is not None:
            await self.exits.on_exit(cid, *res)
            return
        # The container vanished without an exit file (e.g. the node rebooted).
        rec.state, rec.exit_code, rec.finished_at = EXITED, 255, time.time_ns()
        rec.reason, rec.message = "Unknown", "container disappeared while crishim " \
            "was not running"
        self.containers.exited(cid).set()
        await self.exits.save(rec)

    async def _delete_orphan_containers(self) -> None:
        """runc containers of ours (container-type "container") that no record owns."""
        for runtime, cid in await unowned_containers(self.runtimes, cri_ann.TYPE_CONTAINER,
                                                     self.containers.ids()):
            log.warning("deleting orphan container", id=cid, runtime=runtime.name)
            with contextlib.suppress(Exception):
                await runtime.kill(cid, signal.SIGKILL, all_procs=True)
                await runtime.delete(cid, force=True)
            conmon.kill_conmon(os.path.join(self.conmon_dir, cid))

    def _remove_orphan_monitor_files(self) -> None:
        """conmon's persist dirs, exit files and attach links that no container owns
        (RemoveContainer deletes them in the background; a crash can cut that short)."""
        owned = self.containers.ids()
        roots = self.bundles.roots
        for base in (self.conmon_dir, self.bundles.exit_dir):
            with contextlib.suppress(OSError):
                for name in os.listdir(base):
                    if name not in owned:
                        # A tree, a file or a symlink (removed, never followed).
                        with contextlib.suppress(OSError, OutsideRoots):
                            remove(os.path.join(base, name), roots)
        socket_dir = conmon.default_socket_dir(os.path.join(self.conmon_dir, "x"))
        with contextlib.suppress(OSError):
            for name in os.listdir(socket_dir):
                link = os.path.join(socket_dir, name)
                if os.path.islink(link) and not os.path.exists(link):  # bundle is gone
                    with contextlib.suppress(OSError, OutsideRoots):
                        unlink(link, roots)

    async def _unmount_orphans(self) -> None:
        containers_dir = self.bundles.containers_dir
        known = {c.bundle for c in self.containers.all()}
        mounts = await asyncio.to_thread(mounted_under, containers_dir)
        for mp in mounts:
            # The bundle is the first level below containers/ (rootfs, image volumes).
            rel = mp[len(containers_dir):].strip("/")
            bundle = os.path.join(containers_dir, rel.split("/", 1)[0])
            if bundle not in known:
                log.warning("unmounting orphan container rootfs", path=mp)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(rootfs_mod.unmount, mp)
        with contextlib.suppress(OSError):
            for name in os.listdir(containers_dir):
                path = os.path.join(containers_dir, name)
                if path not in known:  # incl. the bundles of removes a crash cut short
                    await self.bundles.remove_bundle(path)
