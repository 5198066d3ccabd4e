"""Process discovery and memory accounting from /proc (RSS and PSS)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Mem:
    rss: int = 0  # bytes
    pss: int = 0  # bytes
    count: int = 0

    def __add__(self, other: Mem) -> Mem:
        return Mem(self.rss + other.rss, self.pss + other.pss, self.count + other.count)


def _kib_field(path: str, name: str) -> int:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def mem_of(pid: int) -> Mem:
    """VmRSS from status and Pss from smaps_rollup; zeros if the process is gone."""
    rss = _kib_field(f"/proc/{pid}/status", "VmRSS")
    pss = _kib_field(f"/proc/{pid}/smaps_rollup", "Pss")
    return Mem(rss, pss, 1 if rss else 0)


def mem_sum(pids: list[int]) -> Mem:
    total = Mem()
    for pid in pids:
        total = total + mem_of(pid)
    return total


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def find(exe: str, marker: str) -> list[int]:
    """PIDs whose executable is named `exe` and whose command line mentions `marker`.

    The marker is a path only our instance uses (its socket or temp dir), so processes of
    other runtimes on the machine are never counted or killed.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if exe_name(pid) != exe:
            continue
        if any(marker in arg for arg in cmdline(pid)):
            found.append(pid)
    # A monitor's short-lived fork (before it execs runc) looks like a second monitor.
    pids = set(found)
    return [pid for pid in found if ppid(pid) not in pids]


def ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            # comm may hold spaces and parens: the fields after the last ")" are fixed.
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
