"""Validate a PodSandboxConfig before anything is created (INVALID_ARGUMENT on errors)."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.oci.slices import parent_slice
from crishim.oci.spec import sysctl_namespace
from crishim.sandbox.userns import check_pod_namespaces


def validate_cgroup_parent(driver: str, parent: str) -> None:
    """Under the systemd driver the parent must be a slice: runc would otherwise make a
    top-level slice out of a cgroupfs path's last component (see oci/slices.py)."""
    if driver == "systemd":
        try:
            parent_slice(parent)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None


def validate_config(config: pb.PodSandboxConfig) -> None:
    if not config.HasField("metadata"):
        raise InvalidArgument("sandbox config has no metadata; name, uid and namespace "
                              "are required")
    meta = config.metadata
    missing = [f for f in ("name", "uid", "namespace") if not getattr(meta, f)]
    if missing:
        raise InvalidArgument(f"sandbox metadata is missing {', '.join(missing)} "
                              "(name, uid and namespace are required)")
    for field_name in ("name", "namespace", "uid"):
        value = getattr(meta, field_name)
        if "/" in value or "\0" in value or value in (".", ".."):
            raise InvalidArgument(f"sandbox metadata {field_name} {value!r} contains '/' or "
                                  "NUL or is '.'/'..'")
    linux = config.linux
    ns = linux.security_context.namespace_options
    for kind in ("network", "pid", "ipc"):
        mode = getattr(ns, kind)
        if mode == pb.TARGET:
            raise InvalidArgument(f"namespace_options.{kind}=TARGET is only valid for "
                                  "containers, not for a pod sandbox")
    check_pod_namespaces(ns)
    for name in linux.sysctls:
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
