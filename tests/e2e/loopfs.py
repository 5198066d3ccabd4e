"""A filesystem of its own for a test: a sparse file made ext4 and loop-mounted."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def loop_filesystem(size_mib: int = 256, fstype: str = "ext4") -> Iterator[str]:
    """The mount point of a fresh `fstype` filesystem of `size_mib` MiB; unmounted and
    deleted afterwards (the loop device goes with the mount: autoclear)."""
    work = tempfile.mkdtemp(prefix="crishim-loopfs-")
    image, mnt = os.path.join(work, "disk.img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    with open(image, "wb") as fh:
        fh.truncate(size_mib * 1024 * 1024)
    subprocess.run([f"mkfs.{fstype}", "-q", "-F", image], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", image, mnt], check=True, capture_output=True)
    try:
        yield mnt
    finally:
        done = subprocess.run(["umount", mnt], capture_output=True)
        if done.returncode != 0:
            # Something still uses it (a test failed half-way): detached, not left mounted.
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
