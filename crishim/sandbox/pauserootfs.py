"""The embedded pause's rootfs, {root}/pause/rootfs: a copy of the host's static catatonit
and the mount points runc needs, shared by every pod that has no `pause_image`.

Being shared, it is checked by content, not by size or mtime: once per daemon start,
before the first pod uses it, the tree (every entry's type, mode, owner and, for files,
sha256) is compared with what it must be, which is computed from the catatonit binary
and the fixed layout. Anything else (a changed byte, a planted file or symlink) has the
whole tree rebuilt in a fresh private directory, with every file created relative to a
directory fd without following symlinks (O_NOFOLLOW|O_EXCL), then swapped in at once
with renameat2(RENAME_EXCHANGE). A lock file serializes concurrent first RunPodSandbox
calls: the first rebuilds, the others find it right.

A user-namespaced pod never writes it: it gets a read-only idmapped view whose flag is
locked for the pod (host/idmap.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

from crishim.errors import FailedPrecondition
from crishim.host import libc, modes

# Mount points runc needs: present from the start, the shared rootfs is never touched later.
DIRS = ("proc", "dev", "sys", "etc", "tmp")
FILES = ("etc/hostname", "etc/hosts", "etc/resolv.conf")  # empty
CATATONIT = "catatonit"
DIR_MODE, FILE_MODE, EXEC_MODE = 0o755, 0o644, 0o755
# The rootfs itself: the container's "/", which a pause running as a pod's non-root
# runAsUser passes through.
ROOT_MODE = modes.PASS_THROUGH
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_CHUNK = 1 << 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# Relative path ("." for the top) → what is there, one comparable string.
Manifest = dict[str, str]


def expected(catatonit_sha256: str, uid: int, gid: int) -> Manifest:
    """The manifest the rootfs must have, its files owned by uid:gid."""
    own = f"{uid}:{gid}"
    out = {".": f"dir {ROOT_MODE:o} {own}"}
    out.update({d: f"dir {DIR_MODE:o} {own}" for d in DIRS})
    out.update({f: f"file {FILE_MODE:o} {own} {EMPTY_SHA256}" for f in FILES})
    out[CATATONIT] = f"file {EXEC_MODE:o} {own} {catatonit_sha256}"
    return out


def digest(manifest: Manifest) -> str:
    """One sha256 for a whole manifest (what the logs and tests compare)."""
    h = hashlib.sha256()
    for path in sorted(manifest):
        h.update(f"{path}\0{manifest[path]}\n".encode())
    return h.hexdigest()


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _entry(dir_fd: int, name: str) -> str:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    mode, own = stat.S_IMODE(st.st_mode), f"{st.st_uid}:{st.st_gid}"
    if stat.S_ISDIR(st.st_mode):
        return f"dir {mode:o} {own}"
    if stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            return f"file {mode:o} {own} {_sha256_fd(fd)}"
        finally:
            os.close(fd)
    if stat.S_ISLNK(st.st_mode):
        return f"symlink {os.readlink(name, dir_fd=dir_fd)}"
    return f"other {st.st_mode:o}"


def manifest(rootfs: str) -> Manifest | None:
    """What is at `rootfs`, nothing followed; None when it is not a directory."""
    try:
        top = os.open(rootfs, _DIR_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink
            return None
        raise
    try:
        out: Manifest = {".": _entry(top, ".")}
        _walk(top, "", out)
        return out
    finally:
        os.close(top)


def _walk(dir_fd: int, prefix: str, out: Manifest) -> None:
    for name in sorted(os.listdir(dir_fd)):
        rel = prefix + name
        out[rel] = _entry(dir_fd, name)
        if out[rel].startswith("dir "):
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                _walk(sub, rel + "/", out)
            finally:
                os.close(sub)


def _copy(src: str, dst_dir: int, name: str) -> str:
    """Copy `src` to a new file `name` in `dst_dir`; the sha256 of what was written."""
    h = hashlib.sha256()
    sfd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dfd = os.open(name, _NEW_FILE, 0o600, dir_fd=dst_dir)
        try:
            while chunk := os.read(sfd, _CHUNK):
                h.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dfd, view):]
            os.fchmod(dfd, EXEC_MODE)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    return h.hexdigest()


def build(path: str, catatonit_path: str) -> str:
    """Fill the new, empty directory `path` with the rootfs; the sha256 of the catatonit
    copied. Nothing is followed: every entry is created relative to a directory fd."""
    top = os.open(path, _DIR_FLAGS)
    try:
        os.fchmod(top, ROOT_MODE)
        for d in DIRS:
            os.mkdir(d, DIR_MODE, dir_fd=top)
            fd = os.open(d, _DIR_FLAGS, dir_fd=top)
            try:
                os.fchmod(fd, DIR_MODE)  # not the daemon's umask's cut of it
            finally:
                os.close(fd)
        for f in FILES:
            parent, name = os.path.split(f)
            pfd = os.open(parent, _DIR_FLAGS, dir_fd=top)
            try:
                fd = os.open(name, _NEW_FILE, FILE_MODE, dir_fd=pfd)
                os.fchmod(fd, FILE_MODE)
                os.close(fd)
            finally:
                os.close(pfd)
        sha = _copy(catatonit_path, top, CATATONIT)
        os.fsync(top)
        return sha
    finally:
        os.close(top)


def _discard(path: str) -> None:
    """Remove `path`, a tree or anything else, never following a symlink in it."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)  # fd-based on Linux: symlinks inside are removed, not followed
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def _locked(pause_dir: str) -> Iterator[None]:
    fd = os.open(os.path.join(pause_dir, ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def _source_sha256(catatonit_path: str) -> str:
    try:
        fd = os.open(catatonit_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise FailedPrecondition(f"catatonit_path {catatonit_path!r} is not usable for the "
                                 f"embedded pause: {exc.strerror}; install catatonit or set "
                                 "pause_image") from None
    try:
        return _sha256_fd(fd)
    finally:
        os.close(fd)


def ensure(root: str, catatonit_path: str) -> str:
    """{root}/pause/rootfs, as it must be (rebuilt if it is not); its path. Blocking."""
    pause_dir = os.path.join(root, "pause")
    rootfs = os.path.join(pause_dir, "rootfs")
    want = expected(_source_sha256(catatonit_path), os.geteuid(), os.getegid())
    modes.make_dir(pause_dir, modes.PRIVATE)
    with _locked(pause_dir):
        if manifest(rootfs) == want:
            return rootfs
        tmp = tempfile.mkdtemp(dir=pause_dir, prefix=".build-")
        try:
            if build(tmp, catatonit_path) != want[CATATONIT].rsplit(" ", 1)[1]:
                raise FailedPrecondition(f"catatonit_path {catatonit_path!r} changed while "
                                         "it was copied; retry")
            if os.path.lexists(rootfs):
                # One step: a pod starting now sees the old tree or the new one, whole.
                libc.rename_exchange(tmp, rootfs)
            else:
                os.rename(tmp, rootfs)
        finally:
            _discard(tmp)  # the old tree, or the new one when it could not be put in place
    return rootfs
