"""Resolve the container's uid/gid/groups from the image USER, the CRI security context,
and the rootfs's /etc/passwd and /etc/group.

The rootfs is untrusted image content: /etc/passwd may be a symlink to /etc/shadow of the
HOST if followed naively, so every path is resolved inside the rootfs (`scoped_path`),
with absolute links and `..` clamped at the rootfs root, like a chroot would. A file read
from it (`read_image_file`) is opened only once it is known to be a regular file of
bounded size: a FIFO would hang the worker thread, a device node would be opened by root
on the host.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import stat
from dataclasses import dataclass, field

from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.validate.fields import MAX_ID

MAX_SYMLINKS = 40
# What reads as a number in a USER string or a passwd/group field (ASCII only: str.isdigit
# takes other scripts' digits, some of which int() refuses).
_NUMBER = re.compile(r"-?[0-9]+")
# The most read from one image file (/etc/passwd, /etc/group); a real one is a few KiB.
MAX_IMAGE_FILE = 1 << 20

# openat2(2): resolution confined to the directory fd, by the kernel, race-free.
_SYS_OPENAT2 = 437  # x86_64 and the generic table alike
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_openat2_missing = False


def _open_in_root(root_fd: int, path: str, flags: int) -> int:
    """`path` opened below `root_fd` with every symlink and `..` kept inside it: by
    openat2(RESOLVE_IN_ROOT) where the kernel has it, else through `scoped_path` and an
    open that follows no link at the end."""
    global _openat2_missing
    if not _openat2_missing:
        how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
        ret = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(root_fd),
                            os.fsencode(path.lstrip("/") or "."), ctypes.byref(how),
                            ctypes.c_size_t(ctypes.sizeof(how)))
        if ret >= 0:
            return int(ret)
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter refused it
            raise OSError(err, os.strerror(err), path)
        _openat2_missing = True
    resolved = scoped_path(f"/proc/self/fd/{root_fd}", path)
    return os.open(resolved, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_in_root(root_fd: int, path: str, flags: int) -> int:
    """`path` opened below `root_fd`, every symlink and `..` kept inside it (for what
    else writes into a rootfs: a checkpoint's files at restore)."""
    return _open_in_root(root_fd, path, flags)


def read_image_file(root: str, path: str, limit: int = MAX_IMAGE_FILE) -> bytes | None:
    """The bytes of `path` inside the image rootfs `root`, None if it does not exist.

    FailedPrecondition (naming the file) for anything but a regular file of at most
    `limit` bytes, and for a symlink loop. The file is first reached with O_PATH, which
    opens nothing, so a FIFO or a device is refused before it is ever opened."""
    where = f"the image's {path}"
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FailedPrecondition(f"cannot open the container's rootfs to read {path}: "
                                 f"{exc.strerror}") from None
    try:
        try:
            path_fd = _open_in_root(root_fd, path, _O_PATH)
        except InvalidArgument:  # scoped_path: too many links
            raise FailedPrecondition(f"{where}: too many levels of symbolic links") from None
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if exc.errno == errno.ELOOP:
                raise FailedPrecondition(f"{where}: too many levels of symbolic links"
                                         ) from None
            raise FailedPrecondition(f"cannot open {where}: {exc.strerror}") from None
        try:
            st = os.fstat(path_fd)
            _check_regular(where, st, limit)
            # Re-opened through the O_PATH fd: the same inode, no second path walk (the
            # magic link is the fd itself, so O_NOFOLLOW, which refuses it, is not set).
            fd = os.open(f"/proc/self/fd/{path_fd}",
                         os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(path_fd)
        try:
            st2 = os.fstat(fd)
            if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
                raise FailedPrecondition(f"{where} changed while it was being read")
            _check_regular(where, st2, limit)
            data = os.read(fd, limit + 1)
            if len(data) > limit:
                raise FailedPrecondition(f"{where} is larger than {limit} bytes")
            return data
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)


def _check_regular(where: str, st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise FailedPrecondition(f"{where} is a {_kind(st.st_mode)}, not a regular file; "
                                 "the image must ship it as a plain file")
    if st.st_size > limit:
        raise FailedPrecondition(f"{where} is {st.st_size} bytes, larger than the "
                                 f"{limit} bytes read from an image file")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def scoped_path(root: str, path: str) -> str:
    """`path` interpreted inside `root` with every symlink resolved within `root`.

    The result always lies under `root` (components that do not exist are kept as-is).
    """
    root = os.path.abspath(root)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or does not exist
            resolved.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise InvalidArgument(f"too many levels of symbolic links resolving {path!r} "
                                  "in the image rootfs")
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return os.path.join(root, *resolved)


def _read_db(root: str, name: str) -> list[list[str]]:
    data = read_image_file(root, name)
    if data is None:
        return []
    text = data.decode("utf-8", errors="replace")
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        rows.append(line.split(":"))
    return rows


@dataclass
class PasswdEntry:
    name: str
    uid: int
    gid: int
    home: str


@dataclass
class GroupEntry:
    name: str
    gid: int
    members: list[str]


def _number(text: str) -> int | None:
    return int(text) if _NUMBER.fullmatch(text) else None


def image_id(where: str, value: int) -> int:
    """`value`, a uid or gid the image gives (`where` names it), if runc takes it;
    FailedPrecondition otherwise: never handed on to be wrapped into 32 bits."""
    if not 0 <= value <= MAX_ID:
        raise FailedPrecondition(f"{where} {value}, which is out of range: uids and gids "
                                 f"must be between 0 and {MAX_ID}; fix the image")
    return value


def read_passwd(root: str) -> list[PasswdEntry]:
    """The entries with a numeric uid and gid, out-of-range ones included: refused when
    used (`resolve_user`), so that a user named in the image is never reported missing."""
    out = []
    for row in _read_db(root, "/etc/passwd"):
        if len(row) < 4:
            continue
        uid, gid = _number(row[2]), _number(row[3])
        if uid is not None and gid is not None:
            out.append(PasswdEntry(row[0], uid, gid, row[5] if len(row) > 5 else ""))
    return out


def read_group(root: str) -> list[GroupEntry]:
    out = []
    for row in _read_db(root, "/etc/group"):
        gid = _number(row[2]) if len(row) >= 3 else None
        if gid is not None:
            members = [m for m in (row[3].split(",") if len(row) > 3 else []) if m]
            out.append(GroupEntry(row[0], gid, members))
    return out


@dataclass
class ResolvedUser:
    uid: int = 0
    gid: int = 0
    additional_gids: list[int] = field(default_factory=list)
    username: str = ""
    home: str = ""


@dataclass
class UserRequest:
    """What the CRI asked for (None/empty = not set)."""

    run_as_user: int | None = None
    run_as_username: str = ""
    run_as_group: int | None = None
    supplemental_groups: list[int] = field(default_factory=list)
    strict_groups: bool = False  # SupplementalGroupsPolicy Strict


def _lookup_user(passwd: list[PasswdEntry], spec: str) -> PasswdEntry | None:
    uid = _number(spec)
    if uid is not None:
        return next((p for p in passwd if p.uid == uid), None)
    return next((p for p in passwd if p.name == spec), None)


def _lookup_group(groups: list[GroupEntry], spec: str) -> int:
    gid = _number(spec)
    if gid is not None:
        return image_id("the image's USER has gid", gid)
    for g in groups:
        if g.name == spec:
            return image_id(f"the image's /etc/group gives group {spec!r} gid", g.gid)
    raise InvalidArgument(f"group {spec!r} not found in the image's /etc/group")


def validate_request(req: UserRequest) -> None:
    """Refuse what no user lookup can make sense of (as containerd and CRI-O do)."""
    if req.run_as_group is not None and req.run_as_user is None and not req.run_as_username:
        raise InvalidArgument(f"run_as_group {req.run_as_group} is set without run_as_user or "
                              "run_as_username; set the user too")


def resolve_user(rootfs: str, image_user: str, req: UserRequest) -> ResolvedUser:
    """uid/gid/additional gids for the container process.

    CRI run_as_user / run_as_username win over the image USER; run_as_group overrides the
    primary group. Supplementary groups: the user's groups from /etc/group (unless Strict),
    then the CRI supplemental groups.
    """
    validate_request(req)
    passwd = read_passwd(rootfs)
    groups = read_group(rootfs)
    if req.run_as_user is not None or req.run_as_username:
        user_part = (str(req.run_as_user) if req.run_as_user is not None
                     else req.run_as_username)
        group_part = ""
    else:
        user_part, _, group_part = (image_user or "").partition(":")
        uid = _number(user_part)
        if uid is not None:
            # Before any lookup: a number past the range is never taken for a name.
            image_id("the image's USER has uid", uid)
    out = ResolvedUser()
    # Where an image's gid came from, checked unless the request's run_as_group wins.
    gid_from = ""
    if user_part:
        entry = _lookup_user(passwd, user_part)
        if entry is None:
            uid = _number(user_part)
            if uid is None:
                raise InvalidArgument(f"user {user_part!r} not found in the image's /etc/passwd")
            out.uid = uid
        else:
            where = f"the image's /etc/passwd gives user {entry.name!r}"
            out.uid = image_id(f"{where} uid", entry.uid)
            out.gid, out.username, out.home = entry.gid, entry.name, entry.home
            gid_from = f"{where} gid"
    else:
        root = _lookup_user(passwd, "0")
        if root is not None:
            out.gid, out.username, out.home = root.gid, root.name, root.home
            gid_from = f"the image's /etc/passwd gives user {root.name!r} gid"
    if group_part:
        out.gid, gid_from = _lookup_group(groups, group_part), ""
    if req.run_as_group is not None:
        out.gid, gid_from = req.run_as_group, ""
    if gid_from:
        image_id(gid_from, out.gid)
    # The primary gid comes first, as containerd reports it (the kubelet shows this list).
    gids: list[int] = [out.gid]
    if out.username and not req.strict_groups:
        gids.extend(image_id(f"the image's /etc/group gives group {g.name!r} gid", g.gid)
                    for g in groups if out.username in g.members)
    gids.extend(req.supplemental_groups)
    seen: set[int] = set()
    for gid in gids:
        if gid not in seen:
            seen.add(gid)
            out.additional_gids.append(gid)
    return out
