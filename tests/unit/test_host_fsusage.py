"""The one usage walker: allocated bytes, each inode once, one filesystem."""

from __future__ import annotations

import os
from pathlib import Path

from crishim.host.fsusage import mountpoint, walk_usage
from tests.fakes.fstree import make_tree


def test_walk_counts_bytes_and_inodes(tmp_path: Path) -> None:
    inodes = make_tree(tmp_path)
    u = walk_usage(str(tmp_path))
    assert u.inodes_used == len(inodes) == 6
    # Allocated blocks, not apparent sizes: a 10-byte file takes a whole block.
    blocks = sum(os.lstat(p).st_blocks for p in inodes)
    assert u.used_bytes == blocks * 512 >= 100_000


def test_walk_of_a_missing_path_or_a_file(tmp_path: Path) -> None:
    assert walk_usage(str(tmp_path / "missing")).inodes_used == 0
    (tmp_path / "f").write_bytes(b"x" * 5000)
    u = walk_usage(str(tmp_path / "f"))
    assert u.inodes_used == 1 and u.used_bytes == os.lstat(tmp_path / "f").st_blocks * 512


def test_mountpoint_is_an_ancestor_mount(tmp_path: Path) -> None:
    mp = mountpoint(str(tmp_path))
    assert os.path.ismount(mp) and os.path.realpath(tmp_path).startswith(mp)
