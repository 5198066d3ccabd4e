"""CRI ContainerConfig + image config + pod → OCI runtime spec (config.json) for a container.

Pure: everything it needs from the host (the resolved user, the oom floor, the host's
devices for privileged containers, kernel features) is passed in or read through small
helpers, so the mapping is unit-testable without root.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.apparmor import select_profile
from crishim.container.process import container_env, process_args
from crishim.container.user import ResolvedUser
from crishim.errors import InvalidArgument
from crishim.host import modes
from crishim.host.facts import HostFacts
from crishim.oci import annotations as cri_ann
from crishim.oci import seccomp
from crishim.oci import spec as oci_spec
from crishim.oci.apparmor import AppArmorState
from crishim.oci.resources import ResourceMapper
from crishim.oci.userns import PodUserns, check_container

_PROPAGATION = {pb.PROPAGATION_PRIVATE: "rprivate",
                pb.PROPAGATION_HOST_TO_CONTAINER: "rslave",
                pb.PROPAGATION_BIDIRECTIONAL: "rshared"}

TERMINATION_MESSAGE_ANNOTATION = "io.kubernetes.container.terminationMessagePath"


@dataclass
class PodInfo:
    """What a container needs from its pod sandbox."""

    id: str
    name: str = ""
    namespace: str = ""
    uid: str = ""
    hostname: str = ""
    netns_path: str = ""  # empty: host network
    pause_pid: int = 0
    cgroup_parent: str = ""
    hosts_path: str = ""
    resolv_path: str = ""
    hostname_path: str = ""
    shm_path: str = ""
    sysctls: dict[str, str] = field(default_factory=dict)
    namespace_options: pb.NamespaceOption = field(default_factory=pb.NamespaceOption)
    # userns_options mode POD: the pod's mappings and its pinned user namespace.
    userns: PodUserns | None = None
    userns_path: str = ""


@dataclass
class SpecHost:
    """What the spec needs from the node: its facts, the resource mapping for them, its
    AppArmor state, and for NamespaceMode TARGET the target container's init pid."""

    facts: HostFacts = field(default_factory=HostFacts)
    resources: ResourceMapper = field(default_factory=ResourceMapper)
    # AppArmor on the host and the default profile (RuntimeDefault), loaded at start.
    apparmor: AppArmorState = field(default_factory=AppArmorState)
    target_pid: int = 0


@dataclass
class SpecInputs:
    container_id: str
    config: pb.ContainerConfig
    pod: PodInfo
    image_config: dict[str, Any]  # the OCI image config's "config" section
    image_name: str
    rootfs: str
    user: ResolvedUser
    host: SpecHost = field(default_factory=SpecHost)
    termination_log: str = ""  # host file bound at the termination message path
    # Image volumes: index in config.mounts → the mounted image dir to bind (read-only).
    image_volumes: dict[int, str] = field(default_factory=dict)
    # Mounts with uid/gid mappings: index in config.mounts → crishim's idmapped mount.
    idmapped_volumes: dict[int, str] = field(default_factory=dict)


def capabilities(add: list[str], drop: list[str], privileged: bool) -> list[str]:
    """The effective capability set: defaults, + add, - drop; "ALL" works on both sides
    (names checked by validate/container.py)."""
    if privileged:
        return oci_spec.all_capabilities()
    adds = [oci_spec.cap_name(c) for c in add]
    drops = [oci_spec.cap_name(c) for c in drop]
    caps = list(oci_spec.DEFAULT_CAPS)
    if "ALL" in adds:
        caps = oci_spec.all_capabilities()
    if "ALL" in drops:
        caps = []
    for c in adds:
        if c != "ALL" and c not in caps:
            caps.append(c)
    return [c for c in caps if c not in drops]


def _text(value: str | bytes) -> str:
    # api.proto declares KeyValue.value as bytes (same wire format as the upstream string).
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _clean(path: str) -> str:
    # normpath keeps a leading "//" (POSIX allows it to mean something else); we don't.
    return "/" + os.path.normpath("/" + path).lstrip("/")


def _flags(m: pb.Mount) -> list[str]:
    """Mount.mount_options (noexec, nodev, nosuid; validate/container.py allows no other),
    once each: the runtime sets them in the bind's remount."""
    return list(dict.fromkeys(m.mount_options))


def _cri_mount(m: pb.Mount, image_source: str = "",
               idmapped_source: str = "") -> tuple[dict[str, Any], str]:
    """One CRI bind mount → (OCI mount, rootfs propagation it needs or "")."""
    if m.HasField("image") and m.image.image:
        if not image_source:
            raise InvalidArgument(f"mount {m.container_path}: image volume "
                                  f"{m.image.image!r} was not mounted")
        # Executable (binaries from the image run) unless asked otherwise, never writable.
        return ({"destination": _clean(m.container_path), "type": "bind",
                 "source": image_source,
                 "options": ["rbind", "rprivate", "ro", *_flags(m)]}, "")
    if m.uidMappings or m.gidMappings:
        if not idmapped_source:
            raise InvalidArgument(f"mount {m.container_path}: its idmapped mount was not "
                                  "made")
        source = idmapped_source
    else:
        source = m.host_path
        if not os.path.exists(source):
            # Like containerd: a missing host path becomes an empty directory (0755, not
            # the daemon's umask: the container's user need not be root).
            modes.make_dir(source, 0o755)
        # A host path that is a symlink is mounted as what it points to.
        source = os.path.realpath(source)
    # Paths, propagation and the rules of recursive_read_only: validate/container.py.
    prop = _PROPAGATION[m.propagation]
    opts = ["rbind", prop]
    if m.recursive_read_only:
        opts.append("rro")
    else:
        opts.append("ro" if m.readonly else "rw")
    opts += _flags(m)
    rootfs_prop = {"rshared": "rshared", "rslave": "rslave"}.get(prop, "")
    return ({"destination": _clean(m.container_path), "type": "bind", "source": source,
             "options": opts}, rootfs_prop)


def host_devices() -> list[dict[str, Any]]:
    """Every device node under the host's /dev, for privileged containers."""
    out: list[dict[str, Any]] = []
    skip = ("/dev/pts", "/dev/shm", "/dev/mqueue", "/dev/fd", "/dev/.")
    for dirpath, dirnames, filenames in os.walk("/dev"):
        if dirpath.startswith(skip):
            dirnames[:] = []
            continue
        for name in filenames:
            path = os.path.join(dirpath, name)
            if path in ("/dev/console", "/dev/ptmx", "/dev/tty") or path.startswith(skip):
                continue
            dev = device_from_path(path, path, "rwm")
            if dev is not None:
                out.append(dev)
    return out


def device_from_path(host_path: str, container_path: str,
                     permissions: str) -> dict[str, Any] | None:
    try:
        st = os.stat(host_path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return {"path": container_path, "type": kind, "major": os.major(st.st_rdev),
            "minor": os.minor(st.st_rdev), "fileMode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid, "gid": st.st_gid, "_access": permissions or "rwm"}


def _devices(config: pb.ContainerConfig, privileged: bool
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    devices: list[dict[str, Any]] = []
    # Deny all, then the standard allow-list (null, zero, tty, pts, ...).
    rules: list[dict[str, Any]] = oci_spec.default_spec(["-"])["linux"]["resources"]["devices"]
    if privileged:
        devices.extend(host_devices())
        rules = [{"allow": True, "access": "rwm"}]
    for d in config.devices:
        perms = d.permissions or "rwm"  # only r, w and m: validate/container.py
        dev = device_from_path(d.host_path, d.container_path or d.host_path, perms)
        if dev is None:
            raise InvalidArgument(f"device {d.host_path} is not a character or block device "
                                  "on the node")
        devices.append(dev)
    for dev in devices:
        access = dev.pop("_access")
        if not privileged:
            rules.append({"allow": True, "type": dev["type"], "major": dev["major"],
                          "minor": dev["minor"], "access": access})
    return devices, rules


def _namespaces(pod: PodInfo, opts: pb.NamespaceOption,
                host: SpecHost) -> list[dict[str, Any]]:
    check_container(pod.userns, opts)
    ns: list[dict[str, Any]] = [{"type": "mount"}]
    if pod.userns is not None:
        if not pod.userns_path:
            raise InvalidArgument(f"pod {pod.id} has no user namespace to join")
        # Every container of the pod in the pod's user namespace (the owner of its
        # network, ipc, uts and pid namespaces).
        ns.append({"type": "user", "path": pod.userns_path})
    pause = f"/proc/{pod.pause_pid}/ns" if pod.pause_pid else ""
    if opts.network != pb.NODE:
        if pod.netns_path:
            ns.append({"type": "network", "path": pod.netns_path})
        elif pause:
            ns.append({"type": "network", "path": f"{pause}/net"})
        # The UTS namespace follows the network one (host network → host hostname).
        if pause:
            ns.append({"type": "uts", "path": f"{pause}/uts"})
    if opts.ipc != pb.NODE and pause:
        ns.append({"type": "ipc", "path": f"{pause}/ipc"})
    if opts.pid == pb.POD:
        if pause:
            ns.append({"type": "pid", "path": f"{pause}/pid"})
    elif opts.pid == pb.CONTAINER:
        ns.append({"type": "pid"})
    elif opts.pid == pb.TARGET:
        if not host.target_pid:
            raise InvalidArgument(f"pid namespace target {opts.target_id!r} is not running")
        ns.append({"type": "pid", "path": f"/proc/{host.target_pid}/ns/pid"})
    if host.facts.cgroups.v2:
        ns.append({"type": "cgroup"})
    return ns


def _pod_file_mounts(pod: PodInfo, opts: pb.NamespaceOption, readonly: bool,
                     taken: set[str]) -> list[dict[str, Any]]:
    rw = "ro" if readonly else "rw"
    out: list[dict[str, Any]] = []
    for dest, src in (("/etc/hostname", pod.hostname_path), ("/etc/hosts", pod.hosts_path),
                      ("/etc/resolv.conf", pod.resolv_path)):
        if src and dest not in taken:
            out.append({"destination": dest, "type": "bind", "source": src,
                        "options": ["rbind", "rprivate", rw]})
    if "/dev/shm" not in taken:
        if opts.ipc == pb.NODE:
            out.append({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm",
                        "options": ["rbind", "rprivate", "rw"]})
        elif pod.shm_path:
            # Shared memory stays writable even with a read-only rootfs (as containerd).
            out.append({"destination": "/dev/shm", "type": "bind", "source": pod.shm_path,
                        "options": ["rbind", "rprivate", "rw"]})
        else:
            out.append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                        "options": ["nosuid", "noexec", "nodev", "mode=1777",
                                    "size=65536k"]})
    return out


def _sysctls(sysctls: dict[str, str], opts: pb.NamespaceOption) -> dict[str, str]:
    """The pod's sysctls that live in a namespace this container does not share with the
    host (runc refuses e.g. net.* in the host network namespace)."""
    host = {"net": opts.network == pb.NODE, "uts": opts.network == pb.NODE,
            "ipc": opts.ipc == pb.NODE}
    out = {}
    for name, value in sysctls.items():
        ns = oci_spec.sysctl_namespace(name)
        if ns is not None and not host[ns]:
            out[name] = value
    return out


def _seccomp(sc: pb.LinuxContainerSecurityContext, caps: list[str]) -> dict[str, Any] | None:
    if sc.privileged:
        return None
    return seccomp.select(sc.seccomp if sc.HasField("seccomp") else None,
                          sc.seccomp_profile_path, caps)


def _image_cwd(img: dict[str, Any]) -> str:
    """The image's WorkingDir (the request's own was checked by validate/container.py)."""
    cwd = img.get("WorkingDir") or "/"
    if not cwd.startswith("/"):
        raise InvalidArgument(f"working dir {cwd!r} must be an absolute path")
    return str(cwd)


def spec_annotations(inp: SpecInputs) -> dict[str, str]:
    ann = cri_ann.from_request(dict(inp.config.annotations))
    ann.update({
        cri_ann.CONTAINER_TYPE: cri_ann.TYPE_CONTAINER,
        cri_ann.CONTAINER_NAME: inp.config.metadata.name,
        cri_ann.SANDBOX_ID: inp.pod.id,
        cri_ann.SANDBOX_NAME: inp.pod.name,
        cri_ann.SANDBOX_NAMESPACE: inp.pod.namespace,
        cri_ann.SANDBOX_UID: inp.pod.uid,
        cri_ann.IMAGE_NAME: inp.image_name,
        cri_ann.CRUN_SYSTEMD_SUBGROUP: "",
    })
    return ann


def build_spec(inp: SpecInputs) -> dict[str, Any]:
    """The full OCI runtime spec for a CRI container."""
    cfg = inp.config
    linux = cfg.linux
    sc = linux.security_context
    res = linux.resources
    host = inp.host
    privileged = sc.privileged
    img = inp.image_config
    opts = sc.namespace_options if sc.HasField("namespace_options") \
        else inp.pod.namespace_options

    caps = capabilities(list(sc.capabilities.add_capabilities),
                        list(sc.capabilities.drop_capabilities), privileged)
    ambient = [oci_spec.cap_name(c) for c in sc.capabilities.add_ambient_capabilities]
    for c in ambient:
        if c not in caps:
            caps.append(c)
    process: dict[str, Any] = {
        "terminal": cfg.tty,
        "user": {"uid": inp.user.uid, "gid": inp.user.gid},
        "args": process_args(list(cfg.command), list(cfg.args), img.get("Entrypoint"),
                             img.get("Cmd")),
        "env": container_env(inp.pod.hostname, img.get("Env"),
                             [(kv.key, _text(kv.value)) for kv in cfg.envs]),
        "cwd": cfg.working_dir or _image_cwd(img),
        "capabilities": {"bounding": caps, "effective": caps, "permitted": caps,
                         **({"inheritable": ambient, "ambient": ambient} if ambient else {})},
        "noNewPrivileges": bool(sc.no_new_privs),
        "oomScoreAdj": max(int(res.oom_score_adj), host.facts.oom_score_adj_floor),
    }
    if inp.user.additional_gids:
        process["user"]["additionalGids"] = list(inp.user.additional_gids)

    mounts = oci_spec.default_mounts(privileged=privileged, shm=False)
    if inp.pod.userns is not None and opts.network == pb.NODE:
        oci_spec.bind_host_sys(mounts)
    cri_mounts: list[dict[str, Any]] = []
    rootfs_propagation = ""
    for i, m in enumerate(cfg.mounts):
        mount, prop = _cri_mount(m, inp.image_volumes.get(i, ""),
                                 inp.idmapped_volumes.get(i, ""))
        cri_mounts.append(mount)
        if prop == "rshared" or (prop == "rslave" and rootfs_propagation != "rshared"):
            rootfs_propagation = prop
    taken = {m["destination"] for m in cri_mounts}
    # Kubelet mounts replace our defaults at the same path (e.g. its own /etc/hosts).
    mounts = [m for m in mounts if m["destination"] not in taken]
    mounts += _pod_file_mounts(inp.pod, opts, sc.readonly_rootfs, taken)
    term_path = cfg.annotations.get(TERMINATION_MESSAGE_ANNOTATION, "")
    if inp.termination_log and term_path and _clean(term_path) not in taken:
        mounts.append({"destination": _clean(term_path), "type": "bind",
                       "source": inp.termination_log, "options": ["rbind", "rprivate", "rw"]})
    # Parents before children, so a mount at /a/b is not hidden by a later one at /a.
    cri_mounts.sort(key=lambda m: m["destination"].count("/"))
    mounts += cri_mounts

    devices, device_rules = _devices(cfg, privileged)
    resources = host.resources.linux(res)
    resources["devices"] = device_rules

    linux_spec: dict[str, Any] = {
        "namespaces": _namespaces(inp.pod, opts, host),
        "resources": resources,
        "cgroupsPath": oci_spec.cgroups_path(host.facts.cgroup_driver, inp.pod.cgroup_parent,
                                             "crishim", inp.container_id),
        "devices": devices,
        "sysctl": _sysctls(inp.pod.sysctls, opts),
    }
    if inp.pod.userns is not None:
        linux_spec.update(inp.pod.userns.oci())
    if not privileged:
        linux_spec["maskedPaths"] = list(sc.masked_paths or oci_spec.DEFAULT_MASKED_PATHS)
        linux_spec["readonlyPaths"] = list(sc.readonly_paths or oci_spec.DEFAULT_READONLY_PATHS)
    if rootfs_propagation:
        linux_spec["rootfsPropagation"] = rootfs_propagation
    profile = _seccomp(sc, caps)
    if profile is not None:
        linux_spec["seccomp"] = profile
    apparmor_profile = select_profile(sc, host.apparmor)
    if apparmor_profile:
        process["apparmorProfile"] = apparmor_profile

    return {
        "ociVersion": oci_spec.OCI_VERSION,
        "process": process,
        "root": {"path": inp.rootfs, "readonly": bool(sc.readonly_rootfs)},
        "mounts": mounts,
        "annotations": spec_annotations(inp),
        "linux": linux_spec,
    }
