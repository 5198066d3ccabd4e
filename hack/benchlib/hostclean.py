"""Host-level leftovers a failed run may leave: mounts, cgroups, pinned netns."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile

from hack.benchlib import procs

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


def delete_runc_containers(root: str) -> None:
    """`runc delete --force` every container under a runc --root (kills its processes)."""
    if not os.path.isdir(root):
        return
    for cid in os.listdir(root):
        subprocess.run(["runc", "--root", root, "delete", "--force", cid], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


WORKDIR_PREFIX = "crishim-bench-"
PIDFILE = "bench.pid"
# runc roots inside a bench work dir: crishim, each containerd (namespace k8s.io), the floor.
RUNC_ROOTS = ("crishim/state/runc", "containerd*/runc/k8s.io", "floor/runc")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_workdirs(bridges: list[str]) -> list[str]:
    """Remove what a bench killed with SIGKILL left behind: its daemons and monitors (found
    by their command lines naming the dead bench's work dir), containers, mounts, netns.
    Only dirs whose bench.pid names a dead process are touched."""
    cleaned = []
    for d in glob.glob(os.path.join(tempfile.gettempdir(), WORKDIR_PREFIX + "*")):
        try:
            with open(os.path.join(d, PIDFILE)) as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if _alive(pid):
            continue  # another bench is running
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid() and any(
                    d in arg for arg in procs.cmdline(int(entry))):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
        for rel in RUNC_ROOTS:
            for root in glob.glob(os.path.join(d, rel)):
                delete_runc_containers(root)
        for name in netns_names(f"bench-floor-{pid}-"):
            delete_netns(name)
        unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)
        cleaned.append(d)
    if cleaned:
        for bridge in bridges:
            subprocess.run(["ip", "link", "del", bridge], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return cleaned
