"""The resource ranges of a request, the same rules for a container (at create and at
update), a pod (its resources and overhead) and an NRI plugin's adjustment: values the
kernel or runc would refuse are INVALID_ARGUMENT naming the field, before any side
effect. The mapping they protect is `crishim.oci.resources`."""

from __future__ import annotations

import re

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.host.topology import HostTopology, parse_cpu_list
from crishim.oci.resources import ResourceMapper

_CPUSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_PAGE_SIZE = re.compile(r"^\d+(KB|MB|GB|TB|PB)$")
# Kernel bounds (cgroup v1 cpu controller): CFS period 1 ms..1 s, quota ≥ 1 ms, shares 2..2^18.
MIN_PERIOD, MAX_PERIOD, MIN_QUOTA = 1000, 1_000_000, 1000
MIN_SHARES, MAX_SHARES = 2, 262144
# Below this the container cannot even start its init; the kernel accepts it but OOMs.
MIN_MEMORY = 6 * 1024 * 1024
# The kubelet's "unlimited" for cpu_quota, memory and swap.
UNLIMITED = -1


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


def check(res: pb.LinuxContainerResources, cgroup_v2: bool,
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


def check_for(mapper: ResourceMapper, res: pb.LinuxContainerResources) -> None:
    """`check` against the host `mapper` maps for: its cgroup version, CPUs and memory
    nodes."""
    check(res, mapper.cgroups.v2, mapper.topology)
