"""Write CRI LinuxContainerResources into an existing cgroup (the pod-level one).

Used by UpdatePodSandboxResources: containers are updated through `runc update`, but the
pod cgroup belongs to no OCI container, so its control files are written directly.
Only fields that are set are written; the cgroup must already exist.
"""

from __future__ import annotations

import asyncio
import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.stats.cgroups import CgroupReader, cgroup_relpath


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares (2..262144) → v2 cpu.weight (1..10000), as runc converts."""
    return 1 + ((shares - 2) * 9999) // 262142


def plan(reader: CgroupReader, path: str,
         res: pb.LinuxContainerResources) -> list[tuple[str, str]]:
    """(file, value) pairs to write, in a safe order."""
    writes: list[tuple[str, str]] = []
    if reader.version == 2:
        if res.cpu_shares:
            writes.append((reader.file("cpu", path, "cpu.weight"),
                           str(shares_to_weight(res.cpu_shares))))
        if res.cpu_quota or res.cpu_period:
            quota = "max" if res.cpu_quota in (0, -1) else str(res.cpu_quota)
            writes.append((reader.file("cpu", path, "cpu.max"),
                           f"{quota} {res.cpu_period or 100000}"))
        if res.memory_limit_in_bytes:
            writes.append((reader.file("memory", path, "memory.max"),
                           str(res.memory_limit_in_bytes)))
    else:
        if res.cpu_shares:
            writes.append((reader.file("cpu", path, "cpu.shares"), str(res.cpu_shares)))
        if res.cpu_period:
            writes.append((reader.file("cpu", path, "cpu.cfs_period_us"), str(res.cpu_period)))
        if res.cpu_quota:
            writes.append((reader.file("cpu", path, "cpu.cfs_quota_us"), str(res.cpu_quota)))
        if res.memory_limit_in_bytes:
            writes.append((reader.file("memory", path, "memory.limit_in_bytes"),
                           str(res.memory_limit_in_bytes)))
    if res.cpuset_cpus:
        writes.append((reader.file("cpuset", path, "cpuset.cpus"), res.cpuset_cpus))
    if res.cpuset_mems:
        writes.append((reader.file("cpuset", path, "cpuset.mems"), res.cpuset_mems))
    for key, value in res.unified.items():
        if "/" in key or key.startswith("."):
            raise InvalidArgument(f"unified key {key!r} is not a cgroup file name")
        writes.append((reader.file("", path, key), value))
    return writes


def _write_all(writes: list[tuple[str, str]]) -> list[str]:
    done: list[str] = []
    for file, value in writes:
        if not os.path.exists(file):
            continue  # controller not mounted/enabled for this cgroup (e.g. no cpuset)
        try:
            with open(file, "w") as fh:
                fh.write(value)
        except OSError as exc:
            raise FailedPrecondition(f"writing {value!r} to {file} failed: {exc.strerror}; "
                                     "the value may be below current usage") from None
        done.append(os.path.basename(file))
    return done


async def apply_pod_resources(reader: CgroupReader, cgroup_parent: str,
                              res: pb.LinuxContainerResources) -> list[str]:
    """Write `res` into the pod cgroup; return the names of the files written."""
    path = cgroup_relpath(cgroup_parent)
    if not reader.exists(path):
        raise FailedPrecondition(f"pod cgroup {cgroup_parent} does not exist")
    return await asyncio.to_thread(_write_all, plan(reader, path, res))
