"""The libc calls Python's os module lacks, loaded once for the whole daemon: mount(2),
umount2(2), statx(2)'s attributes, unshare(2), setns(2), syncfs(2), inotify, quotactl(2),
renameat2(2)'s RENAME_EXCHANGE, and the new mount API calls that make idmapped mounts
(open_tree, mount_setattr, move_mount; no libc wrapper in glibc 2.36, so through
syscall(2)). Each raises OSError (errno set,
the message naming `what` was done) when the call fails.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_BIND = 0x1000
MS_SLAVE = 0x80000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_NO_AUTOMOUNT = 0x800
STATX_ATTR_MOUNT_ROOT = 0x2000
_STATX_SIZE = 256  # struct statx
_STATX_ATTRIBUTES = 8  # offsets of stx_attributes and stx_attributes_mask (both u64)
_STATX_ATTRIBUTES_MASK = 56
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 0x1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_IDMAP = 0x00100000
RENAME_EXCHANGE = 0x2
# syscall numbers: the same on x86_64 and the generic table (arm64, riscv64).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                        ctypes.c_void_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                            ctypes.c_uint]
_libc.syscall.restype = ctypes.c_long
_libc.quotactl.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _enc(value: str | None) -> bytes | None:
    return os.fsencode(value) if value is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0,
          data: str | None = None, what: str = "") -> None:
    _check(_libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)),
           what or f"mount {target}")


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(os.fsencode(target), flags), f"umount {target}")


def statx_attributes(path: str) -> tuple[int, int]:
    """(stx_attributes, stx_attributes_mask) of `path` itself (a symlink is not
    followed, nothing is automounted)."""
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    _check(_libc.statx(AT_FDCWD, os.fsencode(path), AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT,
                       0, buf), f"statx {path}")
    return (int.from_bytes(buf.raw[_STATX_ATTRIBUTES:_STATX_ATTRIBUTES + 8], "little"),
            int.from_bytes(buf.raw[_STATX_ATTRIBUTES_MASK:_STATX_ATTRIBUTES_MASK + 8],
                           "little"))


def rename_exchange(a: str, b: str) -> None:
    """Swap the two names `a` and `b` atomically (neither is followed if a symlink)."""
    _check(_libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b),
                           RENAME_EXCHANGE), f"exchange {a} and {b}")


def unshare(flags: int, what: str = "unshare") -> None:
    _check(_libc.unshare(flags), what)


def setns(fd: int, nstype: int, what: str = "setns") -> None:
    _check(_libc.setns(fd, nstype), what)


def syncfs(fd: int, what: str = "syncfs") -> None:
    _check(_libc.syncfs(fd), what)


def inotify_init1(flags: int) -> int:
    return _check(_libc.inotify_init1(flags), "inotify_init1")


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    return _check(_libc.inotify_add_watch(fd, os.fsencode(path), mask),
                  f"inotify_add_watch {path}")


def quotactl(cmd: int, special: str, qid: int, buf: bytearray | None, what: str) -> None:
    """quotactl(cmd, special, qid, buf): `buf` is read and written in place (the kernel
    fills it for the get commands)."""
    cbuf = None if buf is None else ctypes.create_string_buffer(bytes(buf), len(buf))
    _check(_libc.quotactl(cmd, os.fsencode(special), qid, cbuf), what)
    if buf is not None and cbuf is not None:
        buf[:] = cbuf.raw[:len(buf)]


def _new_mount_api() -> bool:
    return platform.machine() in ("x86_64", "aarch64", "riscv64")


def open_tree(path: str, flags: int) -> int:
    """open_tree(AT_FDCWD, path, flags): with OPEN_TREE_CLONE a detached copy of the mount
    (AT_RECURSIVE: with its submounts) as an fd."""
    if not _new_mount_api():
        raise OSError(38, f"open_tree {path}: not wired for {platform.machine()}")
    return _check(_libc.syscall(ctypes.c_long(_SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD),
                                os.fsencode(path), ctypes.c_uint(flags | os.O_CLOEXEC)),
                  f"open_tree {path}")


def mount_setattr_idmap(fd: int, userns_fd: int, what: str = "mount_setattr", *,
                        readonly: bool = False) -> None:
    """Give the detached tree `fd` (and its submounts) the id mapping of `userns_fd`;
    with `readonly`, make them read-only too. Each becomes a slave of the mount it was
    copied from (see `mount_setattr_readonly`)."""
    attr = _MountAttr(attr_set=MOUNT_ATTR_IDMAP | (MOUNT_ATTR_RDONLY if readonly else 0),
                      propagation=MS_SLAVE, userns_fd=userns_fd)
    _setattr(fd, attr, AT_RECURSIVE, what)


def mount_setattr_readonly(fd: int, recursive: bool, what: str = "mount_setattr") -> None:
    """Make the detached tree `fd` read-only (its top mount, or every mount in it) and
    every mount in it a slave: it still receives the mounts and unmounts of the mounts
    it was copied from, but unmounting its own copies never propagates back to them."""
    _setattr(fd, _MountAttr(propagation=MS_SLAVE), AT_RECURSIVE, what)
    _setattr(fd, _MountAttr(attr_set=MOUNT_ATTR_RDONLY), AT_RECURSIVE if recursive else 0,
             what)


def _setattr(fd: int, attr: _MountAttr, flags: int, what: str) -> None:
    _check(_libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(fd), b"",
                         ctypes.c_uint(AT_EMPTY_PATH | flags), ctypes.byref(attr),
                         ctypes.c_size_t(ctypes.sizeof(attr))), what)


def move_mount(fd: int, target: str) -> None:
    """Attach the detached tree `fd` at `target`."""
    _check(_libc.syscall(ctypes.c_long(_SYS_MOVE_MOUNT), ctypes.c_int(fd), b"",
                         ctypes.c_int(AT_FDCWD), os.fsencode(target),
                         ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount {target}")
