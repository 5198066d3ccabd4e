"""Build OCI runtime specs (config.json) as plain dicts, with containerd-like defaults.

`default_spec()` gives the spec every container/pause starts from (default mounts, masked
and read-only paths, the 14 default capabilities, a device allow-list, all namespaces
new); the helpers below edit it. CRI→OCI mapping for containers lives elsewhere
(crishim/container/spec.py); this module only knows the OCI format and host limits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crishim.oci.slices import parent_slice

Spec = dict[str, Any]

OCI_VERSION = "1.0.2-dev"
DEFAULT_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The Docker/containerd default capability set.
DEFAULT_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
    "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]

# Capability names by number (linux/capability.h); the host's cap_last_cap bounds it.
_CAP_NAMES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
]

DEFAULT_MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
]
DEFAULT_READONLY_PATHS = [
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
]

NAMESPACES = ("pid", "network", "ipc", "uts", "mount")

# Sysctls that are namespaced (safe to set per pod), as the kubelet/runc define them.
NAMESPACED_SYSCTLS = {"kernel.shm_rmid_forced", "kernel.shmmax", "kernel.shmall",
                      "kernel.shmmni", "kernel.msgmax", "kernel.msgmnb", "kernel.msgmni",
                      "kernel.sem", "kernel.domainname", "kernel.hostname"}
NAMESPACED_SYSCTL_PREFIXES = ("net.", "fs.mqueue.")


def cap_name(name: str) -> str:
    """A CRI capability name as the OCI spec spells it ("net_admin" → "CAP_NET_ADMIN")."""
    name = name.strip().upper()
    return name if name.startswith("CAP_") or name == "ALL" else "CAP_" + name


def all_capabilities() -> list[str]:
    """Every capability the daemon itself holds in its bounding set (for privileged).

    Like containerd, asking for more than we have fails in runc ("unable to apply caps"),
    e.g. when crishim itself runs without CAP_SYS_RESOURCE."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            last = int(fh.read().strip())
    except (OSError, ValueError):
        last = len(_CAP_NAMES) - 1
    bounding = (1 << (last + 1)) - 1
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapBnd:"):
                    bounding = int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return [name for i, name in enumerate(_CAP_NAMES[:last + 1]) if bounding & (1 << i)]


def sysctl_namespace(name: str) -> str | None:
    """Which namespace owns a sysctl: "ipc", "net", "uts", or None if it is node-wide."""
    name = name.replace("/", ".")
    if name in ("kernel.domainname", "kernel.hostname"):
        return "uts"
    if name in NAMESPACED_SYSCTLS or name.startswith("fs.mqueue."):
        return "ipc"
    if name.startswith("net."):
        return "net"
    return None


def default_mounts(*, privileged: bool = False, shm: bool = True) -> list[dict[str, Any]]:
    """The filesystems every container gets. Privileged ones see /sys and the cgroup tree
    writable; `shm=False` leaves /dev/shm to the caller (a pod's shared tmpfs)."""
    ro = [] if privileged else ["ro"]
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", *ro]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", *ro]},
    ]
    if not shm:
        mounts = [m for m in mounts if m["destination"] != "/dev/shm"]
    return mounts


def bind_host_sys(mounts: list[dict[str, Any]]) -> None:
    """The sysfs mount of `mounts` made a bind of the host's /sys. For a user namespace with
    the host's network (KEP-5607): the kernel mounts sysfs only for the owner of the network
    namespace, which is the host's user namespace. Recursive, since the mounts under /sys
    are locked to it in a user namespace; read-only unless it was writable (privileged)."""
    for m in mounts:
        if m["destination"] == "/sys" and m["type"] == "sysfs":
            ro = ["ro"] if "ro" in m["options"] else []
            m.update(type="bind", source="/sys",
                     options=["rbind", "rprivate", "nosuid", "noexec", "nodev", *ro])


def default_spec(args: Sequence[str], *, env: Iterable[str] = (), cwd: str = "/",
                 rootfs: str = "rootfs", readonly_rootfs: bool = False, hostname: str = "",
                 terminal: bool = False, uid: int = 0, gid: int = 0) -> Spec:
    """A complete spec with containerd's defaults and fresh namespaces of every kind."""
    env_list = list(env)
    if not any(e.startswith("PATH=") for e in env_list):
        env_list.insert(0, DEFAULT_PATH_ENV)
    spec: Spec = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": terminal,
            "user": {"uid": uid, "gid": gid},
            "args": list(args),
            "env": env_list,
            "cwd": cwd or "/",
            "capabilities": {k: list(DEFAULT_CAPS) for k in
                             ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": readonly_rootfs},
        "mounts": default_mounts(),
        "linux": {
            # Deny every device: the OCI runtime then allows its standard set (/dev/null,
            # zero, full, random, urandom, tty, ptmx, pts, mknod of any), as runc and crun
            # both do and containerd's spec relies on. Repeating the set here only made
            # every spec, and every NRI event carrying it, longer.
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in NAMESPACES],
            "maskedPaths": list(DEFAULT_MASKED_PATHS),
            "readonlyPaths": list(DEFAULT_READONLY_PATHS),
        },
    }
    if hostname:
        spec["hostname"] = hostname
    return spec


def set_namespace(spec: Spec, ns_type: str, path: str = "") -> None:
    """Use a new namespace of `ns_type` (path '') or join the one at `path`."""
    namespaces: list[dict[str, str]] = spec["linux"].setdefault("namespaces", [])
    namespaces[:] = [n for n in namespaces if n["type"] != ns_type]
    entry = {"type": ns_type}
    if path:
        entry["path"] = path
    namespaces.append(entry)


def remove_namespace(spec: Spec, ns_type: str) -> None:
    """Share the host's namespace of `ns_type`."""
    namespaces: list[dict[str, str]] = spec["linux"].setdefault("namespaces", [])
    namespaces[:] = [n for n in namespaces if n["type"] != ns_type]


def add_mount(spec: Spec, destination: str, source: str, mount_type: str = "bind",
              options: Sequence[str] = ("rbind", "rprivate", "rw")) -> None:
    """Add a mount, replacing any earlier mount on the same destination."""
    remove_mount(spec, destination)
    spec["mounts"].append({"destination": destination, "type": mount_type, "source": source,
                           "options": list(options)})


def remove_mount(spec: Spec, destination: str) -> None:
    dest = os.path.normpath(destination)
    spec["mounts"] = [m for m in spec["mounts"]
                      if os.path.normpath(m["destination"]) != dest]


def set_user(spec: Spec, uid: int, gid: int, additional_gids: Iterable[int] = (),
             umask: int | None = None) -> None:
    user: dict[str, Any] = {"uid": uid, "gid": gid}
    extra = sorted(set(additional_gids))
    if extra:
        user["additionalGids"] = extra
    if umask is not None:
        user["umask"] = umask
    spec["process"]["user"] = user


def set_capabilities(spec: Spec, caps: Iterable[str]) -> None:
    """Set bounding/effective/permitted; ambient and inheritable stay empty (as runc)."""
    names = list(dict.fromkeys(caps))
    spec["process"]["capabilities"] = {k: list(names) for k in
                                       ("bounding", "effective", "permitted")}


def set_privileged(spec: Spec) -> None:
    """Privileged: all capabilities, no masked/read-only paths, all devices, rw /sys."""
    set_capabilities(spec, all_capabilities())
    spec["process"]["noNewPrivileges"] = False
    linux = spec["linux"]
    linux.pop("maskedPaths", None)
    linux.pop("readonlyPaths", None)
    linux.pop("seccomp", None)
    linux.setdefault("resources", {})["devices"] = [{"allow": True, "access": "rwm"}]
    for m in spec["mounts"]:
        if m["destination"] in ("/sys", "/sys/fs/cgroup"):
            m["options"] = [o for o in m["options"] if o != "ro"] + ["rw"]


def set_sysctls(spec: Spec, sysctls: Mapping[str, str]) -> None:
    if sysctls:
        spec["linux"].setdefault("sysctl", {}).update(dict(sysctls))


def set_annotations(spec: Spec, annotations: Mapping[str, str]) -> None:
    if annotations:
        spec.setdefault("annotations", {}).update(dict(annotations))


def clamp_oom_score_adj(score: int, floor: int) -> int:
    return max(floor, min(1000, score))


def set_oom_score_adj(spec: Spec, score: int, floor: int) -> None:
    """Set the process oom_score_adj, clamped to what this daemon may set (`floor`:
    HostFacts.oom_score_adj_floor)."""
    spec["process"]["oomScoreAdj"] = clamp_oom_score_adj(score, floor)


def cgroups_path(driver: str, parent: str, prefix: str, cid: str) -> str:
    """runc's cgroupsPath for a container: cgroupfs "<parent>/<prefix>-<id>", systemd
    "<parent slice>:<prefix>:<id>" (runc then makes <prefix>-<id>.scope); ValueError for
    a systemd parent that is no slice (crishim/oci/slices.py)."""
    if driver == "systemd":
        return f"{parent_slice(parent)}:{prefix}:{cid}"  # the sandbox checked `parent`
    base = parent if parent else "/crishim"
    if not base.startswith("/"):
        base = "/" + base
    return os.path.join(base, f"{prefix}-{cid}")


def write_bundle(bundle_dir: str, spec: Spec, durable: bool = False) -> str:
    """Atomically write `<bundle_dir>/config.json`; return its path.

    No fsync by default: a bundle only matters while its container lives, and after an OS
    crash no container does (intents/reconcile recreate or remove bundles)."""
    os.makedirs(bundle_dir, mode=0o700, exist_ok=True)
    path = os.path.join(bundle_dir, "config.json")
    tmp = path + ".tmp"
    # 0600: the process's env holds the pod's secrets.
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600),
              "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        json.dump(spec, fh, separators=(",", ":"))
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_bundle(bundle_dir: str) -> Spec:
    with open(os.path.join(bundle_dir, "config.json")) as fh:
        spec: Spec = json.load(fh)
    return spec
