"""Metric descriptors and values line up the way the kubelet's CRI metrics provider reads them."""

from __future__ import annotations

from crishim.stats.cgroups import CgroupStats, CpuStats, MemoryStats
from crishim.stats.descriptors import (
    BY_NAME,
    cgroup_metrics,
    descriptors,
    network_metrics,
)
from crishim.stats.fsusage import FsUsage
from crishim.stats.netdev import InterfaceStats

KUBELET_CORE = {"container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
                "container_memory_usage_bytes", "container_memory_rss",
                "container_network_receive_bytes_total", "container_network_transmit_bytes_total",
                "container_fs_usage_bytes", "container_processes"}


def stats() -> CgroupStats:
    return CgroupStats(
        timestamp_ns=5_000_000_000,
        cpu=CpuStats(usage_ns=7_900_000_000, user_ns=5_000_000_000, system_ns=2_000_000_000),
        memory=MemoryStats(usage=100, working_set=80, rss=60, cache=40, mapped_file=1,
                           page_faults=9, major_page_faults=1, limit=None),
        pids=4)


def test_descriptor_set_covers_kubelet_metrics_with_base_labels() -> None:
    descs = {d.name: d for d in descriptors()}
    assert KUBELET_CORE <= set(descs)
    for d in descs.values():
        assert list(d.label_keys[:3]) == ["id", "name", "image"]
        assert d.help
    assert list(descs["container_cpu_usage_seconds_total"].label_keys) == [
        "id", "name", "image", "cpu"]
    assert list(descs["container_network_receive_bytes_total"].label_keys)[-1] == "interface"


def test_values_have_one_label_value_per_key() -> None:
    base = ["cid", "app", "busybox:latest"]
    ms = cgroup_metrics(base, stats(), FsUsage(4096, 3, 1),
                        {"memory_limit_in_bytes": 1 << 20, "cpu_quota": 0})
    ms += network_metrics(["pod", "POD", ""], [InterfaceStats("eth0", 1, 2, 3, 4, 5, 6, 7, 8)],
                          6)
    by = {m.name: m for m in ms}
    for m in ms:
        assert len(m.label_values) == len(BY_NAME[m.name].label_keys), m.name
        assert m.metric_type == BY_NAME[m.name].type
    cpu = by["container_cpu_usage_seconds_total"]
    assert list(cpu.label_values) == [*base, "total"] and cpu.value.value == 7
    assert by["container_memory_working_set_bytes"].value.value == 80
    assert by["container_processes"].value.value == 4
    assert by["container_fs_usage_bytes"].value.value == 4096
    assert by["container_spec_memory_limit_bytes"].value.value == 1 << 20
    assert "container_spec_cpu_quota" not in by  # unset resources are not reported
    assert by["container_network_transmit_errors_total"].value.value == 7
    assert by["container_network_receive_bytes_total"].label_values[-1] == "eth0"
