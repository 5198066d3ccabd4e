"""The CRI annotations crishim puts on OCI specs, as containerd names them (tools such as
NRI read them; start-up reconcile finds its own runc containers by the container type)."""

from collections.abc import Mapping

CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CONTAINER_NAME = "io.kubernetes.cri.container-name"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
SANDBOX_LOG_DIR = "io.kubernetes.cri.sandbox-log-directory"
IMAGE_NAME = "io.kubernetes.cri.image-name"
# Values of CONTAINER_TYPE.
TYPE_CONTAINER = "container"
TYPE_SANDBOX = "sandbox"
# crun's systemd driver puts the process (and the limits) of a cgroup v2 container in a
# "container" cgroup below the scope it asks for, unless this says no subgroup: crishim
# reads stats, limits and OOM kills from the scope, where runc keeps them (runc ignores it).
CRUN_SYSTEMD_SUBGROUP = "run.oci.systemd.subgroup"

# Annotations the OCI runtimes act on (runc and crun apply `org.systemd.property.*` to the
# container's systemd unit; crun's `run.oci.*` switch its groups, hooks' output files,
# seccomp plugins and handler; `module.wasm.image/*` picks crun's wasm handler; runc reads
# `org.criu.*` and `org.opencontainers.runc.*`), and crishim's own names. A CRI request
# never sets them on a spec: a pod's or a container's annotations are data, not switches
# of the node (CRI-O's CVE-2024-3154). containerd passes none unless configured to.
OWN_PREFIX = "io.kubernetes.cri."
# runc's CRIU configuration file for this container's checkpoints and restores.
CRIU_CONFIG = "org.criu.config"
RESERVED_PREFIXES = ("org.systemd.property.", "run.oci.", "module.wasm.image/", "org.criu.",
                     "org.opencontainers.runc.", OWN_PREFIX)


def from_request(annotations: dict[str, str]) -> dict[str, str]:
    """A CRI config's annotations as they may appear on an OCI spec."""
    return {k: v for k, v in annotations.items() if not k.startswith(RESERVED_PREFIXES)}


def without_own(annotations: Mapping[str, str]) -> dict[str, str]:
    """A CRI config's annotations less crishim's own names: those say what crishim made
    (the pod a container belongs to, its image), and a request may not claim them."""
    return {k: v for k, v in annotations.items() if not k.startswith(OWN_PREFIX)}
