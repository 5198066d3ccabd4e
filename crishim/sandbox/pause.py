"""The pause (infra) container: its rootfs and its OCI spec.

By default the pause is embedded: a rootfs under {root}/pause/rootfs (sandbox/pauserootfs.py)
holding only a copy of the host's static catatonit, run as `catatonit -P` (pause mode: it
only reaps zombies and waits for a signal). No registry is needed.
"""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.oci import annotations as ann
from crishim.oci import seccomp
from crishim.oci import spec as ocispec
from crishim.oci.userns import PodUserns

PAUSE_ARGS = ["/catatonit", "-P"]
# containerd's default for the sandbox: the pause should be the last thing the OOM
# killer picks (clamped to what this daemon may set).
PAUSE_OOM_SCORE_ADJ = -998
# containerd gives the pause the minimum CPU weight.
PAUSE_CPU_SHARES = 2

CONTAINER_TYPE_SANDBOX = ann.TYPE_SANDBOX


def pause_spec(*, sandbox_id: str, config: pb.PodSandboxConfig, rootfs: str,
               args: list[str], env: list[str], cwd: str, hostname: str, netns_path: str,
               shm_path: str, cgroups_path: str, oom_floor: int,
               userns: PodUserns | None = None, userns_path: str = "") -> ocispec.Spec:
    """The pause container's OCI spec from the pod's Linux options; with `userns`, in the
    pod's user namespace pinned at `userns_path`."""
    linux = config.linux
    sc = linux.security_context
    ns = sc.namespace_options
    host_network = ns.network == pb.NODE
    spec = ocispec.default_spec(args, env=env, cwd=cwd, rootfs=rootfs, readonly_rootfs=True,
                                hostname="" if host_network else hostname)
    # Network: the pinned netns, or the host's.
    if host_network:
        ocispec.remove_namespace(spec, "network")
        ocispec.remove_namespace(spec, "uts")  # host network pods share the node's name
    else:
        ocispec.set_namespace(spec, "network", netns_path)
    if ns.ipc == pb.NODE:
        ocispec.remove_namespace(spec, "ipc")
        ocispec.add_mount(spec, "/dev/shm", "/dev/shm", options=["rbind", "ro", "nosuid",
                                                                "nodev", "noexec"])
    elif shm_path:
        ocispec.add_mount(spec, "/dev/shm", shm_path, options=["rbind", "ro", "nosuid",
                                                              "nodev", "noexec"])
    if ns.pid == pb.NODE:
        ocispec.remove_namespace(spec, "pid")
    if userns is not None:
        # Joined first by the runtime, so the pod's ipc/uts/pid namespaces it creates for
        # the pause are owned by the pod's user namespace.
        ocispec.set_namespace(spec, "user", userns_path)
        spec["linux"].update(userns.oci())
        if host_network:
            ocispec.bind_host_sys(spec["mounts"])
    # The pause runs as the pod's user when one is given (as containerd does).
    uid = sc.run_as_user.value if sc.HasField("run_as_user") else 0
    gid = sc.run_as_group.value if sc.HasField("run_as_group") else 0
    ocispec.set_user(spec, uid, gid, sc.supplemental_groups)
    if sc.privileged:
        ocispec.set_privileged(spec)
    else:
        profile = seccomp.select(sc.seccomp if sc.HasField("seccomp") else None,
                                 sc.seccomp_profile_path,
                                 spec["process"]["capabilities"]["bounding"])
        if profile is not None:
            spec["linux"]["seccomp"] = profile
    ocispec.set_sysctls(spec, dict(linux.sysctls))
    ocispec.set_oom_score_adj(spec, PAUSE_OOM_SCORE_ADJ, oom_floor)
    spec["linux"]["cgroupsPath"] = cgroups_path
    spec["linux"]["resources"]["cpu"] = {"shares": PAUSE_CPU_SHARES}
    meta = config.metadata
    ocispec.set_annotations(spec, {
        ann.CONTAINER_TYPE: ann.TYPE_SANDBOX, ann.SANDBOX_ID: sandbox_id,
        ann.SANDBOX_NAME: meta.name, ann.SANDBOX_NAMESPACE: meta.namespace,
        ann.SANDBOX_UID: meta.uid, ann.SANDBOX_LOG_DIR: config.log_directory,
        ann.CRUN_SYSTEMD_SUBGROUP: "",
    })
    return spec
