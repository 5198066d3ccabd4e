"""Host-level leftovers a failed run may leave: mounts, cgroups, pinned netns."""

from __future__ import annotations

import contextlib
import os
import subprocess

CGROUP_ROOT = "/sys/fs/cgroup"


def unmount_under(path: str) -> None:
    """Lazily unmount every mount below `path`, deepest first."""
    mounts = []
    prefix = path.rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                mp = line.split()[4].replace("\\040", " ")
                if mp == path or mp.startswith(prefix):
                    mounts.append(mp)
    except OSError:
        return
    for mp in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def remove_cgroup_tree(parent: str) -> None:
    """rmdir the (empty) cgroup dirs under `parent` in every v1 hierarchy, and in v2."""
    rel = parent.strip("/")
    roots = [CGROUP_ROOT]
    with contextlib.suppress(OSError):
        roots += [os.path.join(CGROUP_ROOT, d) for d in os.listdir(CGROUP_ROOT)]
    for root in roots:
        top = os.path.join(root, rel)
        if not os.path.isdir(top) or os.path.islink(root):
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def netns_names(prefix: str) -> set[str]:
    try:
        return {n for n in os.listdir("/run/netns") if n.startswith(prefix)}
    except OSError:
        return set()


def delete_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
