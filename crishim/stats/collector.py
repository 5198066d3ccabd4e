"""Turns cgroup, filesystem and network readings into CRI stats and metrics messages.

The collector knows nothing about the sandbox/container managers: it is handed
`ContainerTarget`/`PodTarget` views of the records (crishim.stats.targets). All cgroup
files of one call, and the XFS project quotas of its capped writable layers, are read in a
single worker-thread hop; an uncapped layer's usage comes from the cache of walks; CPU
rates are computed against the previous sample of the same id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host import xfsquota
from crishim.host.fsusage import FsUsage
from crishim.log import get_logger
from crishim.oci.slices import cgroup_relpath
from crishim.stats import descriptors
from crishim.stats.cgroups import (
    CgroupNotFound,
    CgroupReader,
    CgroupStats,
    CpuStats,
    MemoryStats,
    Psi,
)
from crishim.stats.cpurate import CpuRateTracker
from crishim.stats.layerusage import FsUsageCache, fs_capacity
from crishim.stats.netdev import InterfaceStats, default_interface, read_pid_net_dev

log = get_logger(__name__)


@dataclass
class ContainerTarget:
    id: str
    pod_id: str
    metadata: pb.ContainerMetadata
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    image: str = ""  # for the metrics "image" label
    cgroups_path: str = ""  # OCI cgroupsPath (cgroupfs or systemd form)
    writable_dir: str = ""  # overlay upper dir; "" = no writable layer stats
    fs_mountpoint: str = ""  # FilesystemIdentifier.mountpoint for the writable layer
    # The XFS project capping the writable layer and the device of its filesystem: usage
    # is read from the quota (0 / "": walked).
    project_id: int = 0
    quota_device: str = ""
    resources: Mapping[str, int] | None = None  # stored LinuxContainerResources as dict
    started_at_ns: int = 0  # for container_start_time_seconds (0 = not started)


@dataclass
class PodTarget:
    id: str
    metadata: pb.PodSandboxMetadata
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""  # the pod-level cgroup the kubelet made ("" = none)
    pause_cgroups_path: str = ""
    pause_pid: int = 0
    host_network: bool = False
    containers: list[ContainerTarget] = field(default_factory=list)
    created_at_ns: int = 0  # the pod's start time in its metrics


def _u64(v: int) -> pb.UInt64Value:
    return pb.UInt64Value(value=max(int(v), 0))


def _psi_pb(psi: Psi | None) -> pb.PsiStats | None:
    if psi is None:
        return None
    out = pb.PsiStats()
    for src, dst in ((psi.some, out.Some), (psi.full, out.Full)):
        if src is not None:
            dst.Total, dst.Avg10, dst.Avg60, dst.Avg300 = (src.total, src.avg10, src.avg60,
                                                           src.avg300)
    return out


def sum_stats(parts: Sequence[CgroupStats]) -> CgroupStats | None:
    """A pod's stats as the sum of its cgroups (used when there is no pod-level cgroup)."""
    if not parts:
        return None
    cpus = [p.cpu for p in parts if p.cpu is not None]
    mems = [p.memory for p in parts if p.memory is not None]
    cpu = CpuStats(usage_ns=sum(c.usage_ns for c in cpus), user_ns=sum(c.user_ns for c in cpus),
                   system_ns=sum(c.system_ns for c in cpus),
                   periods=sum(c.periods for c in cpus),
                   throttled_periods=sum(c.throttled_periods for c in cpus),
                   throttled_ns=sum(c.throttled_ns for c in cpus)) if cpus else None
    mem = None
    if mems:
        limits = [m.limit for m in mems]
        mem = MemoryStats(
            usage=sum(m.usage for m in mems), working_set=sum(m.working_set for m in mems),
            rss=sum(m.rss for m in mems), cache=sum(m.cache for m in mems),
            mapped_file=sum(m.mapped_file for m in mems),
            page_faults=sum(m.page_faults for m in mems),
            major_page_faults=sum(m.major_page_faults for m in mems),
            # The sum of limits is a limit only if every member is limited.
            limit=None if any(lim is None for lim in limits) else sum(
                lim for lim in limits if lim is not None),
            swap=sum(m.swap for m in mems), failcnt=sum(m.failcnt for m in mems))
    pids = [p.pids for p in parts if p.pids is not None]
    return CgroupStats(timestamp_ns=max(p.timestamp_ns for p in parts), cpu=cpu, memory=mem,
                       pids=sum(pids) if pids else None)


def _read_quotas(targets: Sequence[ContainerTarget]) -> dict[str, FsUsage | None]:
    out: dict[str, FsUsage | None] = {}
    for c in targets:
        try:
            q = xfsquota.get_quota(c.quota_device, c.project_id)
        except OSError as exc:
            log.warning("reading a writable layer's quota failed; walking it", id=c.id,
                        error=exc)
            out[c.id] = None
            continue
        out[c.id] = FsUsage(q.used_bytes, q.inodes_used, time.time_ns())
    return out


async def _ready(usage: FsUsage | None) -> FsUsage | None:
    return usage


class StatsCollector:
    def __init__(self, reader: CgroupReader, fs_refresh: float = 10.0) -> None:
        self.reader = reader
        self.rates = CpuRateTracker()
        self.fs = FsUsageCache(refresh=fs_refresh)

    # -- raw readings -------------------------------------------------------------------
    def _read_many(self, paths: Sequence[str], detail: bool) -> list[CgroupStats | None]:
        out: list[CgroupStats | None] = []
        for path in paths:
            if not path:
                out.append(None)
                continue
            try:
                out.append(self.reader.read(cgroup_relpath(path), detail))
            except CgroupNotFound:
                out.append(None)  # not running (yet / any more)
            except OSError as exc:
                log.warning("reading cgroup failed", path=path, error=exc)
                out.append(None)
        return out

    def _read_both(self, paths: Sequence[str], detail: bool,
                   capped: Sequence[ContainerTarget]
                   ) -> tuple[list[CgroupStats | None], dict[str, FsUsage | None]]:
        return self._read_many(paths, detail), _read_quotas(capped)

    async def _read(self, paths: Sequence[str], detail: bool,
                    targets: Sequence[ContainerTarget]
                    ) -> tuple[list[CgroupStats | None], dict[str, FsUsage | None]]:
        """The cgroups at `paths` and the quotas of the capped ones of `targets`, in one
        thread hop: a hop costs more than the 30 quotactl calls of 30 pods."""
        capped = [c for c in targets if c.project_id and c.quota_device]
        if not paths and not capped:
            return [], {}
        return await asyncio.to_thread(self._read_both, paths, detail, capped)

    async def _fs(self, c: ContainerTarget) -> FsUsage | None:
        if not c.writable_dir:
            return None
        return await self.fs.get(c.id, c.writable_dir)

    async def _layers(self, targets: Sequence[ContainerTarget],
                      quotas: Mapping[str, FsUsage | None]) -> list[FsUsage | None]:
        """Writable-layer usage of `targets`: from their quotas (read with the cgroups)
        where they have one, else walked (cached)."""
        walked = [c for c in targets if quotas.get(c.id) is None]
        found = dict(zip([c.id for c in walked],
                         await asyncio.gather(*(self._fs(c) for c in walked)), strict=True))
        return [quotas.get(c.id) or found.get(c.id) for c in targets]

    # -- protobuf builders --------------------------------------------------------------
    def _cpu_pb(self, key: str, cpu: CpuStats | None, ts: int) -> pb.CpuUsage | None:
        if cpu is None:
            return None
        out = pb.CpuUsage(timestamp=ts, usage_core_nano_seconds=_u64(cpu.usage_ns))
        rate = self.rates.update(key, cpu.usage_ns, ts)
        if rate is not None:
            out.usage_nano_cores.value = max(rate, 0)
        psi = _psi_pb(cpu.psi)
        if psi is not None:
            out.psi.CopyFrom(psi)
        return out

    @staticmethod
    def _memory_pb(mem: MemoryStats | None, ts: int) -> pb.MemoryUsage | None:
        if mem is None:
            return None
        out = pb.MemoryUsage(timestamp=ts, working_set_bytes=_u64(mem.working_set),
                             usage_bytes=_u64(mem.usage), rss_bytes=_u64(mem.rss),
                             page_faults=_u64(mem.page_faults),
                             major_page_faults=_u64(mem.major_page_faults))
        if mem.available is not None:
            out.available_bytes.value = mem.available
        psi = _psi_pb(mem.psi)
        if psi is not None:
            out.psi.CopyFrom(psi)
        return out

    def _fill_usage(self, out: pb.ContainerStats | pb.LinuxPodSandboxStats, key: str,
                    cg: CgroupStats) -> None:
        """cpu, memory and io of one cgroup reading, as containers and pods report them
        (`key` names the reading for the CPU rate)."""
        cpu = self._cpu_pb(key, cg.cpu, cg.timestamp_ns)
        if cpu is not None:
            out.cpu.CopyFrom(cpu)
        mem = self._memory_pb(cg.memory, cg.timestamp_ns)
        if mem is not None:
            out.memory.CopyFrom(mem)
        if cg.io_psi is not None:
            out.io.CopyFrom(pb.IoUsage(timestamp=cg.timestamp_ns, psi=_psi_pb(cg.io_psi)))

    def _container_pb(self, c: ContainerTarget, cg: CgroupStats | None,
                      fs: FsUsage | None) -> pb.ContainerStats:
        out = pb.ContainerStats(attributes=pb.ContainerAttributes(
            id=c.id, metadata=c.metadata, labels=dict(c.labels),
            annotations=dict(c.annotations)))
        if cg is not None:
            self._fill_usage(out, c.id, cg)
            if out.HasField("memory") and cg.memory is not None:
                out.swap.CopyFrom(pb.SwapUsage(timestamp=cg.timestamp_ns,
                                               swap_usage_bytes=_u64(cg.memory.swap)))
        if fs is not None:
            out.writable_layer.CopyFrom(pb.FilesystemUsage(
                timestamp=fs.timestamp_ns,
                fs_id=pb.FilesystemIdentifier(mountpoint=c.fs_mountpoint),
                used_bytes=_u64(fs.used_bytes), inodes_used=_u64(fs.inodes_used)))
        return out

    @staticmethod
    def _network_pb(ifaces: list[InterfaceStats] | None, ts: int) -> pb.NetworkUsage | None:
        if not ifaces:
            return None

        def one(i: InterfaceStats) -> pb.NetworkInterfaceUsage:
            return pb.NetworkInterfaceUsage(name=i.name, rx_bytes=_u64(i.rx_bytes),
                                            rx_errors=_u64(i.rx_errors),
                                            tx_bytes=_u64(i.tx_bytes),
                                            tx_errors=_u64(i.tx_errors))

        out = pb.NetworkUsage(timestamp=ts, interfaces=[one(i) for i in ifaces])
        default = default_interface(ifaces)
        if default is not None:
            out.default_interface.CopyFrom(one(default))
        return out

    # -- public API -------------------------------------------------------------------------
    async def container_stats(self, targets: Sequence[ContainerTarget]
                              ) -> list[pb.ContainerStats]:
        cgs, quotas = await self._read([c.cgroups_path for c in targets], False, targets)
        fss = await self._layers(targets, quotas)
        return [self._container_pb(c, cg, fs) for c, cg, fs in zip(targets, cgs, fss,
                                                                    strict=True)]

    async def _pod_readings(self, pods: Sequence[PodTarget], detail: bool = False) -> tuple[
            list[CgroupStats | None], list[list[CgroupStats | None]],
            list[list[InterfaceStats] | None], dict[str, FsUsage | None]]:
        """Pod cgroup (or the sum of its members), each container's cgroup, the pods'
        network, and the quotas of the capped writable layers."""
        paths: list[str] = []
        for p in pods:
            paths.append(p.cgroup_parent)
            paths.append(p.pause_cgroups_path)
            paths.extend(c.cgroups_path for c in p.containers)
        flat, quotas = await self._read(paths, detail, [c for p in pods for c in p.containers])
        pod_stats: list[CgroupStats | None] = []
        member_stats: list[list[CgroupStats | None]] = []
        i = 0
        for p in pods:
            own, pause = flat[i], flat[i + 1]
            members = flat[i + 2:i + 2 + len(p.containers)]
            i += 2 + len(p.containers)
            if own is None:
                own = sum_stats([s for s in [pause, *members] if s is not None])
            pod_stats.append(own)
            member_stats.append(list(members))
        nets = [None if p.host_network else read_pid_net_dev(p.pause_pid) for p in pods]
        return pod_stats, member_stats, nets, quotas

    async def pod_stats(self, pods: Sequence[PodTarget]) -> list[pb.PodSandboxStats]:
        pod_cgs, member_cgs, nets, quotas = await self._pod_readings(pods)
        out: list[pb.PodSandboxStats] = []
        for p, cg, members, net in zip(pods, pod_cgs, member_cgs, nets, strict=True):
            fss = await self._layers(p.containers, quotas)
            now = time.time_ns()
            linux = pb.LinuxPodSandboxStats(containers=[
                self._container_pb(c, mcg, fs)
                for c, mcg, fs in zip(p.containers, members, fss, strict=True)])
            if cg is not None:
                self._fill_usage(linux, "pod:" + p.id, cg)
                if cg.pids is not None:
                    linux.process.CopyFrom(pb.ProcessUsage(timestamp=cg.timestamp_ns,
                                                           process_count=_u64(cg.pids)))
            network = self._network_pb(net, now)
            if network is not None:
                linux.network.CopyFrom(network)
            out.append(pb.PodSandboxStats(
                attributes=pb.PodSandboxAttributes(id=p.id, metadata=p.metadata,
                                                   labels=dict(p.labels),
                                                   annotations=dict(p.annotations)),
                linux=linux))
        return out

    async def pod_metrics(self, pods: Sequence[PodTarget]) -> list[pb.PodSandboxMetrics]:
        pod_cgs, member_cgs, nets, quotas = await self._pod_readings(pods, detail=True)
        capacities = await asyncio.to_thread(
            lambda: [[fs_capacity(c.writable_dir) if c.writable_dir else None
                      for c in p.containers] for p in pods])
        out: list[pb.PodSandboxMetrics] = []
        for p, cg, members, net, caps in zip(pods, pod_cgs, member_cgs, nets, capacities,
                                             strict=True):
            fss = await self._layers(p.containers, quotas)
            pod, ns = p.metadata.name, p.metadata.namespace
            base = [p.id, descriptors.POD_CONTAINER_NAME, "", descriptors.POD_CONTAINER_NAME,
                    pod, ns]
            pod_metrics = descriptors.cgroup_metrics(base, cg, start_time_ns=p.created_at_ns)
            if net:
                pod_metrics += descriptors.network_metrics(base, net, time.time_ns())
            containers = [
                pb.ContainerMetrics(container_id=c.id, metrics=descriptors.cgroup_metrics(
                    [c.id, c.metadata.name, c.image, c.metadata.name, pod, ns], mcg, fs,
                    c.resources, cap,
                    c.started_at_ns))
                for c, mcg, fs, cap in zip(p.containers, members, fss, caps, strict=True)]
            out.append(pb.PodSandboxMetrics(pod_sandbox_id=p.id, metrics=pod_metrics,
                                            container_metrics=containers))
        return out

    def retain(self, container_ids: set[str], pod_ids: set[str]) -> None:
        """Forget rate baselines and cached usage of objects that no longer exist."""
        self.rates.retain(container_ids | {"pod:" + p for p in pod_ids})
        self.fs.retain(container_ids)
