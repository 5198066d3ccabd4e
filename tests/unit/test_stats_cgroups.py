"""Cgroup readers: v2 and v1 on fixture trees, v1 live on this host, systemd names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crishim.host.cgroups import probe
from crishim.oci.slices import cgroup_relpath
from crishim.stats.cgroups import (
    CgroupNotFound,
    CgroupV1Reader,
    CgroupV2Reader,
    parse_psi,
    process_counts,
    reader_for,
    v1_mountpoints,
)
from tests.fakes.cgroups import v2_tree, write


def test_v2_reads_fixture_tree(tmp_path: Path) -> None:
    v2_tree(tmp_path, "/kubepods/pod1/c1")
    s = CgroupV2Reader(str(tmp_path)).read("/kubepods/pod1/c1", detail=True)
    assert s.cpu is not None and s.memory is not None
    assert s.cpu.usage_ns == 2_500_000_000
    assert (s.cpu.user_ns, s.cpu.system_ns) == (2_000_000_000, 500_000_000)
    assert (s.cpu.periods, s.cpu.throttled_periods, s.cpu.throttled_ns) == (10, 3, 1_500_000_000)
    assert s.cpu.psi is not None and s.cpu.psi.some is not None
    assert s.cpu.psi.some.total == 4242 and s.cpu.psi.some.avg10 == 1.5
    m = s.memory
    assert m.usage == 73400320
    assert m.working_set == 73400320 - 8388608  # usage - inactive_file
    assert m.rss == 52428800 and m.cache == 20971520 and m.mapped_file == 4096
    assert (m.page_faults, m.major_page_faults) == (12345, 7)
    assert m.limit == 104857600
    assert m.available == 104857600 - m.working_set
    assert m.failcnt == 4
    assert s.pids == 3 and s.pids_max is None


def test_v2_unlimited_memory_has_no_available(tmp_path: Path) -> None:
    v2_tree(tmp_path, "a", memory_max="max")
    m = CgroupV2Reader(str(tmp_path)).read("/a").memory
    assert m is not None and m.limit is None and m.available is None


def test_v2_working_set_never_negative(tmp_path: Path) -> None:
    v2_tree(tmp_path, "a")
    write(tmp_path / "a" / "memory.current", "1000\n")
    m = CgroupV2Reader(str(tmp_path)).read("a").memory
    assert m is not None and m.working_set == 0


def test_v2_missing_cgroup_raises(tmp_path: Path) -> None:
    with pytest.raises(CgroupNotFound):
        CgroupV2Reader(str(tmp_path)).read("/gone")


def test_v1_reads_fixture_tree(tmp_path: Path) -> None:
    mounts = {c: str(tmp_path / c) for c in ("cpu", "cpuacct", "memory", "pids")}
    rel = "kubepods/pod1/c1"
    write(tmp_path / "cpuacct" / rel / "cpuacct.usage", "3000000000\n")
    write(tmp_path / "cpuacct" / rel / "cpuacct.stat", "user 200\nsystem 100\n")
    write(tmp_path / "cpu" / rel / "cpu.stat", "nr_periods 5\nnr_throttled 2\n"
          "throttled_time 7000\n")
    write(tmp_path / "memory" / rel / "memory.usage_in_bytes", "60000000\n")
    write(tmp_path / "memory" / rel / "memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path / "memory" / rel / "memory.failcnt", "0\n")
    write(tmp_path / "memory" / rel / "memory.stat",
          "inactive_file 1\nrss 2\ntotal_inactive_file 10000000\ntotal_rss 40000000\n"
          "total_cache 20000000\ntotal_mapped_file 100\ntotal_pgfault 55\n"
          "total_pgmajfault 5\nhierarchical_memory_limit 9223372036854771712\n")
    write(tmp_path / "pids" / rel / "pids.current", "2\n")
    write(tmp_path / "pids" / rel / "pids.max", "100\n")
    s = CgroupV1Reader(mounts).read("/" + rel, detail=True)
    assert s.cpu is not None and s.memory is not None
    assert s.cpu.usage_ns == 3_000_000_000
    hz = os.sysconf("SC_CLK_TCK")
    assert s.cpu.user_ns == 200 * (1_000_000_000 // hz)
    assert (s.cpu.periods, s.cpu.throttled_periods, s.cpu.throttled_ns) == (5, 2, 7000)
    # Hierarchical (total_*) counters, not the cgroup-local ones.
    assert s.memory.working_set == 50_000_000
    assert s.memory.rss == 40_000_000
    assert (s.memory.page_faults, s.memory.major_page_faults) == (55, 5)
    assert s.memory.limit is None and s.memory.available is None
    assert s.pids == 2 and s.pids_max == 100
    # Without detail only what CRI stats report is read.
    brief = CgroupV1Reader(mounts).read("/" + rel)
    assert brief.cpu is not None and brief.memory is not None
    assert brief.cpu.usage_ns == 3_000_000_000 and brief.cpu.user_ns == 0
    assert brief.memory.working_set == 50_000_000 and brief.pids_max is None


def test_v1_mountpoints_from_mountinfo(tmp_path: Path) -> None:
    mi = tmp_path / "mountinfo"
    mi.write_text(
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    m = v1_mountpoints(str(mi))
    assert m == {"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
                 "cpuset": "/sys/fs/cgroup/cpuset", "memory": "/sys/fs/cgroup/memory"}


def _own_v1_cgroup(controller: str) -> str | None:
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(","):
                return path
    return None


@pytest.mark.skipif(os.path.isfile("/sys/fs/cgroup/cgroup.controllers")
                    or not os.path.isdir("/sys/fs/cgroup/memory"),
                    reason="host does not run cgroup v1")
def test_v1_live_root_cgroup() -> None:
    """The host's v1 hierarchy root is readable and self-consistent."""
    reader = reader_for(probe())
    assert reader.version == 1
    s = reader.read("/")
    assert s.cpu is not None and s.cpu.usage_ns > 0
    assert s.memory is not None and s.memory.usage > 0
    assert 0 < s.memory.working_set <= s.memory.usage


def test_psi_parse_without_full() -> None:
    p = parse_psi("some avg10=0.10 avg60=0.20 avg300=0.30 total=99\n")
    assert p.full is None and p.some is not None and p.some.avg300 == 0.3


@pytest.mark.parametrize(("given", "want"), [
    ("/kubepods/besteffort/pod1/abc", "/kubepods/besteffort/pod1/abc"),
    ("kubepods/pod1", "/kubepods/pod1"),
    ("kubepods-besteffort-pod1.slice:crishim:abc",
     "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/crishim-abc.scope"),
    ("system.slice:crishim:abc", "/system.slice/crishim-abc.scope"),
    ("kubepods.slice:crishim:kubepods-pod2.slice", "/kubepods.slice/kubepods-pod2.slice"),
    ("kubepods-pod2.slice", "/kubepods.slice/kubepods-pod2.slice"),
])
def test_cgroup_relpath(given: str, want: str) -> None:
    assert cgroup_relpath(given) == want


def test_v2_detail_reads_kernel_oom_io_and_processes(tmp_path: Path) -> None:
    v2_tree(tmp_path, "/pod/c1")
    d = tmp_path / "pod" / "c1"
    write(d / "io.stat", "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n")
    write(d / "cgroup.procs", f"{os.getpid()}\n")
    write(d / "cgroup.threads", f"{os.getpid()}\n999999\n")
    s = CgroupV2Reader(str(tmp_path)).read("/pod/c1", detail=True)
    assert s.kernel_memory == 1048576 and s.oom_events == 1
    assert len(s.io) == 1
    io = s.io[0]
    assert (io.major, io.minor, io.read_bytes, io.write_bytes, io.reads, io.writes) == (
        8, 0, 4096, 8192, 1, 2)
    assert s.processes is not None and s.processes.threads == 2
    assert s.processes.fds == len(os.listdir(f"/proc/{os.getpid()}/fd"))
    # CRI stats (no detail) skip all of that.
    brief = CgroupV2Reader(str(tmp_path)).read("/pod/c1")
    assert brief.processes is None and brief.io == () and brief.oom_events is None


def test_v1_detail_reads_blkio_oom_kmem(tmp_path: Path) -> None:
    mounts = {c: str(tmp_path / c) for c in ("cpuacct", "memory", "pids", "blkio")}
    rel = "kubepods/pod1/c1"
    write(tmp_path / "cpuacct" / rel / "cpuacct.usage", "1\n")
    write(tmp_path / "memory" / rel / "memory.usage_in_bytes", "100\n")
    write(tmp_path / "memory" / rel / "memory.stat", "pgfault 3\npgmajfault 1\n"
          "total_pgfault 30\ntotal_pgmajfault 10\n")
    write(tmp_path / "memory" / rel / "memory.kmem.usage_in_bytes", "65536\n")
    write(tmp_path / "memory" / rel / "memory.oom_control",
          "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    write(tmp_path / "blkio" / rel / "blkio.throttle.io_service_bytes_recursive",
          "253:0 Read 512\n253:0 Write 1024\n253:0 Sync 1536\n253:0 Total 1536\nTotal 1536\n")
    write(tmp_path / "blkio" / rel / "blkio.throttle.io_serviced_recursive",
          "253:0 Read 1\n253:0 Write 3\nTotal 4\n")
    write(tmp_path / "pids" / rel / "cgroup.procs", f"{os.getpid()}\n")
    write(tmp_path / "pids" / rel / "tasks", f"{os.getpid()}\n")
    s = CgroupV1Reader(mounts).read("/" + rel, detail=True)
    assert s.kernel_memory == 65536 and s.oom_events == 2
    assert s.memory is not None
    assert (s.memory.own_page_faults, s.memory.page_faults) == (3, 30)
    assert [(d.major, d.minor, d.read_bytes, d.write_bytes, d.reads, d.writes)
            for d in s.io] == [(253, 0, 512, 1024, 1, 3)]
    assert s.processes is not None and s.processes.threads == 1 and s.processes.fds > 0


def test_process_counts_sees_sockets_of_member_processes(tmp_path: Path) -> None:
    import socket

    write(tmp_path / "cgroup.procs", f"{os.getpid()}\n")
    write(tmp_path / "child" / "cgroup.procs", "")  # children are walked too
    write(tmp_path / "child" / "tasks", f"{os.getpid()}\n")
    before = process_counts(str(tmp_path), "tasks")
    with socket.socket() as s1, socket.socket() as s2:
        after = process_counts(str(tmp_path), "tasks")
        assert s1.fileno() != s2.fileno()
    assert after.sockets == before.sockets + 2
    assert after.fds == before.fds + 2
    assert after.threads == 1
