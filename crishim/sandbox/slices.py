"""The systemd slices a pod's parent names that crishim brought into being.

Under the systemd driver runc asks systemd for the pause's scope in the parent slice, and
systemd starts any slice of that nesting that is not there yet. The kubelet makes and
stops its own slices, but a client that names a slice nobody made (crictl, critest) would
leave it behind for good: systemd does not stop an empty slice. So RunPodSandbox notes
which of them crishim makes, and RemovePodSandbox stops those that are empty again.

Several pods can name one such slice, and any of them may go first: every pod of it
records the slice (the one that found it missing and those that came while a pod of
crishim's held it), and the slice is stopped when the last of them goes. Claims and
releases are serialized: a slice is never stopped while a pod that is starting counts on
it (`systemctl stop` of a slice stops every scope in it).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

from crishim.log import get_logger
from crishim.oci.slices import expand_slice, parent_slice

log = get_logger("sandbox.slices")


def cgroup_root() -> str:
    # cgroup v2 unified, else the v1 name=systemd hierarchy where systemd keeps its tree.
    if os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
        return "/sys/fs/cgroup"
    return "/sys/fs/cgroup/systemd"


async def stop_slice(name: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "systemctl", "stop", name, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    if proc.returncode != 0:
        log.warning("could not stop the pod's slice", slice=name,
                    error=err.decode(errors="replace").strip())


class MadeSlices:
    """Which pods count on each slice crishim made (in this process: `adopt` re-counts
    the pods of the records at start)."""

    def __init__(self, root: str | None = None,
                 stop: Callable[[str], Awaitable[None]] = stop_slice) -> None:
        self._root = root
        self._stop = stop
        self._users: Counter[str] = Counter()
        self._lock = asyncio.Lock()

    def root(self) -> str:
        return self._root if self._root is not None else cgroup_root()

    def _of_nesting(self, parent: str) -> list[str]:
        """The slices of `parent`'s nesting that are missing or that crishim made for a
        pod still counting on them, deepest first."""
        root, path = self.root(), expand_slice(parent_slice(parent))
        out: list[str] = []
        while path:
            name = path.rsplit("/", 1)[-1]
            if self._users[name] > 0 or not os.path.isdir(root + path):
                out.append(name)
            path = path.rsplit("/", 1)[0]
        return out

    async def claim(self, parent: str) -> list[str]:
        """At RunPodSandbox, before the pause's scope exists: the slices this pod must
        release (record them with the pod)."""
        async with self._lock:
            made = await asyncio.to_thread(self._of_nesting, parent)
            self._users.update(made)
            return made

    def adopt(self, made: Iterable[str]) -> None:
        """A pod of a record read at start counts on the slices it recorded."""
        self._users.update(made)

    def _empty(self, name: str) -> bool:
        d = self.root() + expand_slice(name)
        try:
            with os.scandir(d) as it:
                if any(e.is_dir(follow_symlinks=False) for e in it):
                    return False  # a scope or slice lives there (not a pod of ours)
            with open(os.path.join(d, "cgroup.procs")) as fh:
                return not fh.read().strip()
        except FileNotFoundError:
            return False  # gone already (stopped by someone else)

    async def release(self, made: list[str]) -> None:
        """The pod that recorded `made` is gone: stop those (deepest first) that no other
        pod counts on and that are empty. Idempotent (a retried release stops nothing a
        live pod uses: the emptiness check guards it)."""
        if not made:
            return
        async with self._lock:
            for name in made:
                if self._users[name] > 0:
                    self._users[name] -= 1
                if self._users[name] == 0:
                    del self._users[name]
            for name in made:
                if self._users[name] == 0 and await asyncio.to_thread(self._empty, name):
                    await self._stop(name)
