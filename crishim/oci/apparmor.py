"""crishim's default container profile, and making the configured profile usable.

The default profile is what RuntimeDefault (or no profile at all) means for a container:
everything a normal program needs stays allowed, while the ways out of a container that
capabilities alone do not close are denied — mounting, writing kernel tunables outside the
container's own processes, /sys outside the cgroup tree, firmware, power meters, the LSM's
own files, raw kernel memory. It is loaded once at start with `apparmor_parser -Kr`
(replace: idempotent, and an upgraded crishim's profile takes effect for new containers).
What the host offers for it (the LSM on, apparmor_parser, its policy tree) is probed by
host/apparmor.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from crishim.host.apparmor import SECURITYFS, UNCONFINED, AppArmorHost, HostIncludes, is_loaded
from crishim.log import get_logger

log = get_logger(__name__)

DEFAULT_PROFILE = "crishim-default"
_PARSER_TIMEOUT = 60.0


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


async def run_parser(parser: str, args: list[str], text: str) -> tuple[int, str]:
    """apparmor_parser with the profile on stdin; (exit code, its output)."""
    proc = await asyncio.create_subprocess_exec(
        parser, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(text.encode()),
                                        timeout=_PARSER_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return -1, f"no answer within {_PARSER_TIMEOUT:.0f}s"
    return proc.returncode or 0, out.decode(errors="replace").strip()


async def setup(profile: str, host: AppArmorHost) -> AppArmorState:
    """Make `profile` usable for RuntimeDefault containers on the `host` probed at start.

    crishim's own profile (DEFAULT_PROFILE) is generated and (re)loaded; any other name
    is the administrator's and must already be loaded; "unconfined" turns it off."""
    if not host.enabled:
        return AppArmorState(reason="the kernel has no AppArmor (no " + SECURITYFS + ")")
    parser = host.parser
    if parser is None:
        return AppArmorState(reason="apparmor_parser is not installed")
    if profile == UNCONFINED:
        return AppArmorState(enabled=True, reason="apparmor_profile is unconfined")
    if profile != DEFAULT_PROFILE:
        if await asyncio.to_thread(is_loaded, profile):
            return AppArmorState(enabled=True, default_profile=profile, reason="loaded")
        return AppArmorState(enabled=True, reason="configured profile missing",
                             error=f"AppArmor profile {profile!r} (apparmor_profile) is "
                                   "not loaded; load it with apparmor_parser")
    text = profile_text(profile, host.daemon_label, host.includes)
    # -K: no cache files written; -r: replace (adds when absent).
    code, out = await run_parser(parser, ["-Kr"], text)
    if code != 0:
        return AppArmorState(enabled=True, reason="default profile not loaded",
                             error=f"apparmor_parser -Kr {profile} failed ({code}): {out}")
    return AppArmorState(enabled=True, default_profile=profile, reason="loaded")


def log_state(state: AppArmorState) -> None:
    """Said once at start, so an operator sees why containers are (not) confined."""
    if state.error:
        log.error("AppArmor default profile unavailable; RuntimeDefault containers will "
                  "fail to create", error=state.error)
    elif state.default_profile:
        log.info("AppArmor default profile loaded", profile=state.default_profile)
    else:
        log.warning("AppArmor is off; containers run without an AppArmor profile",
                    reason=state.reason)
