"""crishim/host/mount.py against the kernel: which paths are mount points (tmpfs, a bind
mount on the same filesystem, a namespace pinned on a file), that a symlink is never
followed, and that detach takes off every mount stacked on a path, idempotently."""

from __future__ import annotations

import os
from pathlib import Path

from crishim.host import libc
from crishim.host.mount import _mount_points, detach, is_mountpoint


def test_mount_points_are_told_apart_from_plain_paths(tmp_path: Path) -> None:
    shm, bound, pin = tmp_path / "shm", tmp_path / "bound", tmp_path / "netns"
    shm.mkdir()
    bound.mkdir()
    pin.touch()
    link = tmp_path / "link"
    link.symlink_to(shm)
    assert not any(is_mountpoint(str(p)) for p in (shm, bound, pin, link))
    assert not is_mountpoint(str(tmp_path / "missing"))
    libc.mount("shm", str(shm), "tmpfs")
    libc.mount(str(bound), str(bound), None, libc.MS_BIND)  # the same filesystem
    libc.mount("/proc/self/ns/net", str(pin), None, libc.MS_BIND)
    try:
        for p in (shm, bound, pin):
            assert is_mountpoint(str(p)) and str(p) in _mount_points()
        assert not is_mountpoint(str(link))  # a symlink is not a mount, whatever it names
        detach(str(link))  # and detach does not follow it
        assert is_mountpoint(str(shm))
    finally:
        for p in (shm, bound, pin):
            detach(str(p))
    assert not any(is_mountpoint(str(p)) or str(p) in _mount_points()
                   for p in (shm, bound, pin))


def test_detach_takes_off_stacked_mounts_and_is_idempotent(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    for _ in range(3):
        libc.mount("shm", str(target), "tmpfs")
    assert _mount_points().count(str(target)) == 3
    detach(str(target))
    assert str(target) not in _mount_points()
    detach(str(target))
    detach(str(tmp_path / "missing"))
    os.rmdir(target)
