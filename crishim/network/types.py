"""What a pod asks of the network, and what it got: the sandbox <-> network contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PortMapping:
    container_port: int
    host_port: int
    protocol: str = "tcp"  # "tcp", "udp" or "sctp"
    host_ip: str = ""


@dataclass
class Bandwidth:
    """Traffic shaping in bits per second; None = unlimited."""

    ingress_bps: int | None = None
    egress_bps: int | None = None


@dataclass
class DNS:
    servers: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)


@dataclass
class PodNetwork:
    name: str
    namespace: str
    uid: str
    port_mappings: list[PortMapping] = field(default_factory=list)
    bandwidth: Bandwidth | None = None
    dns: DNS | None = None
    cgroup_parent: str = ""
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class NetworkResult:
    ips: list[str]  # primary first: IPv4 ones, then IPv6, without prefix length
    interfaces: list[dict[str, Any]]
    raw: dict[str, Any]  # the final CNI result of the chain
