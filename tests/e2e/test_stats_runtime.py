"""Stats, resource updates and streaming lists end to end: real daemon, runc, CNI bridge.

One daemon and pod network for the module; every test makes its own pod in its own
pod-level cgroup (under a test-owned parent) and removes it; the module fixture
force-cleans whatever a failing test left behind, including the cgroup directories.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc
from tests.e2e.cgroupstats import (
    CGROUP_V1,
    Env,
    MiB,
    container,
    container_cgroup,
    pod,
    stats,
    stats_daemon,
)


@pytest.fixture(scope="module")
def env(busybox_ref: str) -> Iterator[Env]:
    with stats_daemon(busybox_ref) as e:
        yield e


# --- tests ---------------------------------------------------------------------------------

def test_busy_loop_uses_about_one_core(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "spin", ["sh", "-c", "while :; do :; done"])
        idle_cid = container(env, pod_id, pod_cfg, "idle", ["sleep", "3600"])
        first = stats(env, cid)
        stats(env, idle_cid)
        assert first.attributes.id == cid and first.attributes.labels["ctr"] == "spin"
        time.sleep(1.5)
        second = stats(env, cid)
        # A sleeping neighbour uses next to nothing: the rate tells the two apart.
        assert stats(env, idle_cid).cpu.usage_nano_cores.value < 0.05e9
        assert second.cpu.usage_core_nano_seconds.value > first.cpu.usage_core_nano_seconds.value
        cores = second.cpu.usage_nano_cores.value / 1e9
        # The rate is the counter delta over the sample interval...
        expect = ((second.cpu.usage_core_nano_seconds.value
                   - first.cpu.usage_core_nano_seconds.value)
                  / (second.cpu.timestamp - first.cpu.timestamp))
        assert abs(cores - expect) <= 0.02 + 0.05 * expect, (cores, expect)
        # ...and one busy thread gets at most one core. How close to 1 it gets depends on
        # what else runs on this 2-core machine, so demand "near" only when it is idle.
        assert cores <= 1.1, cores
        load = os.getloadavg()[0]
        fair_share = min(1.0, (os.cpu_count() or 1) / max(load, 1.0))
        assert cores >= (0.8 if load < 1.5 else 0.5 * fair_share), (cores, load)
        fs_info = env.d.images().ImageFsInfo(pb.ImageFsInfoRequest(), timeout=10)
        assert second.writable_layer.fs_id.mountpoint == \
            fs_info.container_filesystems[0].fs_id.mountpoint
        assert second.writable_layer.inodes_used.value > 0
        listed = env.rt().ListContainerStats(pb.ListContainerStatsRequest(
            filter=pb.ContainerStatsFilter(pod_sandbox_id=pod_id)), timeout=10).stats
        assert sorted(s.attributes.id for s in listed) == sorted([cid, idle_cid])
        by_label = env.rt().ListContainerStats(pb.ListContainerStatsRequest(
            filter=pb.ContainerStatsFilter(label_selector={"ctr": "nope"})), timeout=10).stats
        assert list(by_label) == []

        pod_stats = env.rt().PodSandboxStats(pb.PodSandboxStatsRequest(
            pod_sandbox_id=pod_id), timeout=10).stats
        assert pod_stats.attributes.id == pod_id
        assert pod_stats.linux.cpu.usage_core_nano_seconds.value >= \
            second.cpu.usage_core_nano_seconds.value
        assert pod_stats.linux.process.process_count.value >= 3  # pause + sh + sleep
        assert pod_stats.linux.network.default_interface.name == "eth0"
        assert pod_stats.linux.network.default_interface.rx_bytes.value > 0  # CNI chatter
        assert sorted(c.attributes.id for c in pod_stats.linux.containers) == sorted(
            [cid, idle_cid])


def test_allocating_50mib_shows_in_working_set(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        # tmpfs pages are charged to the writer's cgroup and are never inactive_file.
        cid = container(env, pod_id, pod_cfg, "alloc", [
            "sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=56 && sleep 3600"])
        deadline = time.monotonic() + 30
        while True:
            s = stats(env, cid)
            if s.memory.working_set_bytes.value >= 50 * MiB or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert s.memory.working_set_bytes.value >= 50 * MiB
        assert s.memory.usage_bytes.value >= s.memory.working_set_bytes.value
        assert s.memory.page_faults.value > 0
        metrics = env.rt().ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(),
                                                 timeout=10).pod_metrics
        mine = next(m for m in metrics if m.pod_sandbox_id == pod_id)
        (cm,) = [c for c in mine.container_metrics if c.container_id == cid]
        ws = next(m for m in cm.metrics if m.name == "container_memory_working_set_bytes")
        assert ws.value.value >= 50 * MiB and list(ws.label_values)[:2] == [cid, "alloc"]
        names = {d.name for d in env.rt().ListMetricDescriptors(
            pb.ListMetricDescriptorsRequest(), timeout=10).descriptors}
        assert {m.name for m in mine.metrics} <= names


def test_pod_metrics_cover_what_critest_and_cadvisor_report(env: Env) -> None:
    # Values the kubelet's /metrics/cadvisor shows for a container: threads, fds and sockets
    # of its processes, its start time, the free room on its writable layer's filesystem.
    # (Per-device I/O counters may be empty on virtual disks without blkio accounting.)
    optional = {"container_blkio_device_usage_total", "container_fs_reads_bytes_total",
                "container_fs_reads_total", "container_fs_writes_bytes_total",
                "container_fs_writes_total"}
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "listener",
                        ["sh", "-c", "nc -l -p 8080 & nc -l -p 8081 & sleep 3600"],
                        # as critest sets them (the spec metrics report only what is set)
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            cpu_period=100000, cpu_quota=20000, cpu_shares=1024,
                            memory_limit_in_bytes=64 * MiB,
                            memory_swap_limit_in_bytes=64 * MiB)))
        r = env.rt().ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=[
            "sh", "-c", "mkdir -p /data && for i in 1 2 3; do echo hi > /data/f$i; done"],
            timeout=10), timeout=20)
        assert r.exit_code == 0, r.stderr
        started = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                           timeout=10).status.started_at
        descs = {d.name: d for d in env.rt().ListMetricDescriptors(
            pb.ListMetricDescriptorsRequest(), timeout=10).descriptors}
        deadline = time.monotonic() + 20
        while True:  # the two nc processes may still be starting
            metrics = env.rt().ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(),
                                                     timeout=10).pod_metrics
            mine = next(m for m in metrics if m.pod_sandbox_id == pod_id)
            (cm,) = [c for c in mine.container_metrics if c.container_id == cid]
            values = {m.name: m for m in cm.metrics}
            if values["container_sockets"].value.value >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        seen = {m.name: m for m in [*mine.metrics, *cm.metrics]}
        assert set(descs) - optional <= set(seen), set(descs) - optional - set(seen)
        for m in seen.values():
            assert len(m.label_values) == len(descs[m.name].label_keys), m.name
        assert values["container_sockets"].value.value >= 2
        assert values["container_threads"].value.value >= 3  # sh + 2 nc (+ sleep)
        assert values["container_file_descriptors"].value.value >= \
            values["container_sockets"].value.value + 3
        assert values["container_start_time_seconds"].value.value == started // 10**9
        free = os.statvfs(os.path.join(env.d.root, "containers"))
        assert values["container_fs_limit_bytes"].value.value == free.f_blocks * free.f_frsize
        assert values["container_fs_inodes_free"].value.value > 0
        assert values["container_fs_inodes_total"].value.value >= 4  # /data + 3 files
        assert values["container_oom_events_total"].value.value == 0


def test_resources_updated_before_start_apply_at_start(env: Env) -> None:
    """A created container has no process yet: an update goes into its bundle and is what
    its cgroup gets when StartContainer launches it."""
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "later", ["sleep", "3600"], start=False,
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            memory_limit_in_bytes=256 * MiB)))
        env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=96 * MiB)), timeout=30)
        env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        limit_file = "memory.limit_in_bytes" if CGROUP_V1 else "memory.max"
        with open(os.path.join(container_cgroup(env, cid, "memory"), limit_file)) as fh:
            assert int(fh.read()) == 96 * MiB
        res = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                       timeout=10).status.resources.linux
        assert res.memory_limit_in_bytes == 96 * MiB


@pytest.mark.skipif(CGROUP_V1, reason="cgroup v2 only: reads the unified files "
                    "(memory.max, cpu.max, cpu.weight, pids.max) of one cgroup")
def test_v2_limits_land_in_the_containers_own_cgroup(env: Env) -> None:
    """The kubelet's limits in the container's cgroup (a crishim-<id>.scope under the
    systemd driver), runc's v1→v2 conversions, and nothing left once it is removed."""
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "limited", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            memory_limit_in_bytes=128 * MiB, cpu_period=100000,
                            cpu_quota=25000, cpu_shares=512)))
        d = container_cgroup(env, cid, "memory")
        if env.driver == "systemd":
            assert os.path.basename(d) == f"crishim-{cid}.scope", d
            assert os.path.dirname(d).endswith(pod_cfg.linux.cgroup_parent), d

        def read(name: str) -> str:
            with open(os.path.join(d, name)) as fh:
                return fh.read().strip()
        assert int(read("memory.max")) == 128 * MiB
        assert read("cpu.max").split() == ["25000", "100000"]
        # runc's shares → weight: 1 + (shares - 2) * 9999 / 262142
        assert int(read("cpu.weight")) == 1 + (512 - 2) * 9999 // 262142
        assert read("pids.max")  # the controller is on for the container (CRI sets no limit)
        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0),
                               timeout=30)
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
        assert not os.path.exists(d), f"{d} outlived the container"


def test_update_container_resources_lowers_memory_limit(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "sleeper", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                            memory_limit_in_bytes=256 * MiB, cpu_period=100000,
                            cpu_quota=100000, cpu_shares=512)))
        mem_dir = container_cgroup(env, cid, "memory")
        limit_file = "memory.limit_in_bytes" if CGROUP_V1 else "memory.max"
        with open(os.path.join(mem_dir, limit_file)) as fh:
            assert int(fh.read()) == 256 * MiB
        env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=64 * MiB, cpu_period=100000, cpu_quota=50000)),
            timeout=30)
        with open(os.path.join(mem_dir, limit_file)) as fh:
            assert int(fh.read()) == 64 * MiB
        if CGROUP_V1:
            with open(os.path.join(container_cgroup(env, cid, "cpu"), "cpu.cfs_quota_us")) as fh:
                assert int(fh.read()) == 50000
        else:
            with open(os.path.join(mem_dir, "cpu.max")) as fh:
                assert fh.read().split() == ["50000", "100000"]
        res = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                       timeout=10).status.resources.linux
        assert (res.memory_limit_in_bytes, res.cpu_quota) == (64 * MiB, 50000)
        assert res.cpu_shares == 512  # not in the update: kept
        s = stats(env, cid)
        assert s.memory.available_bytes.value <= 64 * MiB

        with pytest.raises(grpc.RpcError) as bad:
            env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id=cid, linux=pb.LinuxContainerResources(cpu_period=5)), timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cpu_period" in (bad.value.details() or "")
        with pytest.raises(grpc.RpcError) as missing:
            env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id="0" * 64, linux=pb.LinuxContainerResources()), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        # A pod resize as kubelet 1.36 sends it for a Burstable pod without a memory limit
        # (-1: its cgroup says "max"): accepted and recorded; the pod cgroup is the
        # kubelet's, so crishim leaves it alone.
        pod_dir = f"/sys/fs/cgroup/memory/{pod_cfg.linux.cgroup_parent.strip('/')}"
        before = open(os.path.join(pod_dir, "memory.limit_in_bytes")).read() \
            if CGROUP_V1 else ""
        env.rt().UpdatePodSandboxResources(pb.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id=pod_id, resources=pb.LinuxContainerResources(
                cpu_period=100000, cpu_quota=-1, cpu_shares=102, memory_limit_in_bytes=-1),
            overhead=pb.LinuxContainerResources()), timeout=10)
        info = json.loads(env.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(
            pod_sandbox_id=pod_id, verbose=True), timeout=10).info["info"])
        recorded = info["config"]["linux"]["resources"]
        assert (recorded["memoryLimitInBytes"], recorded["cpuQuota"]) == ("-1", "-1")
        if CGROUP_V1:
            assert open(os.path.join(pod_dir, "memory.limit_in_bytes")).read() == before

        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=30)
        with pytest.raises(grpc.RpcError) as exited:
            env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id=cid, linux=pb.LinuxContainerResources(
                    memory_limit_in_bytes=32 * MiB)), timeout=10)
        assert exited.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_event_stream_sees_another_clients_container_lifecycle(env: Env) -> None:
    watcher = env.d.channel()
    # The deadline only bounds a broken run; the stream normally ends by our break.
    stream = api_pb2_grpc.RuntimeServiceStub(watcher).GetContainerEvents(
        pb.GetEventsRequest(), timeout=120)
    try:
        other = env.d.runtime()  # a second client does the work
        with pod(env) as (pod_id, pod_cfg):
            cid = container(env, pod_id, pod_cfg, "evt", ["sleep", "3600"], rt=other)
            other.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0),
                                timeout=30)
            other.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
        seen: list[pb.ContainerEventResponse] = []
        pod_seen: list[pb.ContainerEventResponse] = []
        for event in stream:
            if event.container_id == cid:
                seen.append(event)
            elif event.container_id == pod_id:
                pod_seen.append(event)
                if event.container_event_type == pb.CONTAINER_DELETED_EVENT:
                    break
        assert [e.container_event_type for e in seen] == [
            pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
            pb.CONTAINER_STOPPED_EVENT, pb.CONTAINER_DELETED_EVENT]
        assert all(e.pod_sandbox_status.id == pod_id for e in seen)
        started = seen[1]
        assert any(s.id == cid and s.state == pb.CONTAINER_RUNNING
                   for s in started.containers_statuses)
        assert seen[0].created_at <= seen[-1].created_at
        # The sandbox's own lifecycle is on the same stream, as containerd sends it.
        kinds = [e.container_event_type for e in pod_seen]
        assert kinds[:2] == [pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT]
        assert kinds[-1] == pb.CONTAINER_DELETED_EVENT
        assert pb.CONTAINER_STOPPED_EVENT in kinds
    finally:
        stream.cancel()
        watcher.close()


def test_streaming_lists_match_list_rpcs(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "s", ["sleep", "3600"])
        rt = env.rt()
        pods = [p.id for r in rt.StreamPodSandboxes(pb.StreamPodSandboxesRequest(), timeout=10)
                for p in r.pod_sandboxes]
        assert pods == [p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                        timeout=10).items]
        ctrs = [c.id for r in rt.StreamContainers(pb.StreamContainersRequest(
            filter=pb.ContainerFilter(pod_sandbox_id=pod_id)), timeout=10) for c in r.containers]
        assert ctrs == [cid]
        cstats = [s.attributes.id for r in rt.StreamContainerStats(
            pb.StreamContainerStatsRequest(filter=pb.ContainerStatsFilter(id=cid)), timeout=10)
            for s in r.container_stats]
        assert cstats == [cid]
        pstats = [s.attributes.id for r in rt.StreamPodSandboxStats(
            pb.StreamPodSandboxStatsRequest(filter=pb.PodSandboxStatsFilter(
                label_selector={"suite": "stats"})), timeout=10) for s in r.pod_sandbox_stats]
        assert pstats == [pod_id]
        pm = [m.pod_sandbox_id for r in rt.StreamPodSandboxMetrics(
            pb.StreamPodSandboxMetricsRequest(), timeout=10) for m in r.pod_sandbox_metrics]
        assert pod_id in pm
        empty = list(rt.StreamContainers(pb.StreamContainersRequest(
            filter=pb.ContainerFilter(id="does-not-exist")), timeout=10))
        assert empty == []


def test_prometheus_endpoint_counts_pods_and_containers_by_state(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        container(env, pod_id, pod_cfg, "m", ["sleep", "3600"])
        url = f"http://127.0.0.1:{env.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines()
              if line.startswith(("crishim_pods{", "crishim_containers{"))}
    assert values.get('crishim_pods{state="ready"}', 0) >= 1
    assert values.get('crishim_containers{state="running"}', 0) >= 1
    assert 'crishim_cri_operation_duration_seconds_count{method="CreateContainer"}' in body
