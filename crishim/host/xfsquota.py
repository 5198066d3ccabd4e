"""XFS project quotas, the kernel's interface: a directory's project id and inherit flag
(FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR on `struct fsxattr`) and a project's block limit
and usage (quotactl(2) Q_XSETQLIM / Q_XGETQUOTA / Q_XGETNEXTQUOTA on
`struct fs_disk_quota`, linux/dqblk_xfs.h). The structs are packed here, apart from the
calls, so that their layout is testable without the kernel. Every call blocks: run them in
a worker thread.
"""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import dataclass

from crishim.host import libc

# struct fsxattr: xflags, extsize, nextents, projid, cowextsize (u32 each), pad[8].
_FSXATTR = struct.Struct("=IIIII8s")
FS_IOC_FSGETXATTR = (2 << 30) | (_FSXATTR.size << 16) | (ord("X") << 8) | 31
FS_IOC_FSSETXATTR = (1 << 30) | (_FSXATTR.size << 16) | (ord("X") << 8) | 32
FS_XFLAG_PROJINHERIT = 0x200

# struct fs_disk_quota (112 bytes): version, flags, fieldmask, id, the block and inode
# limits and counts, timers, warnings, realtime fields, padding.
_DISK_QUOTA = struct.Struct("=bbHIQQQQQQiiHHbbbbQQQiHh8s")
FS_DQUOT_VERSION = 1
FS_PROJ_QUOTA = 2
FS_DQ_BSOFT, FS_DQ_BHARD = 1 << 2, 1 << 3
BASIC_BLOCK = 512  # the unit of fs_disk_quota's block fields

PRJQUOTA = 2
_XQM = ord("X") << 8
Q_XGETQUOTA, Q_XSETQLIM, Q_XGETNEXTQUOTA = _XQM + 3, _XQM + 4, _XQM + 9


def qcmd(cmd: int, qtype: int) -> int:
    """QCMD(cmd, type) of linux/quota.h."""
    return (cmd << 8) | (qtype & 0xFF)


@dataclass(frozen=True)
class ProjectQuota:
    project_id: int
    hard_bytes: int  # 0 = no limit
    used_bytes: int
    inodes_used: int


def pack_fsxattr(xflags: int, projid: int, rest: bytes = b"") -> bytes:
    """A `struct fsxattr` with `xflags` and `projid`; the other fields as in `rest` (what
    FS_IOC_FSGETXATTR returned), so that setting the project keeps them."""
    _, extsize, nextents, _, cow, pad = _FSXATTR.unpack(rest or bytes(_FSXATTR.size))
    return _FSXATTR.pack(xflags, extsize, nextents, projid, cow, pad)


def unpack_fsxattr(buf: bytes) -> tuple[int, int]:
    """(xflags, projid) of a `struct fsxattr`."""
    xflags, _, _, projid, _, _ = _FSXATTR.unpack(buf[:_FSXATTR.size])
    return xflags, projid


def pack_limit(project_id: int, hard_bytes: int) -> bytes:
    """A Q_XSETQLIM request: hard and soft block limits of `project_id` set to
    `hard_bytes` (rounded up to basic blocks; 0 clears them)."""
    blocks = -(-hard_bytes // BASIC_BLOCK)
    return _DISK_QUOTA.pack(FS_DQUOT_VERSION, FS_PROJ_QUOTA, FS_DQ_BSOFT | FS_DQ_BHARD,
                            project_id, blocks, blocks, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                            0, 0, 0, 0, 0, 0, 0, b"")


def unpack_quota(buf: bytes) -> ProjectQuota:
    """The id, hard limit and usage of a `struct fs_disk_quota` the kernel filled."""
    f = _DISK_QUOTA.unpack(buf[:_DISK_QUOTA.size])
    return ProjectQuota(project_id=f[3], hard_bytes=f[4] * BASIC_BLOCK,
                        used_bytes=f[8] * BASIC_BLOCK, inodes_used=f[9])


def set_project(path: str, project_id: int) -> None:
    """Give directory `path` the project `project_id`, inherited by everything made in it
    afterwards (FS_XFLAG_PROJINHERIT)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        got = bytearray(_FSXATTR.size)
        fcntl.ioctl(fd, FS_IOC_FSGETXATTR, got)
        xflags, _ = unpack_fsxattr(bytes(got))
        fcntl.ioctl(fd, FS_IOC_FSSETXATTR,
                    pack_fsxattr(xflags | FS_XFLAG_PROJINHERIT, project_id, bytes(got)))
    finally:
        os.close(fd)


def get_project(path: str) -> tuple[int, int]:
    """(xflags, projid) of `path`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        got = bytearray(_FSXATTR.size)
        fcntl.ioctl(fd, FS_IOC_FSGETXATTR, got)
        return unpack_fsxattr(bytes(got))
    finally:
        os.close(fd)


def set_limit(device: str, project_id: int, hard_bytes: int) -> None:
    """The hard block limit of `project_id` on the filesystem of block device `device`
    (0: none, which frees the project)."""
    libc.quotactl(qcmd(Q_XSETQLIM, PRJQUOTA), device, project_id,
                  bytearray(pack_limit(project_id, hard_bytes)),
                  f"setting the quota of project {project_id} on {device}")


def get_quota(device: str, project_id: int) -> ProjectQuota:
    buf = bytearray(_DISK_QUOTA.size)
    libc.quotactl(qcmd(Q_XGETQUOTA, PRJQUOTA), device, project_id, buf,
                  f"reading the quota of project {project_id} on {device}")
    return unpack_quota(bytes(buf))


def next_quota(device: str, project_id: int) -> ProjectQuota | None:
    """The first project at or after `project_id` that has a quota record; None past the
    last one."""
    buf = bytearray(_DISK_QUOTA.size)
    try:
        libc.quotactl(qcmd(Q_XGETNEXTQUOTA, PRJQUOTA), device, project_id, buf,
                      f"listing project quotas on {device}")
    except OSError as exc:
        if exc.errno == 2:  # ENOENT: no more
            return None
        raise
    return unpack_quota(bytes(buf))
