"""Apply CDI container edits to a container's OCI spec (the dict container/spec.py builds).

Pure but for one stat per device node whose type or numbers the spec leaves out (taken
from the host node, as the CDI specification says). What each edit does, as the CDI
reference library does it:

- env: KEY=VALUE replaces the container's KEY, else is appended;
- deviceNodes: replace a device at the same container path, with type, major/minor and
  file mode from the host node when not given, owner defaulting to the container's user
  (when not root); b and c nodes also get a cgroup allow rule with their permissions
  (default rwm; "none" adds no rule, so the node exists but cannot be opened);
- mounts: replace a mount at the same container path; then every mount is ordered by
  depth (stable), so a parent never hides a child;
- hooks: appended to the OCI hook list of their name;
- additionalGids: added to the process's groups (0 and repeats skipped);
- intelRdt: set as linux.intelRdt (the last one applied wins);
- netDevices: refused — pod networking is CNI's, and the runc this targets ignores
  linux.netDevices, so the device would silently be missing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from crishim.cdi.spec import NO_PERMISSIONS, ContainerEdits, DeviceNode, IntelRdt, Mount
from crishim.errors import FailedPrecondition, InvalidArgument


@dataclass(frozen=True)
class Injection:
    """Edits to apply, and where they come from (for error messages)."""

    origin: str
    edits: ContainerEdits


StatFn = Callable[[str], os.stat_result]


def apply(spec: dict[str, Any], injections: Sequence[Injection],
          stat_fn: StatFn = os.stat) -> None:
    """Apply every injection to `spec` in order."""
    if not injections:
        return
    process = spec.setdefault("process", {})
    env: list[str] = process.setdefault("env", [])
    env_index = {e.partition("=")[0]: i for i, e in enumerate(env)}
    mounts_changed = False
    for inj in injections:
        e = inj.edits
        if e.net_devices:
            raise InvalidArgument(f"{inj.origin}: netDevices edits are not supported (pod "
                            "networking is set up by CNI)")
        for var in e.env:
            key = var.partition("=")[0]
            if key in env_index:
                env[env_index[key]] = var
            else:
                env_index[key] = len(env)
                env.append(var)
        for node in e.device_nodes:
            _add_device(spec, node, inj.origin, stat_fn)
        for m in e.mounts:
            _add_mount(spec, m)
            mounts_changed = True
        for h in e.hooks:
            hook: dict[str, Any] = {"path": h.path}
            if h.args:
                hook["args"] = list(h.args)
            if h.env:
                hook["env"] = list(h.env)
            if h.timeout is not None:
                hook["timeout"] = h.timeout
            spec.setdefault("hooks", {}).setdefault(h.hook_name, []).append(hook)
        if e.intel_rdt is not None:
            spec.setdefault("linux", {})["intelRdt"] = _intel_rdt(e.intel_rdt)
        user = process.setdefault("user", {"uid": 0, "gid": 0})
        for gid in e.additional_gids:
            gids: list[int] = user.setdefault("additionalGids", [])
            if gid and gid not in gids:
                gids.append(gid)
    if mounts_changed:
        spec["mounts"].sort(key=lambda m: _depth(m["destination"]))


def _depth(path: str) -> int:
    return os.path.normpath(path).count("/")


def _host_type(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "c"
    if stat.S_ISBLK(mode):
        return "b"
    if stat.S_ISFIFO(mode):
        return "p"
    return ""


def resolve_node(node: DeviceNode, origin: str, stat_fn: StatFn = os.stat) -> DeviceNode:
    """`node` with what it leaves out taken from the host node. A node that names its type
    and (unless a fifo) its major number needs no host node; any other does."""
    minimal = bool(node.type) and (node.major != 0 or node.type == "p")
    host_path = node.host_path or node.path
    try:
        st = stat_fn(host_path)
    except OSError as exc:
        if minimal:
            return node
        raise FailedPrecondition(f"{origin}: host device {host_path}: "
                              f"{exc.strerror or exc}") from None
    host_type = _host_type(st.st_mode)
    if not host_type:
        if minimal:
            return node
        raise FailedPrecondition(f"{origin}: host path {host_path} is not a device node")
    file_mode = node.file_mode if node.file_mode is not None else stat.S_IMODE(st.st_mode)
    if minimal:
        return replace(node, file_mode=file_mode)
    kind = node.type or host_type
    # "u" (unbuffered character) is a character device on the host.
    if (kind if kind != "u" else "c") != host_type:
        raise FailedPrecondition(f"{origin}: device {node.path} is declared type {kind!r} but "
                              f"{host_path} on the host is type {host_type!r}")
    major, minor = node.major, node.minor
    if kind != "p" and major == 0:
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return replace(node, type=kind, major=major, minor=minor, file_mode=file_mode)


def _add_device(spec: dict[str, Any], node: DeviceNode, origin: str, stat_fn: StatFn) -> None:
    node = resolve_node(node, origin, stat_fn)
    dev: dict[str, Any] = {"path": node.path, "type": node.type}
    if node.type != "p":
        dev["major"] = node.major
        dev["minor"] = node.minor
    if node.file_mode is not None:
        dev["fileMode"] = node.file_mode
    user = spec.get("process", {}).get("user", {})
    uid = node.uid if node.uid is not None else (user.get("uid") or None)
    gid = node.gid if node.gid is not None else (user.get("gid") or None)
    if uid is not None:
        dev["uid"] = uid
    if gid is not None:
        dev["gid"] = gid
    linux = spec.setdefault("linux", {})
    devices = [d for d in linux.get("devices", []) if d.get("path") != node.path]
    devices.append(dev)
    linux["devices"] = devices
    if node.type in ("b", "c") and node.permissions != NO_PERMISSIONS:
        rules = linux.setdefault("resources", {}).setdefault("devices", [])
        rules.append({"allow": True, "type": node.type, "major": node.major,
                      "minor": node.minor, "access": node.permissions or "rwm"})


def _has_user_namespace(spec: dict[str, Any]) -> bool:
    return any(ns.get("type") == "user" for ns in spec.get("linux", {}).get("namespaces", []))


def _add_mount(spec: dict[str, Any], m: Mount) -> None:
    mount: dict[str, Any] = {"destination": m.container_path, "source": m.host_path,
                             "options": list(m.options)}
    if m.type:
        mount["type"] = m.type
    if _has_user_namespace(spec):
        # A bind mount into a user namespace must be idmapped to show the right owners.
        opts = mount["options"]
        if not {"idmap", "ridmap"} & set(opts):
            if "rbind" in opts:
                opts.append("ridmap")
            elif "bind" in opts or m.type == "bind":
                opts.append("idmap")
    spec["mounts"] = [x for x in spec.get("mounts", [])
                      if x.get("destination") != m.container_path]
    spec["mounts"].append(mount)


def _intel_rdt(r: IntelRdt) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.clos_id:
        out["closID"] = r.clos_id
    if r.l3_cache_schema:
        out["l3CacheSchema"] = r.l3_cache_schema
    if r.mem_bw_schema:
        out["memBwSchema"] = r.mem_bw_schema
    if r.schemata is not None:
        out["schemata"] = list(r.schemata)
    if r.enable_monitoring:
        out["enableMonitoring"] = True
    return out
