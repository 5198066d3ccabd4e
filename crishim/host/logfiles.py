"""A container's log directory and files, which conmon writes as root, in a directory a
pod may write too (a log shipper with a hostPath on /var/log).

Below the pod's log directory nothing is followed: each component (the pod's directory
itself included) is opened through its parent's fd with O_NOFOLLOW and made with mkdirat
when missing, and a symlinked component is refused. The pod directory's ancestors are the
host's layout (/var/log may be a link to another disk) and are resolved normally.

conmon opens the log by path: at start `<log>` (append, create), at a reopen `<log>.tmp`
(create, truncate) which it then renames over `<log>`; both follow symlinks. So before
each, a link or other non-file left at those names is unlinked (the link itself, through
the directory's fd), and before a reopen `<log>.tmp` is made here as a fresh empty
regular file, which conmon's truncation then finds. What remains is the window between
this and conmon's open, which only conmon opening through a directory fd would close.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from crishim.errors import FailedPrecondition
from crishim.host import modes

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LOG_MODE = 0o640  # conmon's for the files it makes
TMP_SUFFIX = ".tmp"


def split(log_path: str, relative: str) -> tuple[str, str]:
    """(the pod's log directory, the log's path below it) of a container log `log_path`,
    which is the pod's directory joined with the ContainerConfig's `relative`."""
    if not relative or not log_path.endswith(relative):
        return os.path.dirname(log_path), os.path.basename(log_path)
    return log_path[:len(log_path) - len(relative)].rstrip("/") or "/", relative


def open_dir(pod_dir: str, sub: str, mode: int) -> int:
    """An fd of the directory `pod_dir`/`sub`, every dir from `pod_dir` down opened (made
    with `mode` where missing) without following a symlink. FailedPrecondition names a
    symlinked (or non-directory) component."""
    pod_dir = os.path.normpath(pod_dir)
    parent, name = os.path.split(pod_dir)
    if not os.path.isdir(parent):
        modes.make_dir(parent, mode)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = parent
    try:
        for part in [name, *[p for p in sub.split("/") if p]]:
            path = os.path.join(path, part)
            if part in (".", ".."):
                raise FailedPrecondition(f"log directory {path!r}: '.' and '..' are refused")
            child = _open_or_make(fd, part, mode, path)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_or_make(dir_fd: int, name: str, mode: int, path: str) -> int:
    made = False
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=dir_fd)
            made = True
        fd = _open_existing(dir_fd, name, path)
    except OSError as exc:
        raise _refused(exc, path) from None
    if made:
        os.fchmod(fd, mode)  # exactly `mode`, not the umask's cut of it
    return fd


def _open_existing(dir_fd: int, name: str, path: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _refused(exc, path) from None


def _refused(exc: OSError, path: str) -> Exception:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FailedPrecondition(f"log directory {path!r} is a symlink or not a directory; "
                                  "a container's log is written only in real directories "
                                  "below the pod's log directory")
    return exc


def clear_link(dir_fd: int, name: str) -> bool:
    """Unlink `name` in the directory if it is anything but a regular file (a symlink is
    removed itself, never followed); whether something was removed."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode):
        return False
    if stat.S_ISDIR(st.st_mode):
        raise FailedPrecondition(f"container log file {name!r} is a directory")
    os.unlink(name, dir_fd=dir_fd)
    return True


def prepare_log(pod_dir: str, relative: str, dir_mode: int) -> None:
    """Before conmon first opens the log: its directory made without following links,
    and no link at the log's name or its `.tmp`."""
    sub, name = os.path.split(relative)
    fd = open_dir(pod_dir, sub, dir_mode)
    try:
        clear_link(fd, name)
        clear_link(fd, name + TMP_SUFFIX)
    finally:
        os.close(fd)


def prepare_reopen(pod_dir: str, relative: str) -> None:
    """Before conmon reopens the log: `<log>.tmp`, whatever was there (a planted link
    included, unlinked itself), replaced by a fresh empty regular file of ours."""
    sub, name = os.path.split(relative)
    fd = open_dir(pod_dir, sub, 0o755)
    try:
        tmp = name + TMP_SUFFIX
        if not clear_link(fd, tmp):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)  # a stale file of an earlier reopen
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, LOG_MODE, dir_fd=fd))
    finally:
        os.close(fd)


def discard_tmp(pod_dir: str, relative: str) -> None:
    """Remove our `<log>.tmp` after a reopen conmon did not carry out."""
    sub, name = os.path.split(relative)
    with contextlib.suppress(OSError, FailedPrecondition):
        fd = open_dir(pod_dir, sub, 0o755)
        try:
            os.unlink(name + TMP_SUFFIX, dir_fd=fd)
        finally:
            os.close(fd)
