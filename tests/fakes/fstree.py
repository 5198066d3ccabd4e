"""A small directory tree with the cases a usage walker must count right."""

from __future__ import annotations

import os
from pathlib import Path


def make_tree(root: Path) -> list[Path]:
    """Directories, a 100 kB file, a hard-linked small file and a dangling symlink under
    `root`; returns the paths that are one inode each (root included)."""
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(b"x" * 100_000)
    (root / "g").write_bytes(b"y" * 10)
    os.link(root / "g", root / "g2")  # a hard link is one inode, counted once
    os.symlink("/nonexistent", root / "dangling")
    return [root, root / "a", root / "a" / "b", root / "a" / "b" / "f", root / "g",
            root / "dangling"]
