"""crishim's default container profile (its text) and what containers get (AppArmorState).

The default profile is what RuntimeDefault (or no profile at all) means for a container:
everything a normal program needs stays allowed, while the ways out of a container that
capabilities alone do not close are denied — mounting, writing kernel tunables outside the
container's own processes, /sys outside the cgroup tree, firmware, power meters, the LSM's
own files, raw kernel memory. runtime/apparmor.py loads it; what the host offers for it
(the LSM on, apparmor_parser, its policy tree) is probed by host/apparmor.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from crishim.host.apparmor import UNCONFINED, HostIncludes

DEFAULT_PROFILE = "crishim-default"
# The deprecated `apparmor_profile` string's forms (older kubelets): these names, or
# LOCALHOST_PREFIX and a profile's name.
DEPRECATED_NAMES = ("", "runtime/default", "unconfined")
LOCALHOST_PREFIX = "localhost/"


@dataclass(frozen=True)
class AppArmorState:
    """What containers get: `default_profile` for RuntimeDefault, "" when AppArmor is off
    (`reason` says why); `error` when it is on but the default could not be loaded."""

    enabled: bool = False
    default_profile: str = ""
    reason: str = "not probed"
    error: str = ""

    def info(self) -> dict[str, object]:
        return {"enabled": self.enabled, "defaultProfile": self.default_profile,
                "reason": self.reason, "error": self.error}


# Writes into /proc are allowed only below /proc/<pid>/ (the container's own processes;
# AppArmor sees /proc/self resolved to a pid) and /proc/sys/kernel/shm* (IPC namespaced).
_PROC_RULES = (
    "deny @{PROC}/* w,",
    "deny @{PROC}/[^0-9s]*/** w,",
    "deny @{PROC}/s[^y]*/** w,",
    "deny @{PROC}/sy[^s]*/** w,",
    "deny @{PROC}/sys?*/** w,",
    "deny @{PROC}/[0-9]*[^0-9]*/** w,",
    "deny @{PROC}/sys/[^k]** w,",
    "deny @{PROC}/sys/k[^e]** w,",
    "deny @{PROC}/sys/kernel/[^s]** w,",
    "deny @{PROC}/sys/kernel/s[^h]** w,",
    "deny @{PROC}/sys/kernel/sh[^m]** w,",
    "deny @{PROC}/sysrq-trigger rwklx,",
    "deny @{PROC}/kcore rwklx,",
    "deny @{PROC}/kmem rwklx,",
    "deny @{PROC}/mem rwklx,",
)

# /sys is writable only under /sys/fs/cgroup (a container may manage its own cgroup);
# firmware tables, RAPL power meters (a side channel) and securityfs are not even readable.
_SYS_RULES = (
    "deny /sys/[^f]*/** wklx,",
    "deny /sys/f[^s]*/** wklx,",
    "deny /sys/fs/[^c]*/** wklx,",
    "deny /sys/fs/c[^g]*/** wklx,",
    "deny /sys/fs/cg[^r]*/** wklx,",
    "deny /sys/firmware/** rwklx,",
    "deny /sys/devices/virtual/powercap/** rwklx,",
    "deny /sys/kernel/security/** rwklx,",
)

# Who may signal a confined process: the host (unconfined), the OCI runtimes and monitor
# (by their profile names where the distribution ships one), crishim itself.
_SIGNAL_SENDERS = (UNCONFINED, "runc", "crun", "conmon")


def profile_text(name: str, daemon_profile: str = UNCONFINED,
                 includes: HostIncludes | None = None) -> str:
    """The default container profile named `name`."""
    inc = includes or HostIncludes()
    head: list[str] = []
    if inc.abi3:
        head.append("abi <abi/3.0>,")
    head.append("#include <tunables/global>" if inc.tunables else "@{PROC}=/proc/")
    body: list[str] = []
    if inc.base:
        body.append("#include <abstractions/base>")
    body += ["# Ordinary programs: networking, files, capabilities the runtime granted.",
             "network,", "capability,", "file,", "umount,",
             "# Mounting would let a process reshape its view of the host.",
             "deny mount,"]
    body += _PROC_RULES + _SYS_RULES
    for sender in dict.fromkeys((*_SIGNAL_SENDERS, daemon_profile)):
        body.append(f"signal (receive) peer={sender},")
    body += [f"signal (send,receive) peer={name},",
             "# Debuggers work between the container's own processes.",
             f"ptrace (trace,tracedby,read,readby) peer={name},"]
    lines = [*head, "", f"profile {name} flags=(attach_disconnected,mediate_deleted) {{",
             *("  " + line for line in body), "}", ""]
    return "\n".join(lines)
