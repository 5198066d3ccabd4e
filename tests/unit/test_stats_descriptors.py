"""Metric descriptors and values line up the way the kubelet's CRI metrics provider reads them."""

from __future__ import annotations

import dataclasses

from crishim.host.fsusage import FsUsage
from crishim.stats.cgroups import CgroupStats, CpuStats, IoDevice, MemoryStats, ProcessCounts
from crishim.stats.descriptors import (
    BY_NAME,
    cgroup_metrics,
    descriptors,
    network_metrics,
)
from crishim.stats.layerusage import FsCapacity
from crishim.stats.netdev import InterfaceStats

NS = 1_000_000_000
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
        # CRI-O's three, then cAdvisor's labels that dashboards select by.
        assert list(d.label_keys[:6]) == ["id", "name", "image", "container", "pod",
                                          "namespace"]
        assert d.help
    assert list(descs["container_cpu_usage_seconds_total"].label_keys) == [
        "id", "name", "image", "container", "pod", "namespace", "cpu"]
    assert list(descs["container_network_receive_bytes_total"].label_keys)[-1] == "interface"


# id, name, image, container, pod, namespace of a pod-level series.
POD_BASE = ["pod", "POD", "", "POD", "web", "default"]


def test_values_have_one_label_value_per_key() -> None:
    base = ["cid", "app", "busybox:latest", "app", "web", "default"]
    ms = cgroup_metrics(base, stats(), FsUsage(4096, 3, 1),
                        {"memory_limit_in_bytes": 1 << 20, "cpu_quota": 0})
    ms += network_metrics(POD_BASE, [InterfaceStats("eth0", 1, 2, 3, 4, 5, 6, 7, 8)], 6)
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


# What critest (cri-tools pkg/validate/pod.go) expects from ListMetricDescriptors, minus the
# ones it lists as not implemented by runtimes yet (hugetlb, pressure, ulimits, ...).
CADVISOR_EXPECTED = {
    "container_blkio_device_usage_total", "container_cpu_cfs_periods_total",
    "container_cpu_cfs_throttled_periods_total", "container_cpu_cfs_throttled_seconds_total",
    "container_cpu_system_seconds_total", "container_cpu_usage_seconds_total",
    "container_cpu_user_seconds_total", "container_file_descriptors",
    "container_fs_inodes_free", "container_fs_inodes_total", "container_fs_limit_bytes",
    "container_fs_reads_bytes_total", "container_fs_reads_total", "container_fs_usage_bytes",
    "container_fs_writes_bytes_total", "container_fs_writes_total", "container_last_seen",
    "container_memory_cache", "container_memory_failcnt", "container_memory_failures_total",
    "container_memory_kernel_usage", "container_memory_mapped_file",
    "container_memory_max_usage_bytes", "container_memory_rss", "container_memory_swap",
    "container_memory_usage_bytes", "container_memory_working_set_bytes",
    "container_network_receive_bytes_total", "container_network_receive_errors_total",
    "container_network_receive_packets_dropped_total", "container_network_receive_packets_total",
    "container_network_transmit_bytes_total", "container_network_transmit_errors_total",
    "container_network_transmit_packets_dropped_total",
    "container_network_transmit_packets_total", "container_oom_events_total",
    "container_processes", "container_sockets", "container_spec_cpu_period",
    "container_spec_cpu_shares", "container_spec_memory_limit_bytes",
    "container_spec_memory_swap_limit_bytes", "container_start_time_seconds",
    "container_threads", "container_threads_max",
}


def full_stats() -> CgroupStats:
    base = stats()
    assert base.memory is not None
    return dataclasses.replace(
        base, pids_max=100, kernel_memory=65536, oom_events=1,
        memory=dataclasses.replace(base.memory, own_page_faults=3, own_major_page_faults=1),
        io=(IoDevice(8, 0, "/dev/sda", read_bytes=512, write_bytes=1024, reads=1, writes=2),),
        processes=ProcessCounts(threads=5, fds=9, sockets=2))


def test_cadvisor_metrics_critest_expects_are_described_and_filled() -> None:
    descs = {d.name: d for d in descriptors()}
    assert CADVISOR_EXPECTED <= set(descs), CADVISOR_EXPECTED - set(descs)
    ms = cgroup_metrics(["cid", "app", "img", "app", "web", "default"], full_stats(),
                        FsUsage(4096, 3, 1),
                        {"memory_limit_in_bytes": 1 << 26, "memory_swap_limit_in_bytes": 1 << 26,
                         "cpu_period": 100000, "cpu_quota": 20000, "cpu_shares": 1024},
                        FsCapacity("/dev/vda1", 10 << 30, 5000), start_time_ns=1_700_000_000 * NS)
    ms += network_metrics(POD_BASE, [InterfaceStats("eth0", 1, 2, 3, 4, 5, 6, 7, 8)], 6)
    # Every described metric has a value whose labels line up with the descriptor's keys.
    filled = {m.name for m in ms}
    assert set(descs) == filled, set(descs) - filled
    for m in ms:
        assert len(m.label_values) == len(descs[m.name].label_keys), m.name
    by = {(m.name, *m.label_values[6:]): m.value.value for m in ms}
    assert by[("container_threads",)] == 5 and by[("container_sockets",)] == 2
    assert by[("container_file_descriptors",)] == 9
    assert by[("container_start_time_seconds",)] == 1_700_000_000
    assert by[("container_fs_limit_bytes", "/dev/vda1")] == 10 << 30
    assert by[("container_fs_inodes_free", "/dev/vda1")] == 5000
    assert by[("container_memory_failures_total", "pgfault", "container")] == 3
    assert by[("container_memory_failures_total", "pgfault", "hierarchy")] == 9
    assert by[("container_blkio_device_usage_total", "/dev/sda", "8", "0", "Write")] == 1024
    assert by[("container_fs_writes_total", "/dev/sda")] == 2
    assert by[("container_oom_events_total",)] == 1
    assert by[("container_memory_kernel_usage",)] == 65536
