"""The systemd slices a pod's parent names that crishim brought into being.

Under the systemd driver runc asks systemd for the pause's scope in the parent slice, and
systemd starts any slice of that nesting that is not there yet. The kubelet makes and
stops its own slices, but a client that names a slice nobody made (crictl, critest) would
leave it behind for good: systemd does not stop an empty slice. So RunPodSandbox notes
which of them did not exist, and RemovePodSandbox stops those that are empty again.
"""

from __future__ import annotations

import asyncio
import os

from crishim.log import get_logger
from crishim.oci.slices import expand_slice, parent_slice

log = get_logger("sandbox.slices")


def _root() -> str:
    # cgroup v2 unified, else the v1 name=systemd hierarchy where systemd keeps its tree.
    if os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
        return "/sys/fs/cgroup"
    return "/sys/fs/cgroup/systemd"


def missing_slices(parent: str) -> list[str]:
    """The slices of `parent`'s nesting that do not exist yet, deepest first."""
    name = parent_slice(parent)
    path = expand_slice(name)
    out: list[str] = []
    while path:
        if os.path.isdir(_root() + path):
            break  # everything above it exists too
        out.append(path.rsplit("/", 1)[-1])
        path = path.rsplit("/", 1)[0]
    return out


def _empty(slice_name: str) -> bool:
    d = _root() + expand_slice(slice_name)
    try:
        with os.scandir(d) as it:
            if any(e.is_dir(follow_symlinks=False) for e in it):
                return False  # another pod's scope or slice lives there now
        with open(os.path.join(d, "cgroup.procs")) as fh:
            return not fh.read().strip()
    except FileNotFoundError:
        return False  # gone already (stopped by someone else)


async def release_slices(slices: list[str]) -> None:
    """Stop the slices (deepest first) that this pod brought into being and nothing uses."""
    for name in slices:
        if not await asyncio.to_thread(_empty, name):
            continue
        proc = await asyncio.create_subprocess_exec(
            "systemctl", "stop", name, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        if proc.returncode != 0:
            log.warning("could not stop the pod's slice", slice=name,
                        error=err.decode(errors="replace").strip())
