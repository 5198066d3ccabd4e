"""Shared CNI fixtures for e2e tests: an isolated bridge network per test.

`cni_conf_dir` writes a bridge (+host-local IPAM) + portmap conflist with a bridge name and
subnet unique to the caller, and keeps host-local's dataDir inside `tmpdir`, so a test never
touches the host's default network or /var/lib/cni/networks and can see which IPs are held.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess

IPAM_DIR = "cni-ipam"
CONF_DIR = "cni-conf"


def cni_conf_dir(tmpdir: str, name: str, bridge: str, subnet: str,
                 cni_version: str = "1.0.0", portmap: bool = True) -> str:
    """Write `<tmpdir>/cni-conf/10-<name>.conflist` and return the conf dir."""
    if len(bridge) > 15:
        raise ValueError(f"bridge name {bridge!r} is longer than 15 characters")
    conf_dir = os.path.join(tmpdir, CONF_DIR)
    os.makedirs(conf_dir, exist_ok=True)
    plugins: list[dict[str, object]] = [{
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "dataDir": os.path.join(tmpdir, IPAM_DIR),
            "ranges": [[{"subnet": subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }]
    if portmap:
        plugins.append({"type": "portmap", "capabilities": {"portMappings": True},
                        "snat": True})
    conf = {"cniVersion": cni_version, "name": name, "plugins": plugins}
    path = os.path.join(conf_dir, f"10-{name}.conflist")
    with open(path, "w") as fh:
        json.dump(conf, fh, indent=2)
    return conf_dir


def host_local_ips(tmpdir: str) -> list[str]:
    """IPs host-local currently holds for any network configured under `tmpdir`."""
    root = os.path.join(tmpdir, IPAM_DIR)
    ips: list[str] = []
    if not os.path.isdir(root):
        return ips
    for network in sorted(os.listdir(root)):
        net_dir = os.path.join(root, network)
        if not os.path.isdir(net_dir):
            continue
        for entry in sorted(os.listdir(net_dir)):
            try:
                ipaddress.ip_address(entry)
            except ValueError:
                continue  # lock and last_reserved_ip.* files
            ips.append(entry)
    return ips


def remove_bridge(bridge: str) -> None:
    """Delete the test's bridge (CNI DEL leaves it behind by design)."""
    subprocess.run(["ip", "link", "del", bridge], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# One CNI network per test module (and per kubelet version), allocated here so that no
# two share a bridge or a subnet: modules of one run can run side by side, and another
# run (another pid) gets other ones. Subnets are 10.<230 + index>.<run>.0/24, a range no
# other test uses (test_network_cni: 10.20-219, durability: 10.180-199, pods: 172.x).
NETWORKS = ("cdi", "userns", "stats", "critest", "lifecycle", "streaming", "stall",
            "kubelet-1.32", "kubelet-1.36", "private", "mountopts", "checkpoint",
            "splitfs", "kubelet-split", "advisories-host", "shared", "advisories-exec",
            "tracing", "kubelet-tracing", "advisories-identity", "checkpoint-criu", "quota")


def module_network(key: str, run: int | None = None) -> tuple[str, str]:
    """(bridge, subnet) of test module `key` (one of NETWORKS) in this run."""
    index = NETWORKS.index(key)  # ValueError: add the module to NETWORKS
    run = os.getpid() % 250 if run is None else run
    return f"crm{index}x{run}", f"10.{230 + index}.{run}.0/24"

