"""The cgroup filesystem faked: cgroup trees of plain files under a temporary root."""

from __future__ import annotations

from pathlib import Path

V2_MEMORY_STAT = """anon 52428800
file 20971520
kernel 1048576
file_mapped 4096
inactive_file 8388608
active_file 12582912
pgfault 12345
pgmajfault 7
"""


def write(path: Path, text: str) -> None:
    """A file at `path` holding `text`, its directories made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(root: Path, rel: str, memory_max: str = "104857600") -> None:
    """A cgroup v2 directory `rel` under `root` with the files the stats readers read."""
    d = root / rel.strip("/")
    write(d / "cgroup.procs", "1\n")
    write(d / "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
          "nr_periods 10\nnr_throttled 3\nthrottled_usec 1500000\n")
    write(d / "cpu.pressure", "some avg10=1.50 avg60=0.20 avg300=0.00 total=4242\n"
          "full avg10=0.00 avg60=0.00 avg300=0.00 total=100\n")
    write(d / "memory.current", "73400320\n")
    write(d / "memory.max", memory_max + "\n")
    write(d / "memory.stat", V2_MEMORY_STAT)
    write(d / "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    write(d / "memory.swap.current", "0\n")
    write(d / "pids.current", "3\n")
    write(d / "pids.max", "max\n")
