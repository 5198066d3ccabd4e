"""Resource updates: validation, merge over stored values, OCI mapping, pod cgroup writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.lists import batches
from crishim.cri.resources import merge, oci_resources, validate
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.stats import cgroupwrite
from crishim.stats.cgroups import CgroupV1Reader, CgroupV2Reader

MiB = 1024 * 1024
R = pb.LinuxContainerResources


@pytest.mark.parametrize(("res", "field"), [
    (R(cpu_period=10), "cpu_period"),
    (R(cpu_quota=5), "cpu_quota"),
    (R(cpu_shares=1), "cpu_shares"),
    (R(memory_limit_in_bytes=-1), "memory_limit_in_bytes"),
    (R(memory_limit_in_bytes=4096), "memory_limit_in_bytes"),
    (R(memory_limit_in_bytes=64 * MiB, memory_swap_limit_in_bytes=32 * MiB),
     "memory_swap_limit_in_bytes"),
    (R(cpuset_cpus="0-a"), "cpuset_cpus"),
    (R(hugepage_limits=[pb.HugepageLimit(page_size="2M", limit=1)]), "page_size"),
    (R(unified={"memory.high": "1"}), "unified"),
])
def test_validate_names_the_bad_field(res: pb.LinuxContainerResources, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        validate(res, cgroup_v2=False)


def test_validate_accepts_kubelet_values() -> None:
    validate(R(cpu_period=100000, cpu_quota=-1, cpu_shares=2, memory_limit_in_bytes=64 * MiB,
               cpuset_cpus="0-1,3", oom_score_adj=-997), cgroup_v2=False)
    validate(R(unified={"memory.high": "100000000"}), cgroup_v2=True)


def test_merge_keeps_unset_fields_and_oci_mapping() -> None:
    old = R(cpu_shares=512, cpu_period=100000, cpu_quota=100000,
            memory_limit_in_bytes=256 * MiB, oom_score_adj=5)
    new = merge(old, R(cpu_quota=50000, memory_limit_in_bytes=64 * MiB))
    assert (new.cpu_shares, new.cpu_period, new.cpu_quota) == (512, 100000, 50000)
    assert new.memory_limit_in_bytes == 64 * MiB and new.oom_score_adj == 5
    oci = oci_resources(new, swap_accounting=True)
    assert oci == {"cpu": {"shares": 512, "quota": 50000, "period": 100000},
                   "memory": {"limit": 64 * MiB, "swap": 64 * MiB}}
    assert "swap" not in oci_resources(new, swap_accounting=False)["memory"]


def test_batches_bound_items_and_bytes() -> None:
    items = [pb.Container(id=str(i) * 100) for i in range(10)]
    assert [len(b) for b in batches(items, max_items=4)] == [4, 4, 2]
    one = items[0].ByteSize()
    assert [len(b) for b in batches(items, max_items=100, max_bytes=3 * one)] == [3, 3, 3, 1]
    assert list(batches([])) == []


def test_pod_cgroup_writes_v1(tmp_path: Path) -> None:
    mounts = {c: str(tmp_path / c) for c in ("cpu", "cpuacct", "cpuset", "memory", "pids")}
    for c in ("cpu", "memory"):
        d = tmp_path / c / "kubepods" / "pod1"
        d.mkdir(parents=True)
    for name in ("cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us"):
        (tmp_path / "cpu" / "kubepods" / "pod1" / name).write_text("0")
    (tmp_path / "memory" / "kubepods" / "pod1" / "memory.limit_in_bytes").write_text("0")
    reader = CgroupV1Reader(mounts)
    written = asyncio.run(cgroupwrite.apply_pod_resources(
        reader, "/kubepods/pod1", R(cpu_shares=1024, cpu_quota=50000, cpu_period=100000,
                                    memory_limit_in_bytes=128 * MiB, cpuset_cpus="0")))
    # cpuset is not mounted for this cgroup: skipped, not an error
    assert sorted(written) == ["cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares",
                               "memory.limit_in_bytes"]
    mem = tmp_path / "memory" / "kubepods" / "pod1" / "memory.limit_in_bytes"
    assert mem.read_text() == str(128 * MiB)
    with pytest.raises(FailedPrecondition):
        asyncio.run(cgroupwrite.apply_pod_resources(reader, "/kubepods/gone", R()))


def test_pod_cgroup_plan_v2(tmp_path: Path) -> None:
    reader = CgroupV2Reader(str(tmp_path))
    plan = cgroupwrite.plan(reader, "/kubepods/pod1",
                            R(cpu_shares=1024, cpu_quota=-1, cpu_period=100000,
                              memory_limit_in_bytes=128 * MiB))
    got = {Path(f).name: v for f, v in plan}
    assert got == {"cpu.weight": str(cgroupwrite.shares_to_weight(1024)),
                   "cpu.max": "max 100000", "memory.max": str(128 * MiB)}
    assert cgroupwrite.shares_to_weight(2) == 1 and cgroupwrite.shares_to_weight(262144) == 10000
