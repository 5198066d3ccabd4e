"""Facts about the node that change how containers are made, probed once at start."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

from crishim.config import Config
from crishim.host import cgroups
from crishim.host.cgroups import CgroupFacts
from crishim.host.topology import HostTopology


def kernel_supports_rro(release: str | None = None) -> bool:
    """mount_setattr(2) with AT_RECURSIVE (what runc's "rro" uses) arrived in Linux 5.12."""
    parts = (release or platform.release()).split(".")
    try:
        major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return False
    return (major, minor) >= (5, 12)


def hybrid_v2_controllers(root: str = "/sys/fs/cgroup") -> frozenset[str]:
    """The controllers of a cgroup2 hierarchy mounted at <root>/unified beside v1 ones
    (a "hybrid" host); empty on a unified (v2) or pure v1 host. crun refuses to make a
    container's cgroups when this is not empty. Blocking (two small reads)."""
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        return frozenset()  # unified: <root> itself is the cgroup2 mount
    try:
        with open(os.path.join(root, "unified", "cgroup.controllers")) as fh:
            return frozenset(fh.read().split())
    except OSError:
        return frozenset()


def oom_score_adj_floor() -> int:
    """The lowest oom_score_adj this process (and so runc, its child) may set. Blocking;
    probed once, by probe() (it changes our own score briefly, so never run two at once).

    Without CAP_SYS_RESOURCE the kernel refuses values below the process's inherited
    minimum (often its own score); runc then fails with "failed to update
    /proc/self/oom_score_adj: Permission denied". Detect it instead of assuming: probe
    by writing to our own oom_score_adj (binary search, ~10 writes) and restore the
    original value.
    """
    path = "/proc/self/oom_score_adj"
    try:
        with open(path) as fh:
            current = int(fh.read().strip())
    except (OSError, ValueError):
        return -1000

    def allowed(value: int) -> bool:
        try:
            with open(path, "w") as fh:
                fh.write(str(value))
            return True
        except OSError:
            return False

    try:
        if allowed(-1000):
            return -1000
        low, high = -1000, current  # -1000 refused; our current value is allowed
        while high - low > 1:
            mid = (low + high) // 2
            if allowed(mid):
                high = mid
            else:
                low = mid
        return high
    finally:
        allowed(current)  # raising back is always permitted


@dataclass(frozen=True)
class HostFacts:
    cgroups: CgroupFacts = field(default_factory=CgroupFacts.everything)
    cgroup_driver: str = "cgroupfs"
    rro: bool = True  # recursive read-only mounts (kernel >= 5.12)
    oom_score_adj_floor: int = 0
    # Controllers of the cgroup2 mount beside the v1 ones (see hybrid_v2_controllers).
    hybrid_v2_controllers: frozenset[str] = frozenset()
    # CPUs and memory nodes a cpuset may name (empty: not checked).
    topology: HostTopology = field(default_factory=HostTopology)


def probe(cfg: Config) -> HostFacts:
    """Blocking (file reads, one oom_score_adj probe): call it off the event loop."""
    return HostFacts(
        cgroups=cgroups.probe(),
        cgroup_driver=cfg.effective_cgroup_driver(),
        rro=kernel_supports_rro(),
        oom_score_adj_floor=oom_score_adj_floor(),
        hybrid_v2_controllers=hybrid_v2_controllers(),
        topology=HostTopology.probe())
