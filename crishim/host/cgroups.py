"""Which cgroup controllers this host really has, probed once at start.

A controller can be compiled into the kernel (listed in /proc/cgroups) and still be
unusable: on a cgroup v1 host it must be mounted as a hierarchy, on a v2 host it must be
in the root's `cgroup.controllers`. Swap limits need swap accounting on top of the memory
controller (`memory.memsw.*` on v1, `memory.swap.*` on v2). A resource for a missing
controller makes runc fail the whole container ("cannot set hugetlb limit"), so the
resource mapping drops it (or refuses it, see `Config.missing_cgroup_controller`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Controllers whose OCI resources crishim may emit. v1 calls the block I/O one "blkio",
# v2 calls it "io"; both are reported under the name the host uses.
KNOWN = ("cpu", "cpuset", "memory", "hugetlb", "pids", "blkio", "io", "rdma", "misc")
# Not a controller: the ability to limit swap (memory+swap on v1, swap on v2).
SWAP = "swap"


@dataclass(frozen=True)
class CgroupFacts:
    version: int  # 1 (legacy or hybrid: runc uses the v1 hierarchies) or 2 (unified)
    controllers: frozenset[str]  # usable controllers, plus SWAP when swap can be limited

    @property
    def v2(self) -> bool:
        return self.version == 2

    def has(self, controller: str) -> bool:
        return controller in self.controllers

    @property
    def swap(self) -> bool:
        return SWAP in self.controllers

    def missing(self) -> list[str]:
        """The known controllers (and swap) this host lacks, for the log and Status."""
        block = "io" if self.v2 else "blkio"
        wanted = [c for c in KNOWN if c not in ("io", "blkio")] + [block, SWAP]
        return sorted(c for c in wanted if c not in self.controllers)

    @classmethod
    def everything(cls, version: int = 1) -> CgroupFacts:
        """A host with every controller: the default where nothing was probed (tests)."""
        block = "io" if version == 2 else "blkio"
        names = {c for c in KNOWN if c not in ("io", "blkio")} | {block, SWAP}
        return cls(version, frozenset(names))


def v1_mounts(mountinfo: str) -> dict[str, str]:
    """Controller → mount point of each cgroup v1 hierarchy, from /proc/self/mountinfo."""
    found: dict[str, str] = {}
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        fields = post.split()
        pre_fields = pre.split()
        if not sep or len(fields) < 3 or fields[0] != "cgroup" or len(pre_fields) < 5:
            continue
        # Super options, e.g. "rw,cpu,cpuacct" or "rw,name=systemd".
        for opt in fields[2].split(","):
            if "=" not in opt:
                found.setdefault(opt, pre_fields[4])
    return found


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _v2_swap(root: str) -> bool:
    """memory.swap.max exists in non-root cgroups when swap accounting is on."""
    try:
        children = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    if not children:  # nothing to look at: trust the memory controller
        return True
    return any(_exists(os.path.join(c, "memory.swap.max")) for c in children)


def probe(root: str = "/sys/fs/cgroup", mountinfo_path: str = "/proc/self/mountinfo"
          ) -> CgroupFacts:
    """Blocking: read the cgroup mounts under `root` (call it off the event loop)."""
    controllers_file = os.path.join(root, "cgroup.controllers")
    if os.path.isfile(controllers_file):
        with open(controllers_file) as fh:
            names = set(fh.read().split())
        # cpu/cpuset/memory etc. as listed; freezer and devices are not controllers on v2.
        have = names & set(KNOWN)
        if "memory" in have and _v2_swap(root):
            have.add(SWAP)
        return CgroupFacts(2, frozenset(have))
    try:
        with open(mountinfo_path) as fh:
            mounts = v1_mounts(fh.read())
    except OSError:
        mounts = {}
    have = set(mounts) & set(KNOWN)
    # The memory hierarchy has memory.memsw.* only with swap accounting.
    if "memory" in have and _exists(os.path.join(mounts["memory"],
                                                 "memory.memsw.limit_in_bytes")):
        have.add(SWAP)
    return CgroupFacts(1, frozenset(have))
