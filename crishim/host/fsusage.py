"""Disk usage of a directory tree, counted as the kubelet expects it (as containerd and
CRI-O count): bytes actually allocated (st_blocks * 512), each inode once (hard links are
one inode), the directory itself included, staying on its filesystem (a mount below it,
such as a container's merged rootfs, would count image files as its usage).

The image store (ImageFsInfo) and the writable layers (container stats) both walk here;
each keeps the cache it needs above this.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class FsUsage:
    used_bytes: int
    inodes_used: int
    timestamp_ns: int


def walk_usage(path: str) -> FsUsage:
    """du-like usage of `path`: allocated bytes and distinct inodes, staying on one fs."""
    now = time.time_ns()
    try:
        top = os.lstat(path)
    except OSError:
        return FsUsage(0, 0, now)
    dev = top.st_dev
    seen: set[int] = {top.st_ino}
    used = top.st_blocks * 512
    stack = [path] if stat.S_ISDIR(top.st_mode) else []
    while stack:
        current = stack.pop()
        try:
            it = os.scandir(current)
        except OSError:
            continue  # removed or unreadable while walking
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != dev or st.st_ino in seen:
                    continue  # another mount, or a hard link already counted
                seen.add(st.st_ino)
                used += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return FsUsage(used, len(seen), now)


def mountpoint(path: str) -> str:
    """The mount point of the filesystem holding `path` (symlinks resolved)."""
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
