"""Field rules shared by the request validators. Each raises InvalidArgument naming the
field (`what`), the value and the rule."""

from __future__ import annotations

import ipaddress
import posixpath
import re

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument

# RFC 1123 label, as the kubelet validates hostnames (case is left to the kernel).
_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")
# The kernel's HOST_NAME_MAX (a pod's hostname, GetNodenameForKernel trims to it).
# A pod's and a container's namespace_options take the same modes.
NAMESPACE_MODES = tuple(pb.NamespaceMode.values())
MODE_NAMES = {v: pb.NamespaceMode.Name(v) for v in NAMESPACE_MODES}

MAX_HOSTNAME = 64
# The kubelet's sysctl name rule (k8s.io/component-helpers, SysctlContainSlashPatternFmt).
_SYSCTL = re.compile(r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$")
MAX_SYSCTL_NAME = 253
# Names and ids: what Kubernetes object names allow at most (DNS subdomain length).
MAX_NAME = 253
# The largest uid or gid: runc refuses larger ones, and a runtime reading one into 32
# bits could wrap it (2^32 to 0). containerd refuses them too since its fix of
# CVE-2024-40635.
MAX_ID = (1 << 31) - 1
# The kubelet's resolv.conf limits (MaxDNSSearchPaths, MaxDNSSearchListChars).
MAX_DNS_SEARCHES = 32
MAX_DNS_SEARCH_CHARS = 2048


def _show(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def no_control(what: str, value: str) -> None:
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise InvalidArgument(f"{what} {_show(value)} contains a control character "
                              "(newline, NUL, ...)")


def name(what: str, value: str, limit: int = MAX_NAME) -> None:
    """A metadata name, namespace or uid: used in file and cgroup names, so no '/', no
    control characters, not '.'/'..', at most `limit` characters."""
    no_control(what, value)
    if "/" in value or value in (".", ".."):
        raise InvalidArgument(f"{what} {_show(value)} contains '/' or is '.'/'..'")
    if len(value) > limit:
        raise InvalidArgument(f"{what} is {len(value)} characters long; at most {limit} "
                              "are allowed")


def absolute_path(what: str, value: str) -> None:
    """A host or container path: absolute, with no '..' component and no control
    character."""
    no_control(what, value)
    if not value.startswith("/"):
        raise InvalidArgument(f"{what} {_show(value)} must be an absolute path")
    if ".." in value.split("/"):
        raise InvalidArgument(f"{what} {_show(value)} must not contain '..'")


def log_path(value: str) -> None:
    """ContainerConfig.log_path: relative to the pod's log_directory and confined to it
    (as the kubelet sends it: '<container>/<restart>.log')."""
    what = "log_path"
    no_control(what, value)
    if value.startswith("/"):
        raise InvalidArgument(f"{what} {_show(value)} must be relative to the pod's "
                              "log_directory, not absolute")
    if ".." in value.split("/"):
        raise InvalidArgument(f"{what} {_show(value)} must not contain '..': it stays "
                              "under the pod's log_directory")
    if posixpath.normpath(value) != value:
        raise InvalidArgument(f"{what} {_show(value)} is not normalised (write it as "
                              f"{posixpath.normpath(value)!r})")


def join_log_path(log_directory: str, value: str) -> str:
    """The container's log file: `value` (checked by log_path) under the pod's
    log_directory, which must be set and absolute."""
    log_path(value)
    if not log_directory:
        raise InvalidArgument(f"log_path {_show(value)} needs the pod's log_directory, "
                              "which the pod sandbox config does not set")
    absolute_path("pod log_directory", log_directory)
    return posixpath.join(log_directory, value)


def cgroup_parent(driver: str, value: str) -> None:
    """A pod's cgroup_parent under the cgroupfs driver: absolute and normalised, so the
    pod's cgroups stay below it (`/kubepods/../../etc` would name /sys/fs/cgroup/*/etc).
    The systemd driver's slice syntax is checked by crishim.oci.slices.parent_slice."""
    what = "cgroup_parent"
    if not value:
        return
    no_control(what, value)
    if ".." in value.split("/"):
        raise InvalidArgument(f"{what} {_show(value)} must not contain '..'")
    if driver == "systemd":
        return
    if not value.startswith("/"):
        raise InvalidArgument(f"{what} {_show(value)} must be an absolute cgroup path "
                              "such as '/kubepods/burstable/pod<uid>' (cgroupfs driver)")
    if posixpath.normpath(value) != value and value.rstrip("/") != posixpath.normpath(value):
        raise InvalidArgument(f"{what} {_show(value)} is not normalised (write it as "
                              f"{posixpath.normpath(value)!r})")


def enum(what: str, value: int, known: list[int] | tuple[int, ...],
         names: dict[int, str] | None = None) -> None:
    if value not in known:
        allowed = ", ".join(names[v] if names else str(v) for v in known)
        raise InvalidArgument(f"{what} has the unknown value {value}; known values: "
                              f"{allowed}")


def hostname(value: str) -> None:
    """RFC 1123 labels, dot-separated, at most the kernel's 64 characters."""
    what = "hostname"
    if not value:
        return
    if len(value) > MAX_HOSTNAME:
        raise InvalidArgument(f"{what} {_show(value)} is {len(value)} characters long; the "
                              f"kernel allows at most {MAX_HOSTNAME}")
    if not all(_LABEL.fullmatch(label) for label in value.split(".")):
        raise InvalidArgument(f"{what} {_show(value)} is not an RFC 1123 host name "
                              "(letters, digits and '-' in dot-separated labels of at "
                              "most 63 characters, not starting or ending with '-')")


def ip_address(what: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise InvalidArgument(f"{what}: {_show(value)} is not an IP address") from None


def dns_server(value: str) -> None:
    ip_address("dns_config.servers", value)


def dns_searches(values: list[str]) -> None:
    if len(values) > MAX_DNS_SEARCHES:
        raise InvalidArgument(f"dns_config.searches has {len(values)} domains; at most "
                              f"{MAX_DNS_SEARCHES} are allowed")
    if len(" ".join(values)) > MAX_DNS_SEARCH_CHARS:
        raise InvalidArgument("dns_config.searches is longer than "
                              f"{MAX_DNS_SEARCH_CHARS} characters in total")
    for value in values:
        _resolv_word("dns_config.searches", value)


def dns_option(value: str) -> None:
    _resolv_word("dns_config.options", value)


def _resolv_word(what: str, value: str) -> None:
    # One word of a resolv.conf line: whitespace would split it, a newline add a line.
    if not value or any(c.isspace() for c in value):
        raise InvalidArgument(f"{what}: {_show(value)} must be one non-empty word without "
                              "whitespace")
    no_control(what, value)


def sysctl(name_: str, value: str) -> None:
    if len(name_) > MAX_SYSCTL_NAME or not _SYSCTL.fullmatch(name_):
        raise InvalidArgument(f"sysctls: {_show(name_)} is not a valid sysctl name "
                              "(lowercase words separated by '.' or '/')")
    no_control(f"sysctls[{name_}] value", value)
    # No namespaced sysctl takes these; a tool that joins key=value pairs with '+' (as
    # CRI-O's pinns did, CVE-2022-0811) would read a second key out of such a value.
    if "=" in value or "+" in value:
        raise InvalidArgument(f"sysctls[{name_}] value {_show(value)} contains '=' or '+': "
                              "a value sets only its own sysctl; give each sysctl its own "
                              "entry")


def security_ids(sc: pb.LinuxContainerSecurityContext | pb.LinuxSandboxSecurityContext
                 ) -> None:
    """run_as_user, run_as_group and supplemental_groups of a security context: each a
    uid or gid between 0 and MAX_ID."""
    named = [(name, getattr(sc, name).value) for name in ("run_as_user", "run_as_group")
             if sc.HasField(name)]
    named += [(f"supplemental_groups[{i}]", g) for i, g in enumerate(sc.supplemental_groups)]
    for what, value in named:
        if not 0 <= value <= MAX_ID:
            raise InvalidArgument(f"security_context.{what} {value} is out of range: uids "
                                  f"and gids must be between 0 and {MAX_ID}")
