"""What a pod holds and how it is let go, each step idempotent: its network (CNI DEL,
the pinned netns and user namespace), its mounts (shm, a pause-image rootfs) and its
files. StopPodSandbox, RemovePodSandbox and the rollback of a RunPodSandbox use them.

Every path comes from the pod's record; none is unmounted or removed outside the daemon's
roots (host/remove.py), and the pod's mounts only below the pod's own directory.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Protocol

from crishim.host import idmap
from crishim.host.mount import detach
from crishim.host.remove import Roots, confined, remove
from crishim.network.netns import remove_netns
from crishim.proc.afterreply import AfterReply
from crishim.store.sandbox import Sandbox


class NetworkTeardown(Protocol):
    """What the teardown needs of the network manager."""

    async def teardown(self, pod_id: str, netns_path: str | None) -> None: ...


class PodTeardown:
    def __init__(self, network: NetworkTeardown, roots: Roots) -> None:
        """`roots`: the daemon's own directories, where a pod's files and pins may go."""
        self.network = network
        self.roots = roots
        self.after_reply = AfterReply()  # removed pods' dirs are deleted there

    async def release_network(self, sb: Sandbox) -> None:
        """CNI DEL, then the netns and user-namespace pins."""
        if sb.netns_path:
            await self.network.teardown(sb.id, sb.netns_path)
            await remove_netns(sb.netns_path, roots=self.roots)
        if sb.userns_path:
            await asyncio.to_thread(idmap.remove_pins, sb.userns_path, roots=self.roots)

    async def release_mounts(self, sb: Sandbox) -> None:
        """Detach the pod's shm and a pause-image rootfs overlay (whatever pause_image says
        now), in one thread hop; their empty dirs go with the sandbox dir."""
        await asyncio.to_thread(_detach_pod_mounts, sb.sandbox_dir, sb.shm_path, self.roots)

    async def remove_files(self, sb: Sandbox) -> None:
        """The pod's mounts and its directory, now (a RunPodSandbox rolled back)."""
        await self.release_mounts(sb)
        await asyncio.to_thread(remove, sb.sandbox_dir, self.roots, same_fs=True)

    def drop_dir_later(self, sandbox_dir: str) -> None:
        """A removed pod's files (nothing mounted there any more, no record names them)
        go in the background: on ext4 an unlink can wait for the journal or for the
        writeback of a file written moments ago, milliseconds RemovePodSandbox need not
        wait. What a crash leaves, the start-up sweep of unowned dirs removes."""
        self.after_reply.run("deleting a removed pod's files",
                             functools.partial(remove, roots=self.roots, same_fs=True),
                             sandbox_dir)


def _detach_pod_mounts(sandbox_dir: str, shm_path: str, roots: Roots) -> None:
    """Detach each mount the record names, only strictly below the pod's own dir, which
    must itself resolve (symlinks followed) strictly below `roots`; else OutsideRoots,
    logged, and nothing is detached."""
    own = (confined(os.path.realpath(sandbox_dir), roots),)
    paths = [confined(p, own) for p in (shm_path, os.path.join(sandbox_dir, "rootfs")) if p]
    for path in paths:
        detach(path)
