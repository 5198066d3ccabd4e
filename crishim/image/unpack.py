"""Unpack one layer tar into its own directory, safely, as an overlayfs lower layer.

Nothing a tar says may create or change anything outside `dest`:
- member names are cleaned lexically; a `..` component rejects the layer, a leading `/`
  is dropped (the name is relative to the layer root, like tar does);
- every parent directory is opened component by component with O_NOFOLLOW relative to
  the previous one (openat-style): a symlink anywhere in a path rejects the layer, so
  "symlink then a file through it" cannot escape;
- files are created with O_CREAT|O_EXCL|O_NOFOLLOW and symlinks are never followed;
- hardlink targets are resolved the same way, so they can only name files of this layer.
OCI whiteouts become overlayfs whiteouts (`.wh.x` -> char device 0:0 named x) and opaque
directories (`.wh..wh..opq` -> xattr trusted.overlay.opaque=y). Layers must not smuggle
overlay xattrs of their own (trusted.overlay.* from the tar is dropped).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass, field

from crishim.errors import FailedPrecondition
from crishim.image.stream import Readable
from crishim.log import get_logger

log = get_logger(__name__)

WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_COPY = 1 << 20


class UnsafeLayer(FailedPrecondition):
    """The layer tries to write outside its directory or is malformed: the image is at
    fault, not crishim (the pull layer adds which image and layer)."""


@dataclass
class UnpackStats:
    files: int = 0
    dirs: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


def clean(name: str) -> list[str]:
    """Path components of a member name inside the layer; rejects `..`."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeLayer(f"layer member {name!r} has a '..' component")
    if any("\0" in p for p in parts):
        raise UnsafeLayer(f"layer member {name!r} contains a NUL byte")
    return parts


class _Unpacker:
    def __init__(self, dest: str) -> None:
        self.root = os.open(dest, _DIR_FLAGS)
        self.is_root = os.geteuid() == 0
        self._fds: dict[tuple[str, ...], int] = {}
        self._dirs: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
        self.stats = UnpackStats()

    def close(self) -> None:
        self._drop_cache()
        os.close(self.root)

    def _drop_cache(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def dir_fd(self, parts: tuple[str, ...], create: bool) -> int:
        """fd of directory `parts` below the root, never following a symlink."""
        if not parts:
            return self.root
        fd = self._fds.get(parts)
        if fd is not None:
            return fd
        parent = self.dir_fd(parts[:-1], create)
        name = parts[-1]
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise UnsafeLayer(f"{'/'.join(parts)} does not exist in the layer") from None
            os.mkdir(name, 0o755, dir_fd=parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            os.fchmod(fd, 0o755)  # a dir the layer does not list: 0755, not the umask's cut
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeLayer(f"path {'/'.join(parts)!r} in the layer goes through a "
                                  "symlink or a non-directory; refusing to follow it") from None
            raise
        if len(self._fds) > 512:  # bound open fds on huge trees
            self._drop_cache()
            return self.dir_fd(parts, create)
        self._fds[parts] = fd
        return fd

    def _remove(self, pfd: int, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            self._drop_cache()  # cached fds below it would point into a deleted tree
            shutil.rmtree(name, dir_fd=pfd)
        else:
            os.unlink(name, dir_fd=pfd)

    # --- attributes -----------------------------------------------------------------------
    def _xattrs(self, target: int | str, ti: tarfile.TarInfo, pfd: int | None = None) -> None:
        for key, value in ti.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            name = key[len("SCHILY.xattr."):]
            if name.startswith(("trusted.overlay.", "user.overlay.")):
                continue  # only we decide overlay metadata
            raw = value.encode("utf-8", "surrogateescape")
            try:
                os.setxattr(target, name, raw)
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EPERM, errno.EACCES):
                    raise
                self.stats.skipped.append(f"xattr {name} on {ti.name}: {exc.strerror}")

    def _own_mode_time(self, fd: int, ti: tarfile.TarInfo) -> None:
        if self.is_root:
            os.fchown(fd, ti.uid, ti.gid)
        os.fchmod(fd, ti.mode & 0o7777)
        ns = int(ti.mtime * 1_000_000_000)
        os.utime(fd, ns=(ns, ns))

    def _own_time_nofollow(self, pfd: int, name: str, ti: tarfile.TarInfo) -> None:
        if self.is_root:
            os.chown(name, ti.uid, ti.gid, dir_fd=pfd, follow_symlinks=False)
        ns = int(ti.mtime * 1_000_000_000)
        os.utime(name, ns=(ns, ns), dir_fd=pfd, follow_symlinks=False)

    # --- members --------------------------------------------------------------------------
    def member(self, tf: tarfile.TarFile, ti: tarfile.TarInfo) -> None:
        parts = tuple(clean(ti.name))
        if not parts:
            if ti.isdir():
                self._dirs.append(((), ti))
            return
        if any(p.startswith(WHITEOUT_PREFIX * 2) for p in parts[:-1]):
            self.stats.skipped.append(f"{ti.name}: inside aufs metadata")
            return
        pfd = self.dir_fd(parts[:-1], create=True)
        name = parts[-1]
        if name.startswith(WHITEOUT_PREFIX):
            self._whiteout(pfd, parts, name)
            return
        if ti.isdir():
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    self._remove(pfd, name)
                    os.mkdir(name, 0o755, dir_fd=pfd)
            except FileNotFoundError:
                os.mkdir(name, 0o755, dir_fd=pfd)
            self._dirs.append((parts, ti))
            self.stats.dirs += 1
            return
        self._remove(pfd, name)
        if ti.isreg():
            self._file(tf, ti, pfd, name)
        elif ti.issym():
            os.symlink(ti.linkname, name, dir_fd=pfd)
            self._own_time_nofollow(pfd, name, ti)
        elif ti.islnk():
            self._hardlink(ti, pfd, name)
        elif ti.ischr() or ti.isblk() or ti.isfifo():
            self._special(ti, pfd, name)
        else:
            self.stats.skipped.append(f"{ti.name}: unsupported tar type {ti.type!r}")
            return
        self.stats.files += 1

    def _file(self, tf: tarfile.TarFile, ti: tarfile.TarInfo, pfd: int, name: str) -> None:
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=pfd)
        try:
            src = tf.extractfile(ti)
            if src is not None and ti.size:
                remaining = ti.size
                while remaining > 0:
                    buf = src.read(min(_COPY, remaining))
                    if not buf:
                        raise UnsafeLayer(f"layer ends inside {ti.name!r} (truncated)")
                    view = memoryview(buf)
                    while view:
                        view = view[os.write(fd, view):]
                    remaining -= len(buf)
                self.stats.bytes += ti.size
            self._xattrs(fd, ti)
            self._own_mode_time(fd, ti)
        finally:
            os.close(fd)

    def _hardlink(self, ti: tarfile.TarInfo, pfd: int, name: str) -> None:
        target = tuple(clean(ti.linkname))
        if not target:
            raise UnsafeLayer(f"hardlink {ti.name!r} has an empty target")
        tfd = self.dir_fd(target[:-1], create=False)
        try:
            st = os.stat(target[-1], dir_fd=tfd, follow_symlinks=False)
        except FileNotFoundError:
            raise UnsafeLayer(f"hardlink {ti.name!r} -> {ti.linkname!r}: target is not in "
                              "this layer") from None
        if stat.S_ISDIR(st.st_mode):
            raise UnsafeLayer(f"hardlink {ti.name!r} -> {ti.linkname!r}: target is a directory")
        os.link(target[-1], name, src_dir_fd=tfd, dst_dir_fd=pfd, follow_symlinks=False)

    def _special(self, ti: tarfile.TarInfo, pfd: int, name: str) -> None:
        if ti.isfifo():
            os.mkfifo(name, ti.mode & 0o7777, dir_fd=pfd)
            os.chmod(name, ti.mode & 0o7777, dir_fd=pfd)
        else:
            kind = stat.S_IFCHR if ti.ischr() else stat.S_IFBLK
            try:
                os.mknod(name, kind | (ti.mode & 0o7777), os.makedev(ti.devmajor, ti.devminor),
                         dir_fd=pfd)
            except PermissionError:
                self.stats.skipped.append(f"{ti.name}: device node needs root")
                return
        if self.is_root:
            os.chown(name, ti.uid, ti.gid, dir_fd=pfd, follow_symlinks=False)
        if not ti.isfifo():  # a fifo got its exact mode right after mkfifo
            os.chmod(name, ti.mode & 0o7777, dir_fd=pfd)
        ns = int(ti.mtime * 1_000_000_000)
        os.utime(name, ns=(ns, ns), dir_fd=pfd, follow_symlinks=False)

    def _whiteout(self, pfd: int, parts: tuple[str, ...], name: str) -> None:
        if name == OPAQUE:
            os.setxattr(pfd, OPAQUE_XATTR, b"y")
            return
        if name.startswith(WHITEOUT_PREFIX * 2):
            # aufs metadata (.wh..wh.plnk, .wh..wh.aufs) from old docker images: not content.
            self.stats.skipped.append(f"{'/'.join(parts)}: aufs metadata")
            return
        real = name[len(WHITEOUT_PREFIX):]
        if real in ("", ".", ".."):
            raise UnsafeLayer(f"bad whiteout {'/'.join(parts)!r}")
        self._remove(pfd, real)
        try:
            os.mknod(real, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=pfd)
        except PermissionError:
            raise UnsafeLayer("whiteouts need root (mknod 0:0) to unpack") from None

    def finish(self) -> None:
        """Directory attributes last: children change a dir's mtime, and a 0555 dir must
        still accept its children while unpacking."""
        for parts, ti in reversed(self._dirs):
            fd = os.open(".", _DIR_FLAGS, dir_fd=self.dir_fd(parts, create=False))
            try:
                self._xattrs(fd, ti)
                self._own_mode_time(fd, ti)
            finally:
                os.close(fd)


def unpack(reader: Readable, dest: str) -> UnpackStats:
    """Unpack the uncompressed tar stream `reader` into the existing, empty dir `dest`."""
    u = _Unpacker(dest)
    try:
        try:
            with tarfile.open(fileobj=reader, mode="r|", bufsize=256 * 1024) as tf:  # type: ignore[call-overload]
                for ti in tf:
                    u.member(tf, ti)
        except tarfile.TarError as exc:
            raise UnsafeLayer(f"layer is not a valid tar archive: {exc}") from None
        u.finish()
    finally:
        u.close()
    if u.stats.skipped:
        log.debug("unpack skipped entries", dest=dest, skipped=len(u.stats.skipped),
                  first=u.stats.skipped[0])
    return u.stats
