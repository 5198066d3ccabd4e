"""StatsCollector over a cgroup v2 fixture tree: CRI stats and metrics messages."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.xfsquota import ProjectQuota
from crishim.stats import collector
from crishim.stats.cgroups import CgroupV2Reader
from crishim.stats.collector import ContainerTarget, PodTarget, StatsCollector
from tests.fakes.cgroups import v2_tree, write

T = TypeVar("T")


def container(tmp_path: Path, cid: str, cgroup: str) -> ContainerTarget:
    upper = tmp_path / "upper" / cid
    upper.mkdir(parents=True)
    (upper / "file").write_bytes(b"x" * 8192)
    return ContainerTarget(id=cid, pod_id="p1", metadata=pb.ContainerMetadata(name=cid),
                           labels={"app": "x"}, image="busybox:latest", cgroups_path=cgroup,
                           writable_dir=str(upper), fs_mountpoint="/var/lib/crishim",
                           resources={"memory_limit_in_bytes": 104857600})


async def test_container_stats_and_rate(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v2_tree(cg, "/pods/p1/c1")
    col = StatsCollector(CgroupV2Reader(str(cg)))
    c1 = container(tmp_path, "c1", "/pods/p1/c1")
    gone = container(tmp_path, "gone", "/pods/p1/gone")  # exited: no cgroup any more
    first, second = await col.container_stats([c1, gone])
    assert first.attributes.id == "c1" and first.attributes.labels["app"] == "x"
    assert first.cpu.usage_core_nano_seconds.value == 2_500_000_000
    assert not first.cpu.HasField("usage_nano_cores")  # no previous sample yet
    assert first.cpu.psi.Some.Total == 4242
    assert first.memory.working_set_bytes.value == 73400320 - 8388608
    assert first.memory.available_bytes.value == 104857600 - (73400320 - 8388608)
    assert first.writable_layer.inodes_used.value == 2
    assert first.writable_layer.used_bytes.value >= 8192
    assert first.writable_layer.fs_id.mountpoint == "/var/lib/crishim"
    assert not second.HasField("cpu") and second.writable_layer.inodes_used.value == 2

    # Pretend 2 s of wall time passed with 1 s of CPU: half a core.
    prev_usage, prev_ts = col.rates._prev["c1"]
    col.rates._prev["c1"] = (prev_usage - 1_000_000_000, prev_ts - 2_000_000_000)
    (again,) = await col.container_stats([c1])
    rate = again.cpu.usage_nano_cores.value
    assert 490_000_000 < rate <= 500_000_000


async def test_pod_stats_from_pod_cgroup_and_network(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v2_tree(cg, "/pods/p1")
    v2_tree(cg, "/pods/p1/c1")
    write(cg / "pods" / "p1" / "pids.current", "5\n")
    col = StatsCollector(CgroupV2Reader(str(cg)))
    pod = PodTarget(id="p1", metadata=pb.PodSandboxMetadata(name="web", namespace="ns"),
                    labels={"l": "v"}, cgroup_parent="/pods/p1", pause_pid=os.getpid(),
                    containers=[container(tmp_path, "c1", "/pods/p1/c1")])
    (s,) = await col.pod_stats([pod])
    assert s.attributes.id == "p1" and s.attributes.metadata.name == "web"
    assert s.linux.process.process_count.value == 5
    assert s.linux.cpu.usage_core_nano_seconds.value == 2_500_000_000
    assert [c.attributes.id for c in s.linux.containers] == ["c1"]
    # our own netns stands in for the pod's: the interfaces are reported, lo is not
    assert s.linux.network.interfaces
    assert all(i.name != "lo" for i in s.linux.network.interfaces)


async def test_pod_without_pod_cgroup_sums_members(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v2_tree(cg, "/crishim/pause")
    v2_tree(cg, "/crishim/c1")
    col = StatsCollector(CgroupV2Reader(str(cg)))
    pod = PodTarget(id="p1", metadata=pb.PodSandboxMetadata(name="web", namespace="prod"),
                    pause_cgroups_path="/crishim/pause", host_network=True,
                    containers=[container(tmp_path, "c1", "/crishim/c1")])
    (s,) = await col.pod_stats([pod])
    assert s.linux.cpu.usage_core_nano_seconds.value == 2 * 2_500_000_000
    assert s.linux.memory.usage_bytes.value == 2 * 73400320
    assert s.linux.process.process_count.value == 6
    assert not s.linux.HasField("network")  # host network: not the pod's to report


async def test_pod_metrics_labels(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v2_tree(cg, "/pods/p1")
    v2_tree(cg, "/pods/p1/c1")
    col = StatsCollector(CgroupV2Reader(str(cg)))
    pod = PodTarget(id="p1", metadata=pb.PodSandboxMetadata(name="web", namespace="prod"),
                    cgroup_parent="/pods/p1", pause_pid=os.getpid(),
                    containers=[container(tmp_path, "c1", "/pods/p1/c1")])
    (m,) = await col.pod_metrics([pod])
    assert m.pod_sandbox_id == "p1"
    names = {x.name for x in m.metrics}
    assert "container_network_receive_bytes_total" in names
    assert all(list(x.label_values[:6]) == ["p1", "POD", "", "POD", "web", "prod"]
               for x in m.metrics)
    (cm,) = m.container_metrics
    ws = next(x for x in cm.metrics if x.name == "container_memory_working_set_bytes")
    # cAdvisor's container/pod/namespace labels, which dashboards select by.
    assert list(ws.label_values) == ["c1", "c1", "busybox:latest", "c1", "web", "prod"]
    assert ws.value.value == 73400320 - 8388608
    limit = next(x for x in cm.metrics if x.name == "container_spec_memory_limit_bytes")
    assert limit.value.value == 104857600


async def test_hundred_containers_walk_once_per_refresh(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    targets = []
    for i in range(100):
        v2_tree(cg, f"/pods/p1/c{i}")
        targets.append(container(tmp_path, f"c{i}", f"/pods/p1/c{i}"))
    col = StatsCollector(CgroupV2Reader(str(cg)), fs_refresh=3600)
    for _ in range(5):
        out = await col.container_stats(targets)
        assert len(out) == 100 and all(s.writable_layer.inodes_used.value == 2 for s in out)
    assert col.fs.walks == 100  # the first call walked each layer; the next four did not
    col.retain({"c0"}, set())
    assert set(col.fs._entries) == {"c0"} and set(col.rates._prev) == {"c0"}


async def test_capped_layers_read_from_quotas_in_the_cgroups_hop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cg = tmp_path / "cg"
    for name in ("c1", "c2", "c3"):
        v2_tree(cg, f"/pods/p1/{name}")
    asked: list[int] = []

    def get_quota(device: str, project_id: int) -> ProjectQuota:
        asked.append(project_id)
        if project_id == 3:
            raise OSError(5, "EIO")
        return ProjectQuota(project_id, 64 << 20, project_id << 20, 7)

    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn: Callable[..., T], /, *args: object) -> T:
        hops.append(getattr(fn, "__name__", "?"))
        return await to_thread(fn, *args)

    monkeypatch.setattr(collector.xfsquota, "get_quota", get_quota)
    monkeypatch.setattr(collector.asyncio, "to_thread", counted)
    col = StatsCollector(CgroupV2Reader(str(cg)))
    capped = [dataclasses.replace(container(tmp_path, n, f"/pods/p1/{n}"), project_id=i,
                                  quota_device="/dev/loop0")
              for i, n in ((1, "c1"), (3, "c3"))]
    free = container(tmp_path, "c2", "/pods/p1/c2")
    one, two, three = await col.container_stats([capped[0], free, capped[1]])
    assert one.writable_layer.used_bytes.value == 1 << 20  # the quota's, not walked
    assert one.writable_layer.inodes_used.value == 7
    assert two.writable_layer.inodes_used.value == 2  # uncapped: walked
    assert three.writable_layer.inodes_used.value == 2  # quota unreadable: walked
    assert sorted(asked) == [1, 3]
    assert hops.count("_read_both") == 1 and "_read_quotas" not in hops

    hops.clear()
    pods = [PodTarget(id=f"p{i}", metadata=pb.PodSandboxMetadata(name=f"p{i}"),
                      host_network=True, containers=[c]) for i, c in enumerate(capped)]
    stats = await col.pod_stats(pods)
    assert stats[0].linux.containers[0].writable_layer.used_bytes.value == 1 << 20
    assert hops.count("_read_both") == 1  # one hop for all the pods' quotas and cgroups
