"""CRI → OCI resources: validation, merge, and what a host without a controller gets.

The requests below are the ones stock kubelets send (captured from kubelet v1.32 on a
cgroup v1 host, and built as pkg/kubelet/kuberuntime 1.36 builds them for v2 pod resizes).
"""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.cgroups import SWAP, CgroupFacts
from crishim.oci.resources import FAIL, ResourceMapper, merge
from crishim.validate.resources import check as validate

MiB = 1024 * 1024
R = pb.LinuxContainerResources
H = pb.HugepageLimit
# cgroup v1's memory.limit_in_bytes when unlimited: what a v1 kubelet reads back.
V1_UNLIMITED = 9223372036854771712

# CreateContainer from kubelet v1.32: BestEffort and Burstable (200m, 64Mi) containers.
KUBELET_BESTEFFORT = R(cpu_period=100000, cpu_shares=2, oom_score_adj=999,
                       hugepage_limits=[H(page_size="2MB"), H(page_size="1GB")])
KUBELET_BURSTABLE = R(cpu_period=100000, cpu_quota=20000, cpu_shares=204,
                      memory_limit_in_bytes=64 * MiB, memory_swap_limit_in_bytes=64 * MiB,
                      oom_score_adj=998,
                      hugepage_limits=[H(page_size="2MB"), H(page_size="1GB")])
# UpdatePodSandboxResources from kubelet 1.36 for a Burstable pod without a memory limit:
# its pod cgroup says memory.max = max and cpu.max = max → -1.
KUBELET_POD_RESIZE_V2 = R(cpu_period=100000, cpu_quota=-1, cpu_shares=102,
                          memory_limit_in_bytes=-1)
KUBELET_POD_RESIZE_V1 = R(cpu_period=100000, cpu_quota=-1, cpu_shares=102,
                          memory_limit_in_bytes=V1_UNLIMITED)


def _host(*missing: str, version: int = 1) -> CgroupFacts:
    full = CgroupFacts.everything(version)
    return CgroupFacts(version, full.controllers - set(missing))


@pytest.mark.parametrize(("res", "field"), [
    (R(cpu_period=10), "cpu_period"),
    (R(cpu_quota=5), "cpu_quota"),
    (R(cpu_shares=1), "cpu_shares"),
    (R(memory_limit_in_bytes=-2), "memory_limit_in_bytes"),
    (R(memory_limit_in_bytes=4096), "memory_limit_in_bytes"),
    (R(memory_limit_in_bytes=64 * MiB, memory_swap_limit_in_bytes=32 * MiB),
     "memory_swap_limit_in_bytes"),
    (R(memory_swap_limit_in_bytes=-5), "memory_swap_limit_in_bytes"),
    (R(cpuset_cpus="0-a"), "cpuset_cpus"),
    (R(hugepage_limits=[H(page_size="2M", limit=1)]), "page_size"),
    (R(unified={"memory.high": "1"}), "unified"),
    (R(oom_score_adj=1001), "oom_score_adj"),
])
def test_validate_names_the_bad_field(res: pb.LinuxContainerResources, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        validate(res, cgroup_v2=False)


def test_validate_rejects_unified_paths_on_v2() -> None:
    with pytest.raises(InvalidArgument, match="not a cgroup file name"):
        validate(R(unified={"../memory.max": "1"}), cgroup_v2=True)


@pytest.mark.parametrize("res", [KUBELET_BESTEFFORT, KUBELET_BURSTABLE, KUBELET_POD_RESIZE_V1,
                                 R(cpu_period=100000, cpu_quota=-1, cpuset_cpus="0-1,3",
                                   oom_score_adj=-997)])
def test_validate_accepts_kubelet_requests_v1(res: pb.LinuxContainerResources) -> None:
    validate(res, cgroup_v2=False)


def test_validate_accepts_kubelet_requests_v2() -> None:
    validate(KUBELET_POD_RESIZE_V2, cgroup_v2=True)
    validate(R(unified={"memory.high": "100000000", "memory.min": "0"}), cgroup_v2=True)


def test_merge_keeps_unset_fields() -> None:
    old = R(cpu_shares=512, cpu_period=100000, cpu_quota=100000,
            memory_limit_in_bytes=256 * MiB, oom_score_adj=5,
            hugepage_limits=[H(page_size="2MB")])
    new = merge(old, R(cpu_quota=50000, memory_limit_in_bytes=64 * MiB, oom_score_adj=9))
    assert (new.cpu_shares, new.cpu_period, new.cpu_quota) == (512, 100000, 50000)
    assert new.memory_limit_in_bytes == 64 * MiB
    assert new.oom_score_adj == 5  # fixed at start
    assert [h.page_size for h in new.hugepage_limits] == ["2MB"]


def test_full_host_maps_everything() -> None:
    out = ResourceMapper().linux(KUBELET_BURSTABLE)
    assert out == {"cpu": {"shares": 204, "quota": 20000, "period": 100000},
                   "memory": {"limit": 64 * MiB, "swap": 64 * MiB},
                   "hugepageLimits": [{"pageSize": "2MB", "limit": 0},
                                      {"pageSize": "1GB", "limit": 0}]}


def test_missing_hugetlb_is_dropped() -> None:
    """The kubelet sends limit-0 hugepage entries for every page size; runc fails the
    container when no hugetlb hierarchy is mounted."""
    out, dropped = ResourceMapper(_host("hugetlb")).linux_dropping(KUBELET_BESTEFFORT)
    assert "hugepageLimits" not in out and dropped == ["hugetlb"]
    assert out == {"cpu": {"shares": 2, "period": 100000}}


def test_missing_hugetlb_refused_when_asked() -> None:
    with pytest.raises(FailedPrecondition, match=r"hugetlb cgroup controller.*drop"):
        ResourceMapper(_host("hugetlb"), FAIL).linux(KUBELET_BESTEFFORT)
    # Nothing of a missing controller asked for: nothing refused.
    res = R(cpu_shares=2)
    assert ResourceMapper(_host("hugetlb"), FAIL).linux(res) == {"cpu": {"shares": 2}}


def test_missing_cpuset_drops_only_the_cpuset_part() -> None:
    res = R(cpu_shares=1024, cpuset_cpus="0", cpuset_mems="0")
    out, dropped = ResourceMapper(_host("cpuset")).linux_dropping(res)
    assert out == {"cpu": {"shares": 1024}} and dropped == ["cpuset"]


def test_swap_without_accounting() -> None:
    mapper = ResourceMapper(_host(SWAP))
    # "No swap" (= limit) and unset: nothing to enforce, nothing reported.
    out, dropped = mapper.linux_dropping(R(memory_limit_in_bytes=64 * MiB,
                                           memory_swap_limit_in_bytes=64 * MiB))
    assert out == {"memory": {"limit": 64 * MiB}} and dropped == []
    # A real extra-swap request is what a missing swap controller loses.
    out, dropped = mapper.linux_dropping(R(memory_limit_in_bytes=64 * MiB,
                                           memory_swap_limit_in_bytes=128 * MiB))
    assert out == {"memory": {"limit": 64 * MiB}} and dropped == [SWAP]
    with pytest.raises(FailedPrecondition, match="swap"):
        ResourceMapper(_host(SWAP), FAIL).linux(R(memory_limit_in_bytes=64 * MiB,
                                                  memory_swap_limit_in_bytes=128 * MiB))


def test_unified_keys_of_missing_controllers_v2() -> None:
    res = R(unified={"memory.high": "1000000", "io.weight": "100", "pids.max": "10",
                     "rdma.max": "mlx4_0 hca_handle=2", "misc.max": "res_a 1",
                     "memory.swap.max": "0", "hugetlb.2MB.max": "0"})
    mapper = ResourceMapper(_host("io", "pids", "rdma", "misc", SWAP, "hugetlb", version=2))
    out, dropped = mapper.linux_dropping(res)
    assert out == {"unified": {"memory.high": "1000000"}}
    assert dropped == ["hugetlb", "io", "misc", "pids", "rdma", SWAP]
    assert ResourceMapper(CgroupFacts.everything(2)).linux(res)["unified"] == dict(res.unified)


def test_unified_refused_on_v1() -> None:
    with pytest.raises(InvalidArgument, match="cgroup v2"):
        ResourceMapper(_host()).linux(R(unified={"memory.high": "1"}))


def test_unlimited_sentinels_map_to_oci_unlimited() -> None:
    out = ResourceMapper(CgroupFacts.everything(2)).linux(KUBELET_POD_RESIZE_V2)
    assert out == {"cpu": {"shares": 102, "quota": -1, "period": 100000},
                   "memory": {"limit": -1, "swap": -1}}
