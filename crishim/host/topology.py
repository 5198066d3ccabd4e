"""The CPUs and memory nodes of this host, which a container's cpuset may name."""

from __future__ import annotations

from dataclasses import dataclass


def parse_cpu_list(text: str) -> frozenset[int]:
    """'0-3,6' → {0, 1, 2, 3, 6}; ValueError for anything else."""
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"range {part!r} is reversed")
        out.update(range(first, last + 1))
    return frozenset(out)


def _read_list(path: str, fallback: frozenset[int]) -> frozenset[int]:
    try:
        with open(path) as fh:
            return parse_cpu_list(fh.read())
    except (OSError, ValueError):
        return fallback


@dataclass(frozen=True)
class HostTopology:
    """The CPUs and memory nodes a cpuset may name (empty: not known, not checked)."""

    cpus: frozenset[int] = frozenset()
    mems: frozenset[int] = frozenset()

    @classmethod
    def probe(cls) -> HostTopology:
        """Two small sysfs reads, once at start (host/facts.py), never per request."""
        return cls(_read_list("/sys/devices/system/cpu/online", frozenset()),
                   _read_list("/sys/devices/system/node/online", frozenset({0})))
