"""Read the IPs out of a CNI result (0.4.0 and 1.x shapes)."""

from __future__ import annotations

import ipaddress
from typing import Any

from crishim.network.types import NetworkResult


def parse_result(raw: dict[str, Any], ifname: str = "eth0") -> NetworkResult:
    """IPs of the pod's interface `ifname`, IPv4 first. IPs whose "interface" index points
    elsewhere (e.g. the host-side veth) are skipped; IPs without an index count as the pod's."""
    interfaces = [i for i in raw.get("interfaces") or [] if isinstance(i, dict)]
    v4: list[str] = []
    v6: list[str] = []
    for entry in raw.get("ips") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("address"), str):
            continue
        idx = entry.get("interface")
        if isinstance(idx, int) and 0 <= idx < len(interfaces):
            iface = interfaces[idx]
            if iface.get("name") != ifname or not iface.get("sandbox"):
                continue
        try:
            addr = ipaddress.ip_interface(entry["address"]).ip
        except ValueError:
            continue
        (v4 if addr.version == 4 else v6).append(str(addr))
    return NetworkResult(ips=v4 + v6, interfaces=interfaces, raw=raw)
