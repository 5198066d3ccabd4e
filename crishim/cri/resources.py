"""UpdateContainerResources and UpdatePodSandboxResources.

A container update is validated, merged over the stored resources (a zero field means
"unchanged", as the kubelet sends whole LinuxContainerResources), applied with
`runc update`, and only then persisted, so ContainerStatus.resources shows what the
cgroup really has. A pod update applies to the pod-level cgroup the kubelet created.
"""

from __future__ import annotations

import os
import re
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.manager import KIND as CONTAINER_KIND
from crishim.container.record import CREATED, RUNNING, Container
from crishim.cri.base import Context
from crishim.cri.lists import container_manager, sandbox_manager
from crishim.daemon import Daemon
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.log import get_logger
from crishim.oci.runc import OCIRuntimeError
from crishim.sandbox.model import Sandbox
from crishim.stats import cgroupwrite

log = get_logger(__name__)

_CPUSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_PAGE_SIZE = re.compile(r"^\d+(KB|MB|GB|TB|PB)$")
# Kernel bounds (cgroup v1 cpu controller): CFS period 1 ms..1 s, quota ≥ 1 ms, shares 2..2^18.
MIN_PERIOD, MAX_PERIOD, MIN_QUOTA = 1000, 1_000_000, 1000
MIN_SHARES, MAX_SHARES = 2, 262144
# Below this the container cannot even start its init; the kernel accepts it but OOMs.
MIN_MEMORY = 6 * 1024 * 1024


def validate(res: pb.LinuxContainerResources, cgroup_v2: bool) -> None:
    """Raise InvalidArgument with the offending field for values the kernel would refuse."""
    if res.cpu_period and not MIN_PERIOD <= res.cpu_period <= MAX_PERIOD:
        raise InvalidArgument(f"cpu_period {res.cpu_period} must be between {MIN_PERIOD} and "
                              f"{MAX_PERIOD} microseconds")
    if res.cpu_quota and res.cpu_quota != -1 and res.cpu_quota < MIN_QUOTA:
        raise InvalidArgument(f"cpu_quota {res.cpu_quota} must be -1 (unlimited) or at least "
                              f"{MIN_QUOTA} microseconds")
    if res.cpu_shares and not MIN_SHARES <= res.cpu_shares <= MAX_SHARES:
        raise InvalidArgument(f"cpu_shares {res.cpu_shares} must be between {MIN_SHARES} and "
                              f"{MAX_SHARES}")
    if res.memory_limit_in_bytes < 0:
        raise InvalidArgument(f"memory_limit_in_bytes {res.memory_limit_in_bytes} is negative")
    if 0 < res.memory_limit_in_bytes < MIN_MEMORY:
        raise InvalidArgument(f"memory_limit_in_bytes {res.memory_limit_in_bytes} is below the "
                              f"minimum of {MIN_MEMORY} bytes")
    swap = res.memory_swap_limit_in_bytes
    if swap < -1:
        raise InvalidArgument(f"memory_swap_limit_in_bytes {swap} must be -1 or positive")
    if swap > 0 and res.memory_limit_in_bytes and swap < res.memory_limit_in_bytes:
        raise InvalidArgument(f"memory_swap_limit_in_bytes {swap} (memory+swap) is below "
                              f"memory_limit_in_bytes {res.memory_limit_in_bytes}")
    for name in ("cpuset_cpus", "cpuset_mems"):
        value = getattr(res, name)
        if value and not _CPUSET.match(value):
            raise InvalidArgument(f"{name} {value!r} is not a list like '0-2,4'")
    for h in res.hugepage_limits:
        if not _PAGE_SIZE.match(h.page_size):
            raise InvalidArgument(f"hugepage page_size {h.page_size!r} must look like '2MB'")
    if res.unified and not cgroup_v2:
        raise InvalidArgument("resources.unified needs cgroup v2; this node runs cgroup v1")
    if not -1000 <= res.oom_score_adj <= 1000:
        raise InvalidArgument(f"oom_score_adj {res.oom_score_adj} must be in -1000..1000")


def merge(old: pb.LinuxContainerResources,
          new: pb.LinuxContainerResources) -> pb.LinuxContainerResources:
    """`new` over `old`: set (non-zero) fields replace, unset ones keep the old value."""
    out = pb.LinuxContainerResources()
    out.CopyFrom(old)
    for field in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes",
                  "memory_swap_limit_in_bytes", "cpuset_cpus", "cpuset_mems"):
        value = getattr(new, field)
        if value:
            setattr(out, field, value)
    if new.hugepage_limits:
        del out.hugepage_limits[:]
        out.hugepage_limits.extend(new.hugepage_limits)
    out.unified.update(new.unified)
    # oom_score_adj is fixed at start: runc update cannot change it, so keep the stored one.
    return out


def oci_resources(res: pb.LinuxContainerResources, swap_accounting: bool) -> dict[str, Any]:
    """The OCI LinuxResources JSON `runc update -r -` takes (only the fields that are set)."""
    out: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    for src, dst in (("cpu_shares", "shares"), ("cpu_quota", "quota"), ("cpu_period", "period"),
                     ("cpuset_cpus", "cpus"), ("cpuset_mems", "mems")):
        value = getattr(res, src)
        if value:
            cpu[dst] = value
    if cpu:
        out["cpu"] = cpu
    if res.memory_limit_in_bytes:
        mem: dict[str, Any] = {"limit": res.memory_limit_in_bytes}
        if swap_accounting:
            # memory+swap; the same default as at create: no extra swap.
            mem["swap"] = res.memory_swap_limit_in_bytes or res.memory_limit_in_bytes
        out["memory"] = mem
    if res.hugepage_limits:
        out["hugepageLimits"] = [{"pageSize": h.page_size, "limit": h.limit}
                                 for h in res.hugepage_limits]
    if res.unified:
        out["unified"] = dict(res.unified)
    return out


def _cgroup_v2() -> bool:
    return os.path.isfile("/sys/fs/cgroup/cgroup.controllers")


def _swap_accounting() -> bool:
    return _cgroup_v2() or os.path.exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")


class ResourceRPCs:
    daemon: Daemon

    async def UpdateContainerResources(self, request: pb.UpdateContainerResourcesRequest,
                                       context: Context) -> pb.UpdateContainerResourcesResponse:
        if not request.container_id:
            raise InvalidArgument("container_id is required")
        if not request.HasField("linux"):
            raise InvalidArgument("linux resources are required (windows is not supported)")
        mgr: Any = container_manager(self.daemon)
        rec: Container = mgr.get(request.container_id)
        validate(request.linux, _cgroup_v2())
        if rec.state not in (CREATED, RUNNING):
            raise FailedPrecondition(
                f"container {rec.id} is {pb.ContainerState.Name(rec.state)}; resources can "
                "only be updated while it is created or running")
        merged = merge(rec.config.linux.resources, request.linux)
        try:
            await mgr.update_resources(rec, oci_resources(merged, _swap_accounting()))
        except OCIRuntimeError as exc:
            if exc.not_exist() or exc.not_running():
                raise FailedPrecondition(f"container {rec.id} stopped while its resources "
                                         f"were being updated: {exc}") from None
            # e.g. EBUSY: a memory limit below what the container uses right now.
            raise FailedPrecondition(f"runc update of container {rec.id} failed: {exc}; "
                                     "the stored resources are unchanged") from None
        rec.config.linux.resources.CopyFrom(merged)
        await self.daemon.db.put(CONTAINER_KIND, rec.id, rec.to_dict())
        log.info("container resources updated", id=rec.id,
                 memory=merged.memory_limit_in_bytes, cpu_quota=merged.cpu_quota,
                 cpu_period=merged.cpu_period, cpu_shares=merged.cpu_shares)
        return pb.UpdateContainerResourcesResponse()

    async def UpdatePodSandboxResources(self, request: pb.UpdatePodSandboxResourcesRequest,
                                        context: Context
                                        ) -> pb.UpdatePodSandboxResourcesResponse:
        if not request.pod_sandbox_id:
            raise InvalidArgument("pod_sandbox_id is required")
        sb: Sandbox = sandbox_manager(self.daemon).get(request.pod_sandbox_id)
        v2 = _cgroup_v2()
        validate(request.resources, v2)
        validate(request.overhead, v2)
        if not sb.cgroup_parent:
            # No pod-level cgroup (the pod was run without a cgroup parent): nothing to
            # resize; the kubelet resizes the containers one by one.
            log.info("pod has no pod-level cgroup; resource update is a no-op", id=sb.id)
            return pb.UpdatePodSandboxResourcesResponse()
        written = await cgroupwrite.apply_pod_resources(
            self.daemon.stats.reader, sb.cgroup_parent, request.resources)
        log.info("pod resources updated", id=sb.id, cgroup=sb.cgroup_parent, files=written)
        return pb.UpdatePodSandboxResourcesResponse()
