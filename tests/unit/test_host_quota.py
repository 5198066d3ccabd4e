"""The writable-layer cap probe: which filesystem the layers are on, and why it cannot cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from crishim.errors import FailedPrecondition
from crishim.host.quota import WritableLayerQuotas, probe

MOUNTINFO = """\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,errors=remount-ro
30 22 7:0 / /var/lib/crishim rw,relatime shared:2 - xfs /dev/loop0 rw,attr2,inode64,noquota
31 30 7:1 / /var/lib/crishim/containers rw,relatime shared:3 - xfs /dev/loop1 rw,attr2,prjquota
32 22 7:2 / /mnt/my\\040disk rw,relatime shared:4 - xfs /dev/loop2 rw,attr2,pqnoenforce
33 22 0:40 / /mnt/t rw shared:5 - tmpfs tmpfs rw,size=1024k
34 22 7:3 / /mnt/t rw shared:6 - xfs /dev/loop3 rw,prjquota
"""


@pytest.fixture()
def mountinfo(tmp_path: Path) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return str(path)


def test_the_deepest_mount_above_the_path_is_the_one(mountinfo: str) -> None:
    p = probe("/var/lib/crishim/containers", mountinfo)
    assert (p.mountpoint, p.fs_type) == ("/var/lib/crishim/containers", "xfs")
    assert "prjquota" in p.options
    p = probe("/var/lib/crishim/sandboxes/x", mountinfo)
    assert (p.mountpoint, p.fs_type) == ("/var/lib/crishim", "xfs")
    assert probe("/var/lib/crishimx", mountinfo).mountpoint == "/"  # a prefix, not a parent
    assert probe("/mnt/my disk/c", mountinfo).mountpoint == "/mnt/my disk"  # \040 = space
    # Two mounts on one point: the later one hides the earlier.
    assert probe("/mnt/t/c", mountinfo).fs_type == "xfs"


def test_each_refusal_says_what_is_missing(mountinfo: str) -> None:
    ext4 = probe("/srv/crishim/containers", mountinfo).refusal()
    assert ext4 == ("/srv/crishim/containers is on ext4 (mounted at /); a writable-layer "
                    "cap needs XFS mounted with prjquota")
    no_quota = probe("/var/lib/crishim/x", mountinfo).refusal()
    assert "xfs" in no_quota and "without project quotas; remount it with -o prjquota" \
        in no_quota
    # Accounting without enforcement is not a cap.
    assert "without project quotas" in probe("/mnt/my disk/c", mountinfo).refusal()
    ready = probe("/var/lib/crishim/containers/c", mountinfo).refusal()
    assert "with prjquota, but this crishim does not set project quotas yet" in ready


async def test_a_cap_is_refused_naming_the_filesystem(mountinfo: str) -> None:
    quotas = WritableLayerQuotas("/srv/crishim/containers", mountinfo)
    with pytest.raises(FailedPrecondition) as err:
        await quotas.check(64 * 2**20, "pod annotation io.crishim.container-rootfs-size")
    assert str(err.value) == (
        "pod annotation io.crishim.container-rootfs-size asks for a writable-layer cap of "
        "67108864 bytes, which this node cannot enforce: /srv/crishim/containers is on ext4 "
        "(mounted at /); a writable-layer cap needs XFS mounted with prjquota "
        "(docs/storage.md)")


async def test_the_filesystem_is_probed_once_and_only_when_asked(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    quotas = WritableLayerQuotas("/c", str(info))  # nothing read yet: the file is missing
    with pytest.raises(FailedPrecondition, match="could not be probed"):
        await quotas.check(1, "x")
    info.write_text(MOUNTINFO)  # a failed probe is tried again
    with pytest.raises(FailedPrecondition, match="is on ext4"):
        await quotas.check(1, "x")
    info.write_text(MOUNTINFO.replace("ext4", "btrfs"))
    with pytest.raises(FailedPrecondition, match="is on ext4"):  # the first answer stays
        await quotas.check(1, "x")
