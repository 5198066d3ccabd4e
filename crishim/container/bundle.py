"""A container's files on disk: its bundle under {root}/containers/<id> (config.json,
overlay rootfs, upper/work, image volumes) and conmon's files (persist dir, exit file,
attach socket link). Undoing a create, deleting a removed container's files (in the
background), and the removal of what a crash left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from crishim.host.mount import mounted_under
from crishim.host.remove import OutsideRoots, Roots, confined, remove
from crishim.image import rootfs as rootfs_mod
from crishim.proc.afterreply import AfterReply
from crishim.runtime import conmon
from crishim.runtime.runc import OCIRuntime


class BundleFiles:
    def __init__(self, containers_dir: str, exit_dir: str, roots: Roots) -> None:
        """`roots`: the daemon's; a bundle or conmon file a record names outside them is
        never unmounted or deleted (the refusal is logged)."""
        self.containers_dir = containers_dir
        self.exit_dir = exit_dir
        self.roots = roots
        self.after_reply = AfterReply()

    def bundle(self, cid: str) -> str:
        return os.path.join(self.containers_dir, cid)

    async def rollback(self, cid: str, bundle: str, persist: str,
                       runtime: OCIRuntime | None) -> None:
        """Undo a partial create: runc container, conmon, mounts, dirs (idempotent)."""
        if runtime is not None:
            with contextlib.suppress(Exception):
                await runtime.delete(cid, force=True)
        with contextlib.suppress(Exception):
            conmon.kill_conmon(persist)
        with contextlib.suppress(Exception):
            await conmon.remove_monitor_files(cid, bundle, persist, self.exit_dir,
                                              roots=self.roots)
        await self.remove_bundle(bundle)

    async def remove_bundle(self, bundle: str) -> None:
        try:
            # Checked before the unmounts too: a bundle of "/" would take the host's.
            bundle = confined(bundle, self.roots)
        except OutsideRoots:
            return
        for mp in await asyncio.to_thread(mounted_under, bundle):
            await asyncio.to_thread(rootfs_mod.unmount, mp)
        await asyncio.to_thread(self._remove_tree, bundle)

    def drop_later(self, cid: str, bundle: str, persist: str) -> None:
        """Delete a removed container's bundle and conmon's files in the background:
        nothing is mounted or running there any more, and no record names them."""
        self.after_reply.run("deleting a removed container's files", self._drop_files,
                              cid, bundle, persist)

    def _drop_files(self, cid: str, bundle: str, persist: str) -> None:
        conmon.remove_monitor_files_sync(cid, bundle, persist, self.exit_dir,
                                         roots=self.roots)
        self._remove_tree(bundle)

    def _remove_tree(self, bundle: str) -> None:
        # Errors ignored, as a cleanup goes as far as it can (a refusal is logged).
        with contextlib.suppress(OSError, OutsideRoots):
            remove(bundle, self.roots)
