"""Writable-layer caps: which filesystem the layers are on and why it cannot cap; the
project ids handed out, set, cleared, and swept at start-up (the kernel faked)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crishim.errors import FailedPrecondition
from crishim.host.quota import WritableLayerQuotas, probe
from crishim.host.xfsquota import ProjectQuota

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
    assert probe("/var/lib/crishim/containers/c", mountinfo).refusal() == ""


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


class FakeKernel:
    """The quota calls of one XFS filesystem: directories' projects and projects' limits."""

    def __init__(self, fail: OSError | None = None) -> None:
        self.projects: dict[str, int] = {}
        self.limits: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    def set_project(self, path: str, project_id: int) -> None:
        self.projects[path] = project_id

    def set_limit(self, device: str, project_id: int, hard_bytes: int) -> None:
        assert device == "/dev/loop1"
        self.calls.append(("limit", project_id))
        self.limits[project_id] = hard_bytes

    def get_quota(self, device: str, project_id: int) -> ProjectQuota:
        if self.fail is not None:
            raise self.fail
        return ProjectQuota(project_id, self.limits.get(project_id, 0), 0, 0)

    def next_quota(self, device: str, project_id: int) -> ProjectQuota | None:
        self.calls.append(("next", project_id))
        later = sorted(i for i in self.limits if i >= project_id)
        return ProjectQuota(later[0], self.limits[later[0]], 0, 0) if later else None


def _quotas(mountinfo: str, kernel: FakeKernel, tmp_path: Path,
            ids: range = range(100, 104)) -> WritableLayerQuotas:
    info = Path(mountinfo)
    # The containers dir is on the prjquota XFS of the fixture, wherever tmp_path is.
    info.write_text(MOUNTINFO + f"40 22 7:1 / {tmp_path} rw - xfs /dev/loop1 rw,prjquota\n")
    return WritableLayerQuotas(str(tmp_path / "containers"), mountinfo, kernel, ids)


async def test_a_kernel_that_cannot_set_quotas_refuses_the_cap(mountinfo: str,
                                                               tmp_path: Path) -> None:
    quotas = _quotas(mountinfo, FakeKernel(OSError(38, "Function not implemented")),
                     tmp_path)
    with pytest.raises(FailedPrecondition, match=r"with prjquota, but its quotas cannot be "
                       r"set: .*Function not implemented"):
        await quotas.check(1, "x")
    assert quotas.device == ""
    # XFS answers ENOENT for a project that has no quota record yet: that is a yes.
    quotas = _quotas(mountinfo, FakeKernel(FileNotFoundError(2, "No such file")), tmp_path)
    await quotas.check(1, "x")
    assert quotas.device == "/dev/loop1"


async def test_ids_are_handed_out_in_turn_and_never_twice(mountinfo: str,
                                                          tmp_path: Path) -> None:
    quotas = _quotas(mountinfo, FakeKernel(), tmp_path)
    assert [quotas.allocate() for _ in range(3)] == [100, 101, 102]
    await quotas.free(101)
    # The freed id comes back only after the others (its files may still be deleted).
    assert quotas.allocate() == 103
    assert quotas.allocate() == 101
    with pytest.raises(FailedPrecondition, match="all 4 writable-layer project ids"):
        quotas.allocate()


async def test_apply_sets_the_bundles_project_and_the_limit_and_free_clears_it(
        mountinfo: str, tmp_path: Path) -> None:
    kernel = FakeKernel()
    quotas = _quotas(mountinfo, kernel, tmp_path)
    await quotas.check(64 << 20, "x")
    assert quotas.device == "/dev/loop1"
    bundle = str(tmp_path / "containers" / "c1")
    pid = quotas.allocate()
    await quotas.apply(bundle, pid, 64 << 20)
    assert os.stat(bundle).st_mode & 0o7777 == 0o700
    assert kernel.projects == {bundle: pid} and kernel.limits == {pid: 64 << 20}
    await quotas.free(pid)
    assert kernel.limits == {pid: 0}
    await quotas.free(0)  # no cap: nothing to do
    assert kernel.calls == [("limit", pid), ("limit", pid)]


async def test_start_up_clears_the_quotas_no_record_owns(mountinfo: str,
                                                         tmp_path: Path) -> None:
    kernel = FakeKernel()
    # 101: a record's; 102: set before a crash, never recorded; 103: already cleared;
    # 7 and 200: outside the range (someone else's).
    kernel.limits = {7: 1, 101: 10, 102: 20, 103: 0, 200: 5}
    quotas = _quotas(mountinfo, kernel, tmp_path)
    assert await quotas.sweep([101]) == [102]
    assert kernel.limits == {7: 1, 101: 10, 102: 0, 103: 0, 200: 5}
    assert ("next", 100) in kernel.calls and ("next", 200) not in kernel.calls
    # The recorded id stays held; the next one handed out follows it.
    assert quotas.allocate() == 102


async def test_no_sweep_where_the_filesystem_cannot_cap(mountinfo: str) -> None:
    kernel = FakeKernel()
    quotas = WritableLayerQuotas("/srv/crishim/containers", mountinfo, kernel)
    assert await quotas.sweep([]) == []
    assert kernel.calls == []
