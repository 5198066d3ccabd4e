"""The one way crishim deletes files: only strictly below one of its own roots.

A path to delete is often built from something a client, an image or a record said; if
that ever names a place outside the daemon's directories (`..`, an absolute path, a
symlink planted on the way), deleting it must fail loudly rather than take host data with
it. `remove(path, roots)` resolves the path's parent (symlinks included; the last
component itself is never followed) and refuses, with OutsideRoots and an error log,
anything that is not strictly below one of `roots` (resolved the same way). A root itself
is never removed either. The daemon's roots are `Roots(cfg.root, cfg.state)` and the
image store's directory (`image_root`, by default <root>/images, possibly on another
filesystem): the image store passes that dir alone, so image code never deletes
containers' or pods' files, and container and pod code never delete an image store
placed outside root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Sequence
from typing import NamedTuple

from crishim.host.mount import rmtree_same_fs
from crishim.log import get_logger

log = get_logger(__name__)


class OutsideRoots(Exception):
    """A removal named a path outside every root it was allowed under."""


class Roots(NamedTuple):
    """The daemon's own directories, `cfg.root` and `cfg.state`: a pod's, a container's
    and conmon's files are all below one of them. A tuple, so it is a `roots` as is."""

    root: str
    state: str


def confined(path: str, roots: Sequence[str]) -> str:
    """`path` with its parent resolved, if strictly below one of `roots`; else OutsideRoots."""
    if not path or "\0" in path:
        raise OutsideRoots(f"refusing to remove {path!r}: not a path")
    parent, name = os.path.split(os.path.abspath(path))
    if name in ("", ".", ".."):
        raise OutsideRoots(f"refusing to remove {path!r}: no final name")
    real = os.path.join(os.path.realpath(parent), name)
    for root in roots:
        base = os.path.realpath(root)
        if real != base and real.startswith(base.rstrip("/") + "/"):
            return real
    log.error("refusing to remove a path outside crishim's roots", path=path, resolved=real,
              roots=list(roots))
    raise OutsideRoots(f"refusing to remove {path!r} (resolves to {real!r}): not under "
                       f"{', '.join(roots)}")


def unlink(path: str, roots: Sequence[str]) -> None:
    """One unlink (a missing file is fine; a directory is an error, as for os.unlink) of
    `path` if strictly below one of `roots`; else OutsideRoots."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(confined(path, roots))


def remove(path: str, roots: Sequence[str], *, same_fs: bool = False) -> None:
    """rm -rf `path` (a missing one is fine) if it is strictly below one of `roots`.

    A symlink is removed, never followed. Errors inside the tree are logged, not raised
    (as rmtree's ignore_errors), so a cleanup goes as far as it can. `same_fs`: never
    descend into a mount point (see mount.rmtree_same_fs)."""
    real = confined(path, roots)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):  # a symlink to a directory included
        with contextlib.suppress(FileNotFoundError):
            os.unlink(real)
        return
    if same_fs:
        rmtree_same_fs(real)
        return
    shutil.rmtree(real, onerror=_log_error)


def _log_error(func: object, path: str, exc_info: tuple[type[BaseException], BaseException,
                                                        object]) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        log.warning("could not remove", path=path, error=str(exc_info[1]))
