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

import re
from dataclasses import dataclass, field
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.cgroups import KNOWN, SWAP, CgroupFacts
from crishim.host.topology import HostTopology, parse_cpu_list

_CPUSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_PAGE_SIZE = re.compile(r"^\d+(KB|MB|GB|TB|PB)$")
# Kernel bounds (cgroup v1 cpu controller): CFS period 1 ms..1 s, quota ≥ 1 ms, shares 2..2^18.
MIN_PERIOD, MAX_PERIOD, MIN_QUOTA = 1000, 1_000_000, 1000
MIN_SHARES, MAX_SHARES = 2, 262144
# Below this the container cannot even start its init; the kernel accepts it but OOMs.
MIN_MEMORY = 6 * 1024 * 1024
UNLIMITED = -1

# Policy values of Config.missing_cgroup_controller.
DROP, FAIL = "drop", "fail"


def _check_cpuset(name: str, value: str, known: frozenset[int], what: str) -> None:
    if not _CPUSET.match(value):
        raise InvalidArgument(f"{name} {value!r} is not a list like '0-2,4'")
    try:
        wanted = parse_cpu_list(value)
    except ValueError as exc:
        raise InvalidArgument(f"{name} {value!r}: {exc}") from None
    if known and not wanted <= known:
        raise InvalidArgument(f"{name} {value!r} names {what} this host does not have "
                              f"(it has {_show_list(known)})")


def _show_list(ids: frozenset[int]) -> str:
    runs: list[str] = []
    for i in sorted(ids):
        if runs and runs[-1].rpartition("-")[2] == str(i - 1):
            runs[-1] = f"{runs[-1].partition('-')[0]}-{i}"
        else:
            runs.append(str(i))
    return ",".join(runs)


def validate(res: pb.LinuxContainerResources, cgroup_v2: bool,
             topology: HostTopology | None = None) -> None:
    """Raise InvalidArgument with the offending field for values the kernel or runc would
    refuse (the same rules at create, at update and for a pod's resources)."""
    if res.cpu_period and not MIN_PERIOD <= res.cpu_period <= MAX_PERIOD:
        raise InvalidArgument(f"cpu_period {res.cpu_period} must be between {MIN_PERIOD} and "
                              f"{MAX_PERIOD} microseconds")
    if res.cpu_quota and res.cpu_quota != UNLIMITED and res.cpu_quota < MIN_QUOTA:
        raise InvalidArgument(f"cpu_quota {res.cpu_quota} must be -1 (unlimited) or at least "
                              f"{MIN_QUOTA} microseconds")
    if res.cpu_shares and not MIN_SHARES <= res.cpu_shares <= MAX_SHARES:
        raise InvalidArgument(f"cpu_shares {res.cpu_shares} must be between {MIN_SHARES} and "
                              f"{MAX_SHARES}")
    memory = res.memory_limit_in_bytes
    if memory < UNLIMITED:
        raise InvalidArgument(f"memory_limit_in_bytes {memory} must be -1 (unlimited) or "
                              "positive")
    if 0 < memory < MIN_MEMORY:
        raise InvalidArgument(f"memory_limit_in_bytes {memory} is below the minimum of "
                              f"{MIN_MEMORY} bytes")
    if res.memory_swap_limit_in_bytes and 0 < res.memory_swap_limit_in_bytes < MIN_MEMORY:
        raise InvalidArgument(f"memory_swap_limit_in_bytes {res.memory_swap_limit_in_bytes}"
                              f" is below the minimum of {MIN_MEMORY} bytes")
    swap = res.memory_swap_limit_in_bytes
    if swap < UNLIMITED:
        raise InvalidArgument(f"memory_swap_limit_in_bytes {swap} must be -1 or positive")
    if swap > 0 and memory > 0 and swap < memory:
        raise InvalidArgument(f"memory_swap_limit_in_bytes {swap} (memory+swap) is below "
                              f"memory_limit_in_bytes {memory}")
    topo = topology or HostTopology()
    if res.cpuset_cpus:
        _check_cpuset("cpuset_cpus", res.cpuset_cpus, topo.cpus, "CPUs")
    if res.cpuset_mems:
        _check_cpuset("cpuset_mems", res.cpuset_mems, topo.mems, "memory nodes")
    sizes = set()
    for h in res.hugepage_limits:
        if not _PAGE_SIZE.match(h.page_size):
            raise InvalidArgument(f"hugepage_limits page_size {h.page_size!r} must look like "
                                  "'2MB'")
        if h.page_size in sizes:
            raise InvalidArgument(f"hugepage_limits names page_size {h.page_size!r} twice")
        sizes.add(h.page_size)
    if res.unified and not cgroup_v2:
        raise InvalidArgument("resources.unified needs cgroup v2; this node runs cgroup v1")
    for key, value in res.unified.items():
        if "/" in key or key.startswith(".") or "." not in key or "\0" in key:
            raise InvalidArgument(f"unified key {key!r} is not a cgroup file name")
        if "\0" in value or "\n" in value.rstrip("\n"):
            raise InvalidArgument(f"unified[{key!r}] value {value!r} must be one line")
    if not -1000 <= res.oom_score_adj <= 1000:
        raise InvalidArgument(f"oom_score_adj {res.oom_score_adj} must be in -1000..1000")


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

    def validate(self, res: pb.LinuxContainerResources) -> None:
        """`validate` against this host's cgroup version, CPUs and memory nodes."""
        validate(res, self.cgroups.v2, self.topology)

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
