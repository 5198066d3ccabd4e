"""Per-pod files shared by every container of the pod: hosts, resolv.conf, hostname, shm.

All functions here block (file writes, mount): call them through asyncio.to_thread.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Sequence

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host import libc, modes, remove
from crishim.host.mount import detach, is_mountpoint
from crishim.log import get_logger

log = get_logger(__name__)

HOST_RESOLV_CONF = "/etc/resolv.conf"
HOST_HOSTS = "/etc/hosts"

# What containerd writes for a pod with its own network namespace.
_LOCAL_HOSTS = """127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::0\tip6-mcastprefix
fe00::1\tip6-allnodes
fe00::2\tip6-allrouters
"""


# Bind-mounted into the containers, whose users need not be root: readable by all there
# (on the host the pod's dir keeps others out).
def _write_atomic(path: str, text: str, mode: int = 0o644,
                  owner: tuple[int, int] | None = None) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)


def pod_hostname(config: pb.PodSandboxConfig, host_network: bool) -> str:
    if config.hostname:
        return config.hostname
    if host_network:
        return socket.gethostname()
    return config.metadata.name[:63]


def hosts_content(hostname: str, ips: list[str], host_network: bool,
                  host_hosts: str = HOST_HOSTS) -> str:
    """Host-network pods see the node's /etc/hosts; others localhost + their own name."""
    if host_network:
        try:
            with open(host_hosts) as fh:
                return fh.read()
        except OSError:
            return _LOCAL_HOSTS
    lines = [_LOCAL_HOSTS]
    for ip in ips:
        lines.append(f"{ip}\t{hostname}\n")
    return "".join(lines)


def _is_local_resolver(value: str) -> bool:
    try:
        return ipaddress.ip_address(value.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolv_conf_content(dns: pb.DNSConfig | None, host_network: bool,
                        host_resolv: str = HOST_RESOLV_CONF) -> str:
    """From dns_config when given; else the node's resolv.conf. A pod with its own netns
    cannot reach a resolver on the node's loopback (e.g. systemd-resolved's 127.0.0.53),
    so those nameserver lines are dropped (as Docker/the kubelet do)."""
    if dns is not None and (dns.servers or dns.searches or dns.options):
        out = [f"nameserver {s}\n" for s in dns.servers]
        if dns.searches:
            out.append("search " + " ".join(dns.searches) + "\n")
        if dns.options:
            out.append("options " + " ".join(dns.options) + "\n")
        return "".join(out)
    try:
        with open(host_resolv) as fh:
            text = fh.read()
    except OSError:
        return ""
    if host_network:
        return text
    kept: list[str] = []
    for line in text.splitlines(keepends=True):
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and _is_local_resolver(parts[1]):
            log.info("dropping node-local resolver from pod resolv.conf", server=parts[1])
            continue
        kept.append(line)
    return "".join(kept)


def write_pod_files(sandbox_dir: str, config: pb.PodSandboxConfig, ips: list[str],
                    host_network: bool, owner: tuple[int, int] | None = None) -> None:
    """hostname, hosts and resolv.conf; `owner`: the host uid/gid of the pod's root in
    its own user namespace, who then owns them (root in the pod may edit them, as it
    may without a user namespace)."""
    group = owner[1] if owner is not None else None
    modes.make_dir(sandbox_dir, modes.bundle_mode(group), group)
    hostname = pod_hostname(config, host_network)
    dns = config.dns_config if config.HasField("dns_config") else None
    for name, text in (("hostname", hostname + "\n"),
                       ("hosts", hosts_content(hostname, ips, host_network)),
                       ("resolv.conf", resolv_conf_content(dns, host_network))):
        _write_atomic(os.path.join(sandbox_dir, name), text, owner=owner)


def mount_shm(path: str, size: int, owner: tuple[int, int] | None = None) -> None:
    """A tmpfs for the pod's /dev/shm (idempotent); `owner` as in write_pod_files."""
    os.makedirs(path, mode=0o700, exist_ok=True)  # the tmpfs's own mode shows through
    if is_mountpoint(path):
        return
    ids = f",uid={owner[0]},gid={owner[1]}" if owner else ""
    libc.mount("shm", path, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC,
               f"mode=1777,size={size}{ids}", what=f"mount tmpfs on {path}")


def unmount_shm(path: str, roots: Sequence[str]) -> None:
    """Unmount (lazily, so a straggler holding it cannot block us) and remove; idempotent.
    Neither happens outside `roots` (the daemon's; OutsideRoots)."""
    path = remove.confined(path, roots)
    detach(path)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
