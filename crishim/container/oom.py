"""Was a container OOM-killed? The kernel's counters, read where they still exist.

conmon leaves a file "oom" when it sees the container cgroup's OOM counter move, but on
cgroup v2 under the systemd driver it often misses it: the container's scope empties when
its last process dies, systemd removes it at once, and conmon reads memory.events only
after the exit. So crishim notes the *parent's* oom_kill counter before `runc start`: on
v2 it is hierarchical (it counts kills in every child cgroup) and the parent — the pod's
slice, or system.slice — outlives the container. A container that died of SIGKILL while
that counter moved, and that crishim did not kill itself, was OOM-killed.
"""

from __future__ import annotations

import contextlib
import os
import signal

from crishim.oci.slices import cgroup_relpath

ROOT = "/sys/fs/cgroup"
SIGKILL_EXIT = 128 + signal.SIGKILL


def _v2() -> bool:
    return os.path.isfile(os.path.join(ROOT, "cgroup.controllers"))


def _count(path: str, key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError), open(path) as fh:
        for line in fh:
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    return None


def own_oom_kills(cgroups_path: str) -> int:
    """oom_kill of the container's own cgroup (0 when it is gone or unreadable)."""
    rel = cgroup_relpath(cgroups_path).lstrip("/")
    for path in (os.path.join(ROOT, "memory", rel, "memory.oom_control"),  # v1
                 os.path.join(ROOT, rel, "memory.events")):                # v2
        n = _count(path, "oom_kill")
        if n:
            return n
    return 0


def parent_oom_kills(cgroups_path: str) -> int:
    """The v2 parent cgroup's hierarchical oom_kill counter; -1 where there is none (v1,
    whose counters are not hierarchical, or no memory controller)."""
    if not cgroups_path or not _v2():
        return -1
    parent = os.path.dirname(cgroup_relpath(cgroups_path).rstrip("/")).lstrip("/")
    n = _count(os.path.join(ROOT, parent, "memory.events"), "oom_kill")
    return -1 if n is None else n
