"""The libc calls Python's os module lacks, loaded once for the whole daemon: mount(2),
umount2(2), unshare(2), setns(2), syncfs(2) and inotify. Each raises OSError (errno set,
the message naming `what` was done) when the call fails.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_BIND = 0x1000
MNT_DETACH = 0x2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]


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
