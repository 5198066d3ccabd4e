"""cAdvisor-compatible metric descriptors and values for ListPodSandboxMetrics.

The kubelet (PodAndContainerStatsFromCRI) serves /metrics/cadvisor from these: it asks
ListMetricDescriptors once for names, help and label keys, then ListPodSandboxMetrics for
values whose label_values line up with those keys. Every metric carries the base labels:
container id, container name and image as CRI-O sends them, and the container, pod and
namespace labels cAdvisor puts on its series, which dashboards and alerts select by; the
pod-level entries use the name "POD" like cAdvisor's pause container. Values are uint64,
so "seconds" metrics are whole seconds.

Only metrics crishim actually fills are described: a descriptor without values would make
the kubelet export an empty family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.fsusage import FsUsage
from crishim.stats.cgroups import CgroupStats
from crishim.stats.layerusage import FsCapacity
from crishim.stats.netdev import InterfaceStats

BASE_LABELS = ("id", "name", "image", "container", "pod", "namespace")
POD_CONTAINER_NAME = "POD"
NANOS = 1_000_000_000

COUNTER = pb.MetricType.COUNTER
GAUGE = pb.MetricType.GAUGE


@dataclass(frozen=True)
class Descriptor:
    name: str
    help: str
    type: pb.MetricType
    extra_labels: tuple[str, ...] = ()

    @property
    def label_keys(self) -> list[str]:
        return [*BASE_LABELS, *self.extra_labels]

    def to_pb(self) -> pb.MetricDescriptor:
        return pb.MetricDescriptor(name=self.name, help=self.help, label_keys=self.label_keys)


def _d(name: str, help_: str, type_: pb.MetricType, *extra: str) -> Descriptor:
    return Descriptor(name, help_, type_, extra)


CPU = (
    _d("container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.",
       COUNTER, "cpu"),
    _d("container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.",
       COUNTER),
    _d("container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.",
       COUNTER),
    _d("container_cpu_cfs_periods_total", "Number of elapsed enforcement period intervals.",
       COUNTER),
    _d("container_cpu_cfs_throttled_periods_total", "Number of throttled period intervals.",
       COUNTER),
    _d("container_cpu_cfs_throttled_seconds_total",
       "Total time duration the container has been throttled.", COUNTER),
)
MEMORY = (
    _d("container_memory_usage_bytes",
       "Current memory usage in bytes, including all memory regardless of when it was "
       "accessed", GAUGE),
    _d("container_memory_working_set_bytes", "Current working set in bytes.", GAUGE),
    _d("container_memory_rss", "Size of RSS in bytes.", GAUGE),
    _d("container_memory_cache", "Number of bytes of page cache memory.", GAUGE),
    _d("container_memory_mapped_file", "Size of memory mapped files in bytes.", GAUGE),
    _d("container_memory_swap", "Container swap usage in bytes.", GAUGE),
    _d("container_memory_failcnt", "Number of memory usage hits limits", COUNTER),
    _d("container_memory_max_usage_bytes", "Maximum memory usage recorded in bytes", GAUGE),
    _d("container_memory_failures_total", "Cumulative count of memory allocation failures.",
       COUNTER, "failure_type", "scope"),
    _d("container_memory_kernel_usage", "Size of kernel memory allocated in bytes.", GAUGE),
    _d("container_oom_events_total",
       "Count of out of memory events observed for the container", COUNTER),
)
NETWORK = (
    _d("container_network_receive_bytes_total", "Cumulative count of bytes received",
       COUNTER, "interface"),
    _d("container_network_receive_packets_total", "Cumulative count of packets received",
       COUNTER, "interface"),
    _d("container_network_receive_packets_dropped_total",
       "Cumulative count of packets dropped while receiving", COUNTER, "interface"),
    _d("container_network_receive_errors_total",
       "Cumulative count of errors encountered while receiving", COUNTER, "interface"),
    _d("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted",
       COUNTER, "interface"),
    _d("container_network_transmit_packets_total", "Cumulative count of packets transmitted",
       COUNTER, "interface"),
    _d("container_network_transmit_packets_dropped_total",
       "Cumulative count of packets dropped while transmitting", COUNTER, "interface"),
    _d("container_network_transmit_errors_total",
       "Cumulative count of errors encountered while transmitting", COUNTER, "interface"),
)
PROCESS = (
    _d("container_processes", "Number of processes running inside the container.", GAUGE),
    _d("container_threads_max",
       "Maximum number of threads allowed inside the container, infinity if value is zero",
       GAUGE),
    _d("container_threads", "Number of threads running inside the container", GAUGE),
    _d("container_file_descriptors", "Number of open file descriptors for the container.",
       GAUGE),
    _d("container_sockets", "Number of open sockets for the container.", GAUGE),
)
DISK = (
    _d("container_fs_usage_bytes", "Number of bytes that are consumed by the container on "
       "this filesystem.", GAUGE, "device"),
    _d("container_fs_inodes_total", "Number of inodes used by the container's writable layer.",
       GAUGE, "device"),
    _d("container_fs_limit_bytes", "Number of bytes that can be consumed by the container on "
       "this filesystem.", GAUGE, "device"),
    _d("container_fs_inodes_free", "Number of available Inodes", GAUGE, "device"),
)
BLKIO = (
    _d("container_blkio_device_usage_total", "Blkio Device bytes usage", COUNTER,
       "device", "major", "minor", "operation"),
    _d("container_fs_reads_bytes_total", "Cumulative count of bytes read", COUNTER, "device"),
    _d("container_fs_reads_total", "Cumulative count of reads completed", COUNTER, "device"),
    _d("container_fs_writes_bytes_total", "Cumulative count of bytes written", COUNTER,
       "device"),
    _d("container_fs_writes_total", "Cumulative count of writes completed", COUNTER, "device"),
)
SPEC = (
    _d("container_spec_memory_limit_bytes", "Memory limit for the container.", GAUGE),
    _d("container_spec_memory_swap_limit_bytes", "Memory swap limit for the container.", GAUGE),
    _d("container_spec_cpu_period", "CPU period of the container.", GAUGE),
    _d("container_spec_cpu_quota", "CPU quota of the container.", GAUGE),
    _d("container_spec_cpu_shares", "CPU share of the container.", GAUGE),
)
MISC = (
    _d("container_last_seen", "Last time a container was seen by the exporter", GAUGE),
    _d("container_start_time_seconds",
       "Start time of the container since unix epoch in seconds.", GAUGE),
)

ALL: tuple[Descriptor, ...] = CPU + MEMORY + NETWORK + PROCESS + DISK + BLKIO + SPEC + MISC
BY_NAME: dict[str, Descriptor] = {d.name: d for d in ALL}


def descriptors() -> list[pb.MetricDescriptor]:
    return [d.to_pb() for d in ALL]


class _Builder:
    def __init__(self, base: Sequence[str], timestamp_ns: int) -> None:
        self.base = list(base)
        self.ts = timestamp_ns
        self.out: list[pb.Metric] = []

    def add(self, name: str, value: int, *extra: str) -> None:
        d = BY_NAME[name]
        assert len(extra) == len(d.extra_labels), name
        self.out.append(pb.Metric(name=name, timestamp=self.ts, metric_type=d.type,
                                  label_values=[*self.base, *extra],
                                  value=pb.UInt64Value(value=max(int(value), 0))))


def cgroup_metrics(base: Sequence[str], stats: CgroupStats | None, fs: FsUsage | None = None,
                   resources: Mapping[str, int] | None = None,
                   capacity: FsCapacity | None = None,
                   start_time_ns: int = 0) -> list[pb.Metric]:
    """Metrics of one cgroup (a container, or a pod's cgroup with name POD).

    `base` = [id, name, image]; `resources` = the stored LinuxContainerResources as a
    dict (memory_limit_in_bytes, cpu_period, ...), for the spec metrics; `capacity` = the
    writable layer's filesystem; `start_time_ns` = when it started (0 = unknown).
    """
    ts = stats.timestamp_ns if stats else (fs.timestamp_ns if fs else 0)
    b = _Builder(base, ts)
    if stats is not None:
        if stats.cpu is not None:
            c = stats.cpu
            b.add("container_cpu_usage_seconds_total", c.usage_ns // NANOS, "total")
            b.add("container_cpu_user_seconds_total", c.user_ns // NANOS)
            b.add("container_cpu_system_seconds_total", c.system_ns // NANOS)
            b.add("container_cpu_cfs_periods_total", c.periods)
            b.add("container_cpu_cfs_throttled_periods_total", c.throttled_periods)
            b.add("container_cpu_cfs_throttled_seconds_total", c.throttled_ns // NANOS)
        if stats.memory is not None:
            m = stats.memory
            b.add("container_memory_usage_bytes", m.usage)
            b.add("container_memory_working_set_bytes", m.working_set)
            b.add("container_memory_rss", m.rss)
            b.add("container_memory_cache", m.cache)
            b.add("container_memory_mapped_file", m.mapped_file)
            b.add("container_memory_swap", m.swap)
            b.add("container_memory_failcnt", m.failcnt)
            b.add("container_memory_max_usage_bytes", m.max_usage)
            # Like cAdvisor: "container" = the cgroup's own tasks, "hierarchy" = with children.
            for ftype, own, total in (("pgfault", m.own_page_faults, m.page_faults),
                                      ("pgmajfault", m.own_major_page_faults,
                                       m.major_page_faults)):
                b.add("container_memory_failures_total", own, ftype, "container")
                b.add("container_memory_failures_total", total, ftype, "hierarchy")
        if stats.kernel_memory is not None:
            b.add("container_memory_kernel_usage", stats.kernel_memory)
        if stats.oom_events is not None:
            b.add("container_oom_events_total", stats.oom_events)
        if stats.pids is not None:
            b.add("container_processes", stats.pids)
        b.add("container_threads_max", stats.pids_max or 0)
        if stats.processes is not None:
            b.add("container_threads", stats.processes.threads)
            b.add("container_file_descriptors", stats.processes.fds)
            b.add("container_sockets", stats.processes.sockets)
        for dev in stats.io:
            labels = (dev.name, str(dev.major), str(dev.minor))
            b.add("container_blkio_device_usage_total", dev.read_bytes, *labels, "Read")
            b.add("container_blkio_device_usage_total", dev.write_bytes, *labels, "Write")
            b.add("container_fs_reads_bytes_total", dev.read_bytes, dev.name)
            b.add("container_fs_reads_total", dev.reads, dev.name)
            b.add("container_fs_writes_bytes_total", dev.write_bytes, dev.name)
            b.add("container_fs_writes_total", dev.writes, dev.name)
        b.add("container_last_seen", stats.timestamp_ns // NANOS)
    device = capacity.device if capacity is not None else ""
    if fs is not None:
        b.add("container_fs_usage_bytes", fs.used_bytes, device)
        b.add("container_fs_inodes_total", fs.inodes_used, device)
    if capacity is not None:
        b.add("container_fs_limit_bytes", capacity.limit_bytes, device)
        b.add("container_fs_inodes_free", capacity.inodes_free, device)
    if start_time_ns > 0:
        b.add("container_start_time_seconds", start_time_ns // NANOS)
    if resources is not None:
        for key, name in (("memory_limit_in_bytes", "container_spec_memory_limit_bytes"),
                          ("memory_swap_limit_in_bytes",
                           "container_spec_memory_swap_limit_bytes"),
                          ("cpu_period", "container_spec_cpu_period"),
                          ("cpu_quota", "container_spec_cpu_quota"),
                          ("cpu_shares", "container_spec_cpu_shares")):
            value = resources.get(key)
            if value:
                b.add(name, value)
    return b.out


_NET: tuple[tuple[str, Callable[[InterfaceStats], int]], ...] = (
    ("container_network_receive_bytes_total", lambda i: i.rx_bytes),
    ("container_network_receive_packets_total", lambda i: i.rx_packets),
    ("container_network_receive_packets_dropped_total", lambda i: i.rx_dropped),
    ("container_network_receive_errors_total", lambda i: i.rx_errors),
    ("container_network_transmit_bytes_total", lambda i: i.tx_bytes),
    ("container_network_transmit_packets_total", lambda i: i.tx_packets),
    ("container_network_transmit_packets_dropped_total", lambda i: i.tx_dropped),
    ("container_network_transmit_errors_total", lambda i: i.tx_errors),
)


def network_metrics(base: Sequence[str], ifaces: Sequence[InterfaceStats],
                    timestamp_ns: int) -> list[pb.Metric]:
    """Per-interface network counters of a pod (label `interface`)."""
    b = _Builder(base, timestamp_ns)
    for iface in ifaces:
        for name, get in _NET:
            b.add(name, get(iface), iface.name)
    return b.out
