"""The XFS quota structs as the kernel lays them out (linux/fs.h struct fsxattr,
linux/dqblk_xfs.h struct fs_disk_quota) and the request numbers."""

from __future__ import annotations

import struct

from crishim.host import xfsquota


def test_the_ioctl_and_quotactl_numbers() -> None:
    assert xfsquota.FS_IOC_FSGETXATTR == 0x801C581F
    assert xfsquota.FS_IOC_FSSETXATTR == 0x401C5820
    assert xfsquota.qcmd(xfsquota.Q_XSETQLIM, xfsquota.PRJQUOTA) == 0x580402
    assert xfsquota.qcmd(xfsquota.Q_XGETQUOTA, xfsquota.PRJQUOTA) == 0x580302
    assert xfsquota.qcmd(xfsquota.Q_XGETNEXTQUOTA, xfsquota.PRJQUOTA) == 0x580902


def test_fsxattr_keeps_the_other_fields_when_the_project_is_set() -> None:
    got = struct.pack("=IIIII8s", 0x1, 4096, 7, 0, 16, b"\0" * 8)
    out = xfsquota.pack_fsxattr(0x1 | xfsquota.FS_XFLAG_PROJINHERIT, 3_000_000_001, got)
    assert len(out) == 28
    assert struct.unpack("=IIIII8s", out) == (0x201, 4096, 7, 3_000_000_001, 16, b"\0" * 8)
    assert xfsquota.unpack_fsxattr(out) == (0x201, 3_000_000_001)


def test_a_limit_request_sets_both_block_limits_in_basic_blocks() -> None:
    buf = xfsquota.pack_limit(3_000_000_000, 64 * 2**20 + 1)
    assert len(buf) == 112
    assert buf[0] == 1 and buf[1] == 2  # FS_DQUOT_VERSION, FS_PROJ_QUOTA
    mask, pid, hard, soft = struct.unpack_from("=HIQQ", buf, 2)
    assert mask == (1 << 2) | (1 << 3)  # FS_DQ_BSOFT | FS_DQ_BHARD
    assert (pid, hard, soft) == (3_000_000_000, 131073, 131073)  # rounded up
    assert struct.unpack_from("=QQ", buf, 24) == (0, 0)  # inode limits untouched
    cleared = xfsquota.pack_limit(5, 0)
    assert struct.unpack_from("=QQ", cleared, 8) == (0, 0)


def test_usage_is_read_from_the_block_and_inode_counts() -> None:
    buf = bytearray(112)
    struct.pack_into("=bbHIQQQQQQ", buf, 0, 1, 2, 0, 42, 2048, 2048, 0, 0, 1000, 9)
    q = xfsquota.unpack_quota(bytes(buf))
    assert q == xfsquota.ProjectQuota(project_id=42, hard_bytes=2048 * 512,
                                      used_bytes=1000 * 512, inodes_used=9)
