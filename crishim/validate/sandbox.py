"""Validate a PodSandboxConfig before anything is created (INVALID_ARGUMENT on errors)."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.oci.slices import parent_slice
from crishim.oci.spec import sysctl_namespace
from crishim.oci.userns import check_pod_namespaces
from crishim.validate import fields

PROTOCOLS = tuple(pb.Protocol.values())
PROTOCOL_NAMES = {v: pb.Protocol.Name(v) for v in PROTOCOLS}


def validate_cgroup_parent(driver: str, parent: str) -> None:
    """Absolute and normalised under cgroupfs (no '..' escape from the kubelet's tree);
    under the systemd driver the parent must be a slice: runc would otherwise make a
    top-level slice out of a cgroupfs path's last component (see oci/slices.py)."""
    fields.cgroup_parent(driver, parent)
    if driver == "systemd":
        try:
            parent_slice(parent)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None


def validate_config(config: pb.PodSandboxConfig) -> None:
    """Every field RunPodSandbox acts on but its resources (requests.py checks those
    against the host's cgroups)."""
    if not config.HasField("metadata"):
        raise InvalidArgument("sandbox config has no metadata; name, uid and namespace "
                              "are required")
    meta = config.metadata
    missing = [f for f in ("name", "uid", "namespace") if not getattr(meta, f)]
    if missing:
        raise InvalidArgument(f"sandbox metadata is missing {', '.join(missing)} "
                              "(name, uid and namespace are required)")
    for field_name in ("name", "namespace", "uid"):
        fields.name(f"sandbox metadata.{field_name}", getattr(meta, field_name))
    if config.log_directory:
        fields.absolute_path("log_directory", config.log_directory)
    fields.hostname(config.hostname)
    dns = config.dns_config
    for server in dns.servers:
        fields.dns_server(server)
    fields.dns_searches(list(dns.searches))
    for option in dns.options:
        fields.dns_option(option)
    linux = config.linux
    fields.security_ids(linux.security_context)
    ns = linux.security_context.namespace_options
    for kind in ("network", "pid", "ipc"):
        mode = getattr(ns, kind)
        fields.enum(f"namespace_options.{kind}", mode, fields.NAMESPACE_MODES,
                    fields.MODE_NAMES)
        if mode == pb.TARGET:
            raise InvalidArgument(f"namespace_options.{kind}=TARGET is only valid for "
                                  "containers, not for a pod sandbox")
    if ns.HasField("userns_options"):
        fields.enum("namespace_options.userns_options.mode", ns.userns_options.mode,
                    fields.NAMESPACE_MODES, fields.MODE_NAMES)
    check_pod_namespaces(ns)
    for name, value in linux.sysctls.items():
        fields.sysctl(name, value)
        owner = sysctl_namespace(name)
        if owner is None:
            raise InvalidArgument(f"sysctl {name!r} is not namespaced and cannot be set for a "
                                  "pod (only net.*, fs.mqueue.*, kernel.shm*/msg*/sem, "
                                  "kernel.hostname/domainname are allowed)")
        if owner == "net" and ns.network == pb.NODE:
            raise InvalidArgument(f"sysctl {name!r} cannot be set for a host-network pod "
                                  "(it would change the node)")
        if owner == "ipc" and ns.ipc == pb.NODE:
            raise InvalidArgument(f"sysctl {name!r} cannot be set for a pod that shares the "
                                  "host IPC namespace")
        if owner == "uts" and ns.network == pb.NODE:
            raise InvalidArgument(f"sysctl {name!r} cannot be set for a host-network pod "
                                  "(it shares the host's UTS namespace)")
    for pm in config.port_mappings:
        if not 0 < pm.container_port < 65536 or not 0 <= pm.host_port < 65536:
            raise InvalidArgument(f"port mapping {pm.host_port}->{pm.container_port} is out "
                                  "of range")
        fields.enum("port_mappings.protocol", pm.protocol, PROTOCOLS, PROTOCOL_NAMES)
        if pm.host_ip:
            fields.ip_address("port_mappings.host_ip", pm.host_ip)
