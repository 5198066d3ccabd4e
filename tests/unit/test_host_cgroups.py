"""The cgroup controller probe on cgroup v1 (hybrid) and v2 trees."""

from __future__ import annotations

from pathlib import Path

from crishim.host.cgroups import SWAP, CgroupFacts, probe

# This project's own test VM: hugetlb is compiled in (/proc/cgroups) but not mounted.
HYBRID_MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup rw,relatime shared:9 - tmpfs tmpfs rw,mode=755
26 25 0:23 / {root}/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
27 25 0:24 / {root}/cpuacct rw,relatime shared:11 - cgroup cgroup rw,cpuacct
28 25 0:25 / {root}/cpuset rw,relatime shared:12 - cgroup cgroup rw,cpuset
29 25 0:26 / {root}/memory rw,relatime shared:13 - cgroup cgroup rw,memory
30 25 0:27 / {root}/blkio rw,relatime shared:14 - cgroup cgroup rw,blkio
31 25 0:28 / {root}/pids rw,relatime shared:15 - cgroup cgroup rw,pids
32 25 0:29 / {root}/systemd rw,relatime shared:16 - cgroup cgroup rw,name=systemd
33 25 0:30 / {root}/unified rw,relatime shared:17 - cgroup2 cgroup2 rw
"""


def _v1(tmp_path: Path, mountinfo: str, memsw: bool) -> CgroupFacts:
    root = tmp_path / "cg"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    if memsw:
        (root / "memory" / "memory.memsw.limit_in_bytes").write_text("9223372036854771712\n")
    info = tmp_path / "mountinfo"
    info.write_text(mountinfo.format(root=root))
    return probe(str(root), str(info))


def test_v1_hybrid_without_hugetlb(tmp_path: Path) -> None:
    facts = _v1(tmp_path, HYBRID_MOUNTINFO, memsw=True)
    assert facts.version == 1 and not facts.v2
    assert {"cpu", "cpuset", "memory", "blkio", "pids", SWAP} <= facts.controllers
    assert not facts.has("hugetlb")
    # "name=systemd" and cgroup2 mounts are not controllers.
    assert "systemd" not in facts.controllers and "name" not in facts.controllers
    assert facts.missing() == ["hugetlb", "misc", "rdma"]


def test_v1_without_swap_accounting_and_combined_mounts(tmp_path: Path) -> None:
    mountinfo = (HYBRID_MOUNTINFO.replace("rw,cpu\n", "rw,cpu,cpuacct\n")
                 + "40 25 0:31 / {root}/hugetlb rw - cgroup cgroup rw,hugetlb\n")
    facts = _v1(tmp_path, mountinfo, memsw=False)
    assert facts.has("hugetlb") and facts.has("cpu")
    assert not facts.swap
    assert facts.missing() == ["misc", "rdma", "swap"]


def test_v2_controllers_and_swap(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (tmp_path / "init.scope").mkdir()
    (tmp_path / "init.scope" / "memory.swap.max").write_text("max\n")
    facts = probe(str(tmp_path), str(tmp_path / "no-mountinfo"))
    assert facts.v2
    assert facts.controllers == {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma",
                                 "misc", SWAP}
    assert facts.missing() == []


def test_v2_minimal_without_swap(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "system.slice").mkdir()  # no memory.swap.max: swap accounting is off
    facts = probe(str(tmp_path), str(tmp_path / "no-mountinfo"))
    assert facts.missing() == ["cpuset", "hugetlb", "io", "misc", "rdma", "swap"]


def test_everything_is_the_unprobed_default() -> None:
    assert CgroupFacts.everything().missing() == []
    assert CgroupFacts.everything(2).has("io") and not CgroupFacts.everything(2).has("blkio")
