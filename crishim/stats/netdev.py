"""Pod network counters from /proc/<pid>/net/dev.

Any process inside the pod's network namespace (the pause process) exposes that
namespace's interface counters there, so no setns is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kubelet treats eth0 as the pod's default interface.
DEFAULT_INTERFACE = "eth0"


@dataclass(frozen=True)
class InterfaceStats:
    name: str
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


def parse_net_dev(text: str, include_lo: bool = False) -> list[InterfaceStats]:
    out: list[InterfaceStats] = []
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or "|" in line:
            continue
        name = name.strip()
        if name == "lo" and not include_lo:
            continue
        cols = rest.split()
        if len(cols) < 16:
            continue
        try:
            v = [int(c) for c in cols[:16]]
        except ValueError:
            continue
        out.append(InterfaceStats(name=name, rx_bytes=v[0], rx_packets=v[1], rx_errors=v[2],
                                  rx_dropped=v[3], tx_bytes=v[8], tx_packets=v[9],
                                  tx_errors=v[10], tx_dropped=v[11]))
    return out


def read_pid_net_dev(pid: int, proc: str = "/proc") -> list[InterfaceStats] | None:
    """Interfaces of the netns `pid` lives in; None when the process is gone."""
    if pid <= 0:
        return None
    try:
        with open(f"{proc}/{pid}/net/dev") as fh:
            return parse_net_dev(fh.read())
    except OSError:
        return None


def default_interface(ifaces: list[InterfaceStats]) -> InterfaceStats | None:
    for i in ifaces:
        if i.name == DEFAULT_INTERFACE:
            return i
    return ifaces[0] if ifaces else None
