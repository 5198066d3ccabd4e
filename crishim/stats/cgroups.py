"""Cgroup v1 and v2 statistics behind one interface (`CgroupReader.read`).

Readers are synchronous and cheap (a handful of small sysfs reads per cgroup); callers
that read many cgroups batch them into one `asyncio.to_thread` call.

Paths given to a reader are cgroup paths relative to the hierarchy root, in cgroupfs form
("/kubepods/pod1/abc"). `oci.slices.cgroup_relpath` turns the systemd driver's "slice:prefix:name"
form into that.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Protocol

from crishim.host.cgroups import CgroupFacts, v1_mounts

# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX rounded to pages (~2^63); anything this
# large is treated as unlimited.
_UNLIMITED = 1 << 62

# The v1 controllers we read (and write for pod resource updates).
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
# Read only (per-device I/O counters for the cAdvisor metrics).
_V1_READ_ONLY = ("blkio",)


class CgroupNotFound(Exception):
    """The cgroup does not exist (the container is gone or was never started)."""


@dataclass(frozen=True)
class PsiData:
    total: int  # microseconds stalled
    avg10: float
    avg60: float
    avg300: float


@dataclass(frozen=True)
class Psi:
    some: PsiData | None
    full: PsiData | None


@dataclass(frozen=True)
class CpuStats:
    usage_ns: int
    user_ns: int
    system_ns: int
    periods: int = 0
    throttled_periods: int = 0
    throttled_ns: int = 0
    psi: Psi | None = None


@dataclass(frozen=True)
class MemoryStats:
    usage: int
    working_set: int
    rss: int
    cache: int
    mapped_file: int
    page_faults: int
    major_page_faults: int
    limit: int | None  # None = unlimited
    swap: int = 0
    failcnt: int = 0
    max_usage: int = 0
    psi: Psi | None = None
    # Faults of this cgroup's own tasks (v1 "pgfault"); page_faults is hierarchical.
    own_page_faults: int = 0
    own_major_page_faults: int = 0

    @property
    def available(self) -> int | None:
        """limit - working set, only when the cgroup is limited (kubelet's definition)."""
        if self.limit is None:
            return None
        return max(self.limit - self.working_set, 0)


@dataclass(frozen=True)
class IoDevice:
    """Per block device I/O of a cgroup (v1 blkio.throttle.*_recursive, v2 io.stat)."""

    major: int
    minor: int
    name: str  # "/dev/sda", or "major:minor" when /sys has no name for it
    read_bytes: int = 0
    write_bytes: int = 0
    reads: int = 0
    writes: int = 0


@dataclass(frozen=True)
class ProcessCounts:
    """Threads and open fds of every process in a cgroup (and its children)."""

    threads: int
    fds: int
    sockets: int


@dataclass(frozen=True)
class CgroupStats:
    timestamp_ns: int
    cpu: CpuStats | None
    memory: MemoryStats | None
    pids: int | None
    pids_max: int | None = None
    io_psi: Psi | None = None
    # Only with detail=True (the cAdvisor metrics):
    kernel_memory: int | None = None
    oom_events: int | None = None
    io: tuple[IoDevice, ...] = ()
    processes: ProcessCounts | None = None


class CgroupReader(Protocol):
    version: int

    def read(self, path: str, detail: bool = False) -> CgroupStats:
        """Stats of the cgroup at `path`; raises CgroupNotFound when it does not exist.

        `detail` adds what only the cAdvisor metrics need (user/system split, throttling,
        failcnt, peak, pids.max); CRI stats leave it off to read fewer files per cgroup.
        """
        ...

    def exists(self, path: str) -> bool: ...

    def file(self, controller: str, path: str, name: str) -> str:
        """Host path of one control file, e.g. ("memory", path, "memory.limit_in_bytes")."""
        ...


# -- parsing helpers (pure, unit-tested) -----------------------------------------------------
def parse_flat_keyed(text: str) -> dict[str, int]:
    """'key value' lines (memory.stat, cpu.stat) → dict; non-integer values are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def parse_psi(text: str) -> Psi:
    """'some avg10=0.00 avg60=0.00 avg300=0.00 total=0' (and 'full ...') → Psi."""
    found: dict[str, PsiData] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        try:
            found[parts[0]] = PsiData(total=int(kv.get("total", "0")),
                                      avg10=float(kv.get("avg10", "0")),
                                      avg60=float(kv.get("avg60", "0")),
                                      avg300=float(kv.get("avg300", "0")))
        except ValueError:
            continue
    return Psi(some=found.get("some"), full=found.get("full"))


def _read(path: str) -> str | None:
    # os.open/os.read: about half the cost of open() for small sysfs files, which matters
    # at ~6 files per container per stats call.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # control files are small; one read is the norm
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks).decode("latin-1")
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _working_set(usage: int, inactive_file: int) -> int:
    # cAdvisor/kubelet: working set = usage - inactive file cache, floored at 0.
    return usage - inactive_file if usage > inactive_file else 0


def _clean(path: str) -> str:
    return path.strip("/")


_DEVICE_NAMES: dict[tuple[int, int], str] = {}


def block_device_name(major: int, minor: int, sys_root: str = "/sys") -> str:
    """'/dev/<name>' of a block device (as cAdvisor labels it), else 'major:minor'."""
    key = (major, minor)
    name = _DEVICE_NAMES.get(key)
    if name is None:
        try:
            name = "/dev/" + os.path.basename(os.readlink(
                os.path.join(sys_root, "dev", "block", f"{major}:{minor}")))
        except OSError:
            name = f"{major}:{minor}"
        _DEVICE_NAMES[key] = name
    return name


def parse_v1_blkio(service_bytes: str, serviced: str) -> tuple[IoDevice, ...]:
    """blkio '8:0 Read 4096' lines (bytes and op counts) → one IoDevice per device."""
    acc: dict[tuple[int, int], dict[str, int]] = {}
    for text, suffix in ((service_bytes, "_bytes"), (serviced, "s")):
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 3 or parts[1] not in ("Read", "Write"):
                continue
            major, _, minor = parts[0].partition(":")
            try:
                key, value = (int(major), int(minor)), int(parts[2])
            except ValueError:
                continue
            acc.setdefault(key, {})[parts[1].lower() + suffix] = value
    return tuple(IoDevice(major=k[0], minor=k[1], name=block_device_name(*k),
                          read_bytes=v.get("read_bytes", 0), write_bytes=v.get("write_bytes", 0),
                          reads=v.get("reads", 0), writes=v.get("writes", 0))
                 for k, v in sorted(acc.items()))


def parse_v2_io_stat(text: str) -> tuple[IoDevice, ...]:
    """io.stat '8:0 rbytes=1 wbytes=2 rios=3 wios=4 ...' lines → IoDevices."""
    out: list[IoDevice] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or ":" not in parts[0]:
            continue
        kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        major, _, minor = parts[0].partition(":")
        try:
            out.append(IoDevice(major=int(major), minor=int(minor),
                                name=block_device_name(int(major), int(minor)),
                                read_bytes=int(kv.get("rbytes", 0)),
                                write_bytes=int(kv.get("wbytes", 0)),
                                reads=int(kv.get("rios", 0)), writes=int(kv.get("wios", 0))))
        except ValueError:
            continue
    return tuple(out)


def process_counts(cgroup_dir: str, threads_file: str, proc: str = "/proc") -> ProcessCounts:
    """Threads, open fds and sockets of the processes in `cgroup_dir` and below.

    Threads are the lines of `threads_file` ("tasks" in v1, "cgroup.threads" in v2); fds
    are counted from /proc/<pid>/fd, sockets are the fds linking to "socket:[...]".
    """
    threads = fds = sockets = 0
    for current, _dirs, _files in os.walk(cgroup_dir):
        threads += len((_read(os.path.join(current, threads_file)) or "").split())
        for pid in (_read(os.path.join(current, "cgroup.procs")) or "").split():
            fd_dir = os.path.join(proc, pid, "fd")
            try:
                names = os.listdir(fd_dir)
            except OSError:
                continue  # exited meanwhile
            fds += len(names)
            for name in names:
                try:
                    if os.readlink(os.path.join(fd_dir, name)).startswith("socket:"):
                        sockets += 1
                except OSError:
                    continue
    return ProcessCounts(threads=threads, fds=fds, sockets=sockets)


# -- cgroup v1 ------------------------------------------------------------------------------
def v1_mountpoints(mountinfo: str = "/proc/self/mountinfo") -> dict[str, str]:
    """controller → mount directory for every mounted v1 hierarchy this reader uses."""
    return {c: d for c, d in v1_mounts(_read(mountinfo) or "").items()
            if c in V1_CONTROLLERS or c in _V1_READ_ONLY}


class CgroupV1Reader:
    version = 1

    def __init__(self, mounts: dict[str, str] | None = None) -> None:
        self.mounts = mounts if mounts is not None else v1_mountpoints()

    def _dir(self, controller: str, path: str) -> str | None:
        base = self.mounts.get(controller)
        return os.path.join(base, _clean(path)) if base else None

    def file(self, controller: str, path: str, name: str) -> str:
        d = self._dir(controller, path)
        if d is None:
            raise CgroupNotFound(f"cgroup v1 controller {controller} is not mounted")
        return os.path.join(d, name)

    def exists(self, path: str) -> bool:
        d = self._dir("memory", path) or self._dir("cpuacct", path)
        return d is not None and os.path.isdir(d)

    def read(self, path: str, detail: bool = False) -> CgroupStats:
        now = time.time_ns()
        cpu, memory = self._cpu(path, detail), self._memory(path, detail)
        if cpu is None and memory is None and not self.exists(path):
            raise CgroupNotFound(f"cgroup {path} does not exist")
        out = CgroupStats(timestamp_ns=now, cpu=cpu, memory=memory,
                          pids=self._pid_value(path, "pids.current"),
                          pids_max=self._pid_value(path, "pids.max") if detail else None)
        if not detail:
            return out
        mem = self._dir("memory", path)
        kernel = oom = None
        if mem is not None:
            kernel = _read_int(os.path.join(mem, "memory.kmem.usage_in_bytes"))
            oom = parse_flat_keyed(_read(os.path.join(mem, "memory.oom_control")) or "").get(
                "oom_kill")
        blkio = self._dir("blkio", path)
        io: tuple[IoDevice, ...] = ()
        if blkio is not None:
            io = parse_v1_blkio(
                _read(os.path.join(blkio, "blkio.throttle.io_service_bytes_recursive")) or "",
                _read(os.path.join(blkio, "blkio.throttle.io_serviced_recursive")) or "")
        procs_dir = self._dir("pids", path) or mem
        procs = process_counts(procs_dir, "tasks") if procs_dir else None
        return dataclasses.replace(out, kernel_memory=kernel, oom_events=oom, io=io,
                                   processes=procs)

    def _cpu(self, path: str, detail: bool) -> CpuStats | None:
        acct = self._dir("cpuacct", path)
        if acct is None:
            return None
        usage = _read_int(os.path.join(acct, "cpuacct.usage"))
        if usage is None:
            return None
        if not detail:
            return CpuStats(usage_ns=usage, user_ns=0, system_ns=0)
        # cpuacct.stat is in USER_HZ ticks.
        ticks = parse_flat_keyed(_read(os.path.join(acct, "cpuacct.stat")) or "")
        hz = os.sysconf("SC_CLK_TCK")
        tick_ns = 1_000_000_000 // hz
        throttle: dict[str, int] = {}
        cpu = self._dir("cpu", path)
        if cpu is not None:
            throttle = parse_flat_keyed(_read(os.path.join(cpu, "cpu.stat")) or "")
        return CpuStats(usage_ns=usage, user_ns=ticks.get("user", 0) * tick_ns,
                        system_ns=ticks.get("system", 0) * tick_ns,
                        periods=throttle.get("nr_periods", 0),
                        throttled_periods=throttle.get("nr_throttled", 0),
                        throttled_ns=throttle.get("throttled_time", 0))

    def _memory(self, path: str, detail: bool) -> MemoryStats | None:
        d = self._dir("memory", path)
        if d is None:
            return None
        usage = _read_int(os.path.join(d, "memory.usage_in_bytes"))
        if usage is None:
            return None
        stat = parse_flat_keyed(_read(os.path.join(d, "memory.stat")) or "")
        limit = _read_int(os.path.join(d, "memory.limit_in_bytes"))
        if limit is not None and limit >= _UNLIMITED:
            limit = None
        return MemoryStats(
            usage=usage,
            working_set=_working_set(usage, stat.get("total_inactive_file", 0)),
            rss=stat.get("total_rss", 0), cache=stat.get("total_cache", 0),
            mapped_file=stat.get("total_mapped_file", 0),
            page_faults=stat.get("total_pgfault", 0),
            major_page_faults=stat.get("total_pgmajfault", 0),
            limit=limit, swap=stat.get("total_swap", 0),
            failcnt=(_read_int(os.path.join(d, "memory.failcnt")) or 0) if detail else 0,
            max_usage=(_read_int(os.path.join(d, "memory.max_usage_in_bytes")) or 0)
            if detail else 0,
            own_page_faults=stat.get("pgfault", 0),
            own_major_page_faults=stat.get("pgmajfault", 0))

    def _pid_value(self, path: str, name: str) -> int | None:
        d = self._dir("pids", path)
        return _read_int(os.path.join(d, name)) if d else None


# -- cgroup v2 ------------------------------------------------------------------------------
class CgroupV2Reader:
    version = 2

    def __init__(self, root: str = "/sys/fs/cgroup") -> None:
        self.root = root

    def _dir(self, path: str) -> str:
        return os.path.join(self.root, _clean(path))

    def file(self, controller: str, path: str, name: str) -> str:
        return os.path.join(self._dir(path), name)

    def exists(self, path: str) -> bool:
        return os.path.isfile(os.path.join(self._dir(path), "cgroup.procs"))

    def read(self, path: str, detail: bool = False) -> CgroupStats:
        d = self._dir(path)
        now = time.time_ns()
        cpu, memory = self._cpu(d), self._memory(d, detail)
        if cpu is None and memory is None and not self.exists(path):
            raise CgroupNotFound(f"cgroup {path} does not exist")
        io_psi_text = _read(os.path.join(d, "io.pressure"))
        out = CgroupStats(timestamp_ns=now, cpu=cpu, memory=memory,
                          pids=_read_int(os.path.join(d, "pids.current")),
                          pids_max=_read_int(os.path.join(d, "pids.max")) if detail else None,
                          io_psi=parse_psi(io_psi_text) if io_psi_text else None)
        if not detail:
            return out
        stat = parse_flat_keyed(_read(os.path.join(d, "memory.stat")) or "")
        kernel = stat.get("kernel")
        if kernel is None and "kernel_stack" in stat:  # before Linux 5.18
            kernel = sum(stat.get(k, 0) for k in ("kernel_stack", "pagetables", "percpu",
                                                  "sock", "slab"))
        events = parse_flat_keyed(_read(os.path.join(d, "memory.events")) or "")
        return dataclasses.replace(
            out, kernel_memory=kernel, oom_events=events.get("oom_kill"),
            io=parse_v2_io_stat(_read(os.path.join(d, "io.stat")) or ""),
            processes=process_counts(d, "cgroup.threads"))

    def _cpu(self, d: str) -> CpuStats | None:
        text = _read(os.path.join(d, "cpu.stat"))
        if text is None:
            return None
        stat = parse_flat_keyed(text)
        psi_text = _read(os.path.join(d, "cpu.pressure"))
        return CpuStats(usage_ns=stat.get("usage_usec", 0) * 1000,
                        user_ns=stat.get("user_usec", 0) * 1000,
                        system_ns=stat.get("system_usec", 0) * 1000,
                        periods=stat.get("nr_periods", 0),
                        throttled_periods=stat.get("nr_throttled", 0),
                        throttled_ns=stat.get("throttled_usec", 0) * 1000,
                        psi=parse_psi(psi_text) if psi_text else None)

    def _memory(self, d: str, detail: bool) -> MemoryStats | None:
        usage = _read_int(os.path.join(d, "memory.current"))
        if usage is None:
            return None
        stat = parse_flat_keyed(_read(os.path.join(d, "memory.stat")) or "")
        limit = _read_int(os.path.join(d, "memory.max"))  # "max" → None
        events = parse_flat_keyed((_read(os.path.join(d, "memory.events")) or "")
                                  if detail else "")
        psi_text = _read(os.path.join(d, "memory.pressure"))
        return MemoryStats(
            usage=usage,
            working_set=_working_set(usage, stat.get("inactive_file", 0)),
            rss=stat.get("anon", 0), cache=stat.get("file", 0),
            mapped_file=stat.get("file_mapped", 0),
            page_faults=stat.get("pgfault", 0),
            major_page_faults=stat.get("pgmajfault", 0),
            limit=limit if limit is None or limit < _UNLIMITED else None,
            swap=_read_int(os.path.join(d, "memory.swap.current")) or 0,
            failcnt=events.get("max", 0),
            max_usage=(_read_int(os.path.join(d, "memory.peak")) or 0) if detail else 0,
            psi=parse_psi(psi_text) if psi_text else None,
            own_page_faults=stat.get("pgfault", 0),
            own_major_page_faults=stat.get("pgmajfault", 0))


def reader_for(facts: CgroupFacts, root: str = "/sys/fs/cgroup") -> CgroupReader:
    """The reader for the host's cgroup version (probed once at start)."""
    return CgroupV2Reader(root) if facts.v2 else CgroupV1Reader()

