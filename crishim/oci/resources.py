"""CRI LinuxContainerResources → OCI `linux.resources`, for what this host can enforce.

One mapping for every path that hands resources to the runtime: the container's
config.json at create, `runc update` (UpdateContainerResources), and the checks of
UpdatePodSandboxResources. A part whose cgroup controller the host lacks (see
host/cgroups.py) is dropped, as containerd does for hugetlb, or refused with
FAILED_PRECONDITION when the operator asked for that (`missing_cgroup_controller`).

The kubelet's sentinels are accepted: -1 means unlimited for cpu_quota, memory and swap
(it reads them back from a pod cgroup whose memory.max or cpu.max says "max"), and
cgroup v1's "unlimited" memory value is a huge positive number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.cgroups import KNOWN, SWAP, CgroupFacts
from crishim.host.topology import HostTopology

# Policy values of Config.missing_cgroup_controller.
DROP, FAIL = "drop", "fail"


def merge(old: pb.LinuxContainerResources,
          new: pb.LinuxContainerResources) -> pb.LinuxContainerResources:
    """`new` over `old`: set (non-zero) fields replace, unset ones keep the old value."""
    out = pb.LinuxContainerResources()
    out.CopyFrom(old)
    for name in ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes",
                 "memory_swap_limit_in_bytes", "cpuset_cpus", "cpuset_mems"):
        value = getattr(new, name)
        if value:
            setattr(out, name, value)
    if new.hugepage_limits:
        del out.hugepage_limits[:]
        out.hugepage_limits.extend(new.hugepage_limits)
    out.unified.update(new.unified)
    # oom_score_adj is fixed at start: runc update cannot change it, so keep the stored one.
    return out


def _unified_controller(key: str) -> str:
    """The controller a v2 file belongs to ("memory.swap.max" → swap, "io.max" → io)."""
    if key.startswith("memory.swap."):
        return SWAP
    return key.split(".", 1)[0]


@dataclass(frozen=True)
class ResourceMapper:
    """Maps CRI resources to OCI ones for one host (its facts, the operator's policy)."""

    cgroups: CgroupFacts = field(default_factory=CgroupFacts.everything)
    policy: str = DROP  # DROP or FAIL
    # The host's, from HostFacts; empty (the default) checks no cpuset against it.
    topology: HostTopology = field(default_factory=HostTopology)

    def _missing(self, controller: str, what: str, dropped: list[str]) -> None:
        if self.policy == FAIL:
            raise FailedPrecondition(
                f"{what} needs the {controller} cgroup controller, which this node does not "
                f"have (missing: {', '.join(self.cgroups.missing())}); set "
                f"missing_cgroup_controller = \"{DROP}\" to run without such limits")
        dropped.append(controller)

    def linux(self, res: pb.LinuxContainerResources) -> dict[str, Any]:
        """OCI LinuxResources (only the fields that are set), without devices."""
        return self.linux_dropping(res)[0]

    def linux_dropping(self, res: pb.LinuxContainerResources
                       ) -> tuple[dict[str, Any], list[str]]:
        """Like linux(), and the controllers whose parts were dropped."""
        facts = self.cgroups
        dropped: list[str] = []
        out: dict[str, Any] = {}
        cpu: dict[str, Any] = {}
        for src, dst in (("cpu_shares", "shares"), ("cpu_quota", "quota"),
                         ("cpu_period", "period")):
            if value := getattr(res, src):
                cpu[dst] = value
        if cpu and not facts.has("cpu"):
            self._missing("cpu", "a cpu limit", dropped)
            cpu = {}
        if res.cpuset_cpus or res.cpuset_mems:
            if facts.has("cpuset"):
                if res.cpuset_cpus:
                    cpu["cpus"] = res.cpuset_cpus
                if res.cpuset_mems:
                    cpu["mems"] = res.cpuset_mems
            else:
                self._missing("cpuset", "cpuset_cpus/cpuset_mems", dropped)
        if cpu:
            out["cpu"] = cpu
        memory = res.memory_limit_in_bytes
        if memory and not facts.has("memory"):
            self._missing("memory", "a memory limit", dropped)
        elif memory:
            mem: dict[str, Any] = {"limit": memory}
            swap = res.memory_swap_limit_in_bytes
            if facts.swap:
                # memory+swap; unset means no swap beyond the memory limit.
                mem["swap"] = swap or memory
            elif swap > 0 and swap != memory:
                # Only a real extra-swap request matters: "no swap" (= limit) and
                # "unlimited" (-1) are what a host without swap accounting does anyway.
                self._missing(SWAP, "memory_swap_limit_in_bytes", dropped)
            out["memory"] = mem
        if res.hugepage_limits:
            if facts.has("hugetlb"):
                out["hugepageLimits"] = [{"pageSize": h.page_size, "limit": h.limit}
                                         for h in res.hugepage_limits]
            else:
                self._missing("hugetlb", "hugepage_limits", dropped)
        if res.unified:
            if not facts.v2:
                raise InvalidArgument("resources.unified needs cgroup v2; this node runs "
                                      "cgroup v1")
            unified: dict[str, str] = {}
            for key, value in res.unified.items():
                controller = _unified_controller(key)
                if (controller in KNOWN or controller == SWAP) and not facts.has(controller):
                    self._missing(controller, f"unified key {key!r}", dropped)
                else:
                    unified[key] = value
            if unified:
                out["unified"] = unified
        return out, sorted(set(dropped))
