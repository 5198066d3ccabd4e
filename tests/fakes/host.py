"""The host's side of a pod or a container in unit tests: plain files for netns pins and
checks of paths and processes."""

from __future__ import annotations

import os
from collections.abc import Sequence


def touch(path: str) -> None:
    """An empty file at `path`, its directory made."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def exists(path: str) -> bool:
    """Whether `path` is there."""
    return os.path.exists(path)


async def pin_netns(path: str, *, roots: Sequence[str]) -> None:
    """create_netns faked: the pin is a plain file."""
    touch(path)


async def unpin_netns(path: str, *, roots: Sequence[str]) -> None:
    """remove_netns faked: the plain file goes."""
    if exists(path):
        os.unlink(path)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
