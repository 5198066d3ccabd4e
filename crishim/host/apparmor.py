"""AppArmor on this host, probed once at start: is the LSM on, where apparmor_parser is,
which parts of the host's policy tree exist, and the daemon's own label. Loading
crishim's profile and choosing containers' profiles happen above (oci/apparmor.py,
container/apparmor.py)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

UNCONFINED = "unconfined"
SECURITYFS = "/sys/kernel/security/apparmor"
_ENABLED_PARAM = "/sys/module/apparmor/parameters/enabled"
_PROFILES = os.path.join(SECURITYFS, "profiles")
_ETC = "/etc/apparmor.d"


@dataclass(frozen=True)
class HostIncludes:
    """Which parts of the host's AppArmor policy tree exist (older hosts lack some)."""

    abi3: bool = False
    tunables: bool = False
    base: bool = False

    @classmethod
    def probe(cls, etc: str = _ETC) -> HostIncludes:
        return cls(abi3=os.path.exists(os.path.join(etc, "abi/3.0")),
                   tunables=os.path.exists(os.path.join(etc, "tunables/global")),
                   base=os.path.exists(os.path.join(etc, "abstractions/base")))


def kernel_enabled(securityfs: str = SECURITYFS, param: str = _ENABLED_PARAM) -> bool:
    """The LSM is active (not only built in). Blocking: call from a thread."""
    if not os.path.isdir(securityfs):
        return False
    try:
        with open(param) as fh:
            return fh.read(1) == "Y"
    except OSError:
        return False


def daemon_label() -> str:
    """crishim's own AppArmor label ("unconfined" unless it runs under a profile)."""
    try:
        with open("/proc/self/attr/current") as fh:
            label = fh.read().strip()
    except OSError:
        return UNCONFINED
    return label.split(" ", 1)[0] or UNCONFINED


def is_loaded(name: str, profiles: str = _PROFILES) -> bool:
    """The kernel has a profile called `name`. Blocking: call from a thread."""
    try:
        with open(profiles) as fh:
            return any(line.split(" ", 1)[0] == name for line in fh)
    except OSError:
        return False


def parser_path() -> str | None:
    return shutil.which("apparmor_parser") or next(
        (p for p in ("/sbin/apparmor_parser", "/usr/sbin/apparmor_parser")
         if os.access(p, os.X_OK)), None)


@dataclass(frozen=True)
class AppArmorHost:
    """What the host offers for loading and applying profiles."""

    enabled: bool = False  # the kernel's LSM is active
    parser: str | None = None  # apparmor_parser, when installed
    includes: HostIncludes = field(default_factory=HostIncludes)
    daemon_label: str = UNCONFINED


def probe() -> AppArmorHost:
    """Blocking (a few small reads and stats): call it off the event loop."""
    if not kernel_enabled():
        return AppArmorHost()
    return AppArmorHost(enabled=True, parser=parser_path(), includes=HostIncludes.probe(),
                        daemon_label=daemon_label())
