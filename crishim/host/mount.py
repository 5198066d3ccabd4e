"""Mount points on the host: whether a path is mounted, which paths under a directory are
(from /proc/self/mountinfo, which also sees bind and overlay mounts on the same
filesystem), unmounting, a recursive delete that never crosses into a mount, and
read-only binds made where a pod cannot undo the flag.

A question about one path goes to statx(2) (STATX_ATTR_MOUNT_ROOT), not to mountinfo:
the kernel writes mountinfo out whole, one line per mount, and on a node of 110 pods
reading it takes milliseconds each time, a few times in every pod's start and removal.
"""

from __future__ import annotations

import contextlib
import errno
import os

from crishim.host import libc
from crishim.log import get_logger

log = get_logger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
MAX_STACKED = 8  # mounts on one path that detach takes off


def _mount_points() -> list[str]:
    with open(MOUNTINFO) as fh:
        return [line.split()[4].replace("\\040", " ") for line in fh]


def is_mountpoint(path: str) -> bool:
    """Whether `path` (not followed if a symlink) is the root of a mount."""
    try:
        attributes, known = libc.statx_attributes(path)
    except OSError:
        return False
    if known & libc.STATX_ATTR_MOUNT_ROOT:
        return bool(attributes & libc.STATX_ATTR_MOUNT_ROOT)
    with contextlib.suppress(OSError):  # a kernel before 5.8
        return path in _mount_points()
    return False


def mounted_under(prefix: str) -> list[str]:
    """Mount points at or below `prefix` (deepest first)."""
    prefix = prefix.rstrip("/") + "/"
    return sorted({mp for mp in _mount_points() if mp.startswith(prefix)}, key=len,
                  reverse=True)


def make_target(source: str, target: str) -> None:
    """A mount point at `target` for `source`: a directory, or an empty file."""
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    if os.path.isdir(source):
        os.makedirs(target, mode=0o700, exist_ok=True)  # the mount's root shows through
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def bind_readonly(source: str, target: str, *, recursive_bind: bool,
                  recursive_readonly: bool) -> None:
    """A bind of `source` (with its submounts: `recursive_bind`) on `target`, read-only
    (every mount in it: `recursive_readonly`), a slave of `source`'s mount (host/libc.py
    `mount_setattr_readonly`). The flag is set on the detached copy in this (the
    host's) mount namespace: one that a pod's runtime creates later in the pod's user
    namespace gets it locked (MNT_LOCK_READONLY). Blocking."""
    make_target(source, target)
    fd = libc.open_tree(source, libc.OPEN_TREE_CLONE |
                        (libc.AT_RECURSIVE if recursive_bind else 0))
    try:
        libc.mount_setattr_readonly(fd, recursive_readonly, what=f"read-only {source}")
        libc.move_mount(fd, target)
    finally:
        os.close(fd)


def detach(path: str) -> None:
    """Unmount lazily (a straggler holding it cannot block us), each mount stacked on
    `path`; idempotent: the kernel's EINVAL says nothing (more) is mounted there."""
    for _ in range(MAX_STACKED):
        try:
            libc.umount2(path, libc.MNT_DETACH | libc.UMOUNT_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):
                return
            raise


def rmtree_same_fs(path: str) -> None:
    """rm -rf that never descends into a mount point (a leftover mount is logged and kept
    rather than having its contents deleted)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not os.path.isdir(path) or os.path.islink(path):
        os.unlink(path)
        return
    if os.path.ismount(path):
        log.warning("not removing a mount point", path=path)
        return
    for entry in os.scandir(path):
        full = entry.path
        if entry.is_dir(follow_symlinks=False):
            if os.lstat(full).st_dev != st.st_dev or os.path.ismount(full):
                log.warning("not removing a mount point", path=full)
                continue
            rmtree_same_fs(full)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
    try:
        os.rmdir(path)
    except OSError as exc:
        log.warning("directory not fully removed", path=path, error=str(exc))
