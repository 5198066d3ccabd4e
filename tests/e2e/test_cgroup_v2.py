"""cgroup v2 end to end: what reaches a container's own cgroup (a crishim-<id>.scope under
the systemd driver) from the CRI fields and `unified` keys, live updates, v2 stats with
pressure (PSI), and the slices crishim makes for pods' parents.

Real daemon, runc, CNI bridge (the stats module's environment). cgroup v1 hosts skip the
module: these files exist only in the unified hierarchy (the v2 layer, `hack/test.sh v2`,
runs it in a guest with systemd and cgroup v2).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cgroupstats import (
    CGROUP_V1,
    SLICE_ROOT,
    Env,
    MiB,
    container,
    container_cgroup,
    pod,
    stats,
    stats_daemon,
)

pytestmark = pytest.mark.skipif(
    CGROUP_V1, reason="cgroup v2 only: reads unified files (memory.high, memory.swap.max, "
    "io.*, hugetlb.*, *.pressure); cgroup v1 has none of them")


@pytest.fixture(scope="module")
def env(busybox_ref: str) -> Iterator[Env]:
    with stats_daemon(busybox_ref) as e:
        yield e


def read(d: str, name: str) -> str:
    with open(os.path.join(d, name)) as fh:
        return fh.read().strip()


def root_disk() -> str:
    """major:minor of the disk under / (io.max and io.weight take disks, not partitions)."""
    st = os.stat("/")
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysdir = os.path.realpath(f"/sys/dev/block/{dev}")
    if os.path.exists(os.path.join(sysdir, "partition")):
        dev = read(os.path.dirname(sysdir), "dev")
    return dev


def status_resources(env: Env, cid: str) -> pb.LinuxContainerResources:
    resp: pb.ContainerStatusResponse = env.rt().ContainerStatus(
        pb.ContainerStatusRequest(container_id=cid), timeout=10)
    return resp.status.resources.linux


def test_unified_keys_swap_and_io_reach_the_cgroup_and_update_live(env: Env) -> None:
    """memory.high and io limits come only as `unified` keys (CRI has no field for them),
    swap as memory_swap_limit_in_bytes (memory+swap: runc writes the swap part to
    memory.swap.max); an update changes them in the running container's cgroup."""
    disk = root_disk()
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "unified", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            memory_limit_in_bytes=128 * MiB,
                            memory_swap_limit_in_bytes=192 * MiB,
                            cpu_period=100000, cpu_quota=50000,
                            unified={"memory.high": str(96 * MiB),
                                     "io.weight": "default 300",
                                     "io.max": f"{disk} rbps=1048576 wiops=120"})))
        d = container_cgroup(env, cid, "memory")
        assert read(d, "memory.max") == str(128 * MiB)
        assert read(d, "memory.high") == str(96 * MiB)
        assert read(d, "memory.swap.max") == str(64 * MiB)
        assert read(d, "io.weight").splitlines()[0] == "default 300"
        assert f"{disk} rbps=1048576 wbps=max riops=max wiops=120" in read(d, "io.max")
        assert status_resources(env, cid).unified["memory.high"] == str(96 * MiB)

        env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=160 * MiB, memory_swap_limit_in_bytes=160 * MiB,
                cpu_period=100000, cpu_quota=20000,
                unified={"memory.high": str(112 * MiB), "io.weight": "default 50"})),
            timeout=30)
        assert read(d, "memory.max") == str(160 * MiB)
        assert read(d, "memory.swap.max") == "0"  # memory+swap = memory: no swap
        assert read(d, "memory.high") == str(112 * MiB)
        assert read(d, "cpu.max").split() == ["20000", "100000"]
        assert read(d, "io.weight").splitlines()[0] == "default 50"
        res = status_resources(env, cid)
        assert (res.memory_limit_in_bytes, res.cpu_quota) == (160 * MiB, 20000)
        assert res.unified["memory.high"] == str(112 * MiB)
        assert res.unified["io.max"].startswith(disk)  # not in the update: kept


def hugepage_sizes() -> list[str]:
    """CRI page sizes ("2MB", "1GB") of the kernel's hugepage pools."""
    out = []
    for name in sorted(os.listdir("/sys/kernel/mm/hugepages")):
        kb = int(name.removeprefix("hugepages-").removesuffix("kB"))
        out.append(f"{kb // 1024}MB" if kb < 1024 * 1024 else f"{kb // (1024 * 1024)}GB")
    return out


def test_hugepage_limits_reach_hugetlb_max(env: Env) -> None:
    """The kubelet sends a limit for every page size the node has (0 without a request);
    systemd does not manage hugetlb, so the container's scope has it only because runc
    enables it down the tree."""
    with open("/sys/fs/cgroup/cgroup.controllers") as fh:
        if "hugetlb" not in fh.read().split():
            pytest.skip("the kernel has no hugetlb cgroup controller")
    sizes = hugepage_sizes()
    assert "2MB" in sizes, sizes
    limits = [pb.HugepageLimit(page_size=s, limit=(4 * MiB if s == "2MB" else 0))
              for s in sizes]
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "huge", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            hugepage_limits=limits)))
        d = container_cgroup(env, cid, "memory")
        assert read(d, "hugetlb.2MB.max") == str(4 * MiB)
        for s in sizes:
            if s != "2MB":
                assert read(d, f"hugetlb.{s}.max") == "0"
        assert {h.page_size: h.limit for h in status_resources(env, cid).hugepage_limits} \
            == {h.page_size: h.limit for h in limits}


def memory_working_set(d: str) -> int:
    """The kubelet's working set of a v2 cgroup: memory.current - inactive_file."""
    current = int(read(d, "memory.current"))
    inactive = next(int(line.split()[1]) for line in read(d, "memory.stat").splitlines()
                    if line.startswith("inactive_file "))
    return max(current - inactive, 0)


def cpu_some_total(d: str) -> int:
    """The "some" line's total (µs) of a v2 cgroup's cpu.pressure."""
    return int(read(d, "cpu.pressure").splitlines()[0].rsplit("total=", 1)[1])


def test_stats_carry_pressure_and_the_v2_working_set(env: Env) -> None:
    """Two busy loops on one CPU stall each other: cpu.pressure grows, and ContainerStats,
    ListContainerStats and PodSandboxStats carry it (cri-api's PsiStats) with memory and
    io pressure; the working set is memory.current less inactive_file."""
    if not os.path.exists("/proc/pressure/cpu"):
        pytest.skip("the kernel accounts no pressure (PSI off: boot with psi=1)")
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "contend", [
            "sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=24 && "
            "(while :; do :; done) & while :; do :; done"],
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                cpuset_cpus="0")))
        d = container_cgroup(env, cid, "memory")
        deadline = time.monotonic() + 30
        while True:
            s = stats(env, cid)
            if (s.cpu.psi.Some.Total > 0 and s.memory.working_set_bytes.value >= 24 * MiB) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert s.cpu.psi.Some.Total > 0, s.cpu
        assert s.HasField("memory") and s.memory.HasField("psi")
        assert s.io.HasField("psi")
        # The counters only grow: the file read after the stats is at least as far.
        assert 0 < s.cpu.psi.Some.Total <= cpu_some_total(d)
        before = memory_working_set(d)
        ws = stats(env, cid).memory.working_set_bytes.value
        after = memory_working_set(d)
        assert min(before, after) - MiB <= ws <= max(before, after) + MiB, (before, ws, after)

        listed = env.rt().ListContainerStats(pb.ListContainerStatsRequest(
            filter=pb.ContainerStatsFilter(id=cid)), timeout=10).stats
        assert [x.attributes.id for x in listed] == [cid]
        assert listed[0].cpu.psi.Some.Total >= s.cpu.psi.Some.Total
        assert listed[0].io.HasField("psi") and listed[0].memory.HasField("psi")

        pod_stats = env.rt().PodSandboxStats(pb.PodSandboxStatsRequest(
            pod_sandbox_id=pod_id), timeout=10).stats.linux
        # The pod's numbers are its own slice's, not the container's. They need not be at
        # least the container's: the kernel weighs each CPU by its busy time, and the slice
        # is busy on a CPU where the pinned container never waits.
        pod_dir = os.path.dirname(d)
        assert pod_dir.endswith(pod_cfg.linux.cgroup_parent.rsplit("/", 1)[-1]), d
        assert 0 < pod_stats.cpu.psi.Some.Total <= cpu_some_total(pod_dir)
        assert pod_stats.memory.HasField("psi") and pod_stats.io.HasField("psi")
        assert pod_stats.memory.working_set_bytes.value >= 24 * MiB


def slice_active(name: str) -> bool:
    return subprocess.run(["systemctl", "is-active", name], capture_output=True,
                          text=True).stdout.strip() == "active"


def test_pods_sharing_a_slice_crishim_made(env: Env) -> None:
    """Two pods name one slice no kubelet made: it stays while either pod is there (stopping
    it would stop the other pod's scopes), and goes with the last one, in either order."""
    if env.driver != "systemd":
        pytest.skip("the daemon runs the cgroupfs driver (no systemd as PID 1)")
    shared = f"{SLICE_ROOT}-shared.slice"
    rt = env.rt()

    def run(name: str) -> str:
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="e2e", uid=f"uid-{name}"),
            hostname=name, log_directory=os.path.join(env.tmpdir, "logs", name),
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/{SLICE_ROOT}.slice/{shared}"))
        return str(rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                    timeout=60).pod_sandbox_id)

    def remove(sid: str) -> None:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)

    for first_out in (0, 1):
        assert not slice_active(shared)
        sids = [run(f"share{first_out}a"), run(f"share{first_out}b")]
        stays = sids[1 - first_out]
        remove(sids[first_out])
        assert slice_active(shared), "the slice went while a pod still ran in it"
        st = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=stays),
                                 timeout=10).status
        assert st.state == pb.SANDBOX_READY
        assert os.path.isdir(f"/sys/fs/cgroup/{SLICE_ROOT}.slice/{shared}/crishim-{stays}.scope")
        remove(stays)
        assert not slice_active(shared) and not slice_active(f"{SLICE_ROOT}.slice")
        assert not os.path.exists(f"/sys/fs/cgroup/{SLICE_ROOT}.slice")


def test_crun_runs_pods_with_limits_stats_and_oom(env: Env) -> None:
    """crun refuses to run on a cgroup v1 hybrid host; on v2 (under systemd: through
    --systemd-cgroup) the crun handler gives the same cgroups, stats and OOMKilled."""
    rt = env.rt()
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="crun", namespace="e2e", uid="uid-crun"),
        hostname="crun", log_directory=os.path.join(env.tmpdir, "logs", "crun"),
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=(
            f"/{SLICE_ROOT}.slice/{SLICE_ROOT}-crun.slice" if env.driver == "systemd"
            else "/crishim-e2e-crun")))
    pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg, runtime_handler="crun"),
                              timeout=60).pod_sandbox_id
    try:
        cid = container(env, pod_id, cfg, "limited", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            memory_limit_in_bytes=64 * MiB, cpu_period=100000,
                            cpu_quota=30000, unified={"memory.high": str(48 * MiB)})))
        d = container_cgroup(env, cid, "memory")
        if env.driver == "systemd":
            # The scope itself, as with runc (not crun's default "container" below it).
            assert os.path.basename(d) == f"crishim-{cid}.scope", d
        assert read(d, "memory.max") == str(64 * MiB)
        assert read(d, "memory.high") == str(48 * MiB)
        assert read(d, "cpu.max").split() == ["30000", "100000"]
        rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=96 * MiB)), timeout=30)
        assert read(d, "memory.max") == str(96 * MiB)
        s = stats(env, cid)
        assert s.memory.working_set_bytes.value > 0 and s.cpu.HasField("usage_core_nano_seconds")
        assert s.memory.available_bytes.value > 0  # the limit is where stats read it

        limit = 24 * MiB
        hog = container(env, pod_id, cfg, "hog", [
            "sh", "-c", 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}'],
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                memory_limit_in_bytes=limit, memory_swap_limit_in_bytes=limit)))
        deadline = time.monotonic() + 60
        while True:
            st = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=hog),
                                    timeout=10).status
            if st.state == pb.CONTAINER_EXITED or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (st.state, st.reason) == (pb.CONTAINER_EXITED, "OOMKilled"), st
    finally:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    assert not os.path.exists(d), f"{d} outlived the pod"
    if env.driver == "systemd":
        assert not slice_active(f"{SLICE_ROOT}-crun.slice")
