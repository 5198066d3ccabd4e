"""One CDI spec file (JSON or YAML) → typed, validated dataclasses.

Pure: `parse` takes the file's bytes. What is checked is what the CDI specification and
its reference library check when loading a spec: unknown fields are errors (field names
match regardless of case, as the reference's JSON decoding does, so both `additionalGids`
and the specification text's `additionalGIDs` load); `cdiVersion` must be a released
version (0.3.0 … 1.1.0, an optional leading "v") and at least the version that introduced
every feature the file uses; the kind and device names follow the CDI rules; every
device has edits; env entries are KEY=VALUE; device types, cgroup permissions and hook
names are the known ones. Hooks must also have an absolute path and a positive timeout,
which the specification requires and runc would otherwise refuse only at start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from crishim.cdi.names import CDINameError, split_kind, validate_device_name

# Released spec versions, oldest first. 0.1.0 and 0.2.0 are known but, as in the
# reference library, every spec needs at least 0.3.0.
VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0",
            "1.0.0", "1.1.0")
EARLIEST = "0.3.0"
CURRENT = VERSIONS[-1]

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer",
              "poststart", "poststop")
DEVICE_TYPES = ("", "b", "c", "u", "p")
NO_PERMISSIONS = "none"

# The C loader when PyYAML was built with libyaml (much faster), else the Python one.
_Loader: type[yaml.CSafeLoader] | type[yaml.SafeLoader] = (
    yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


class SpecError(ValueError):
    """A spec file that cannot be used; the message says what is wrong where."""


@dataclass(frozen=True)
class DeviceNode:
    path: str
    host_path: str = ""  # empty: the same as path
    type: str = ""  # b, c, u, p; empty: taken from the host node
    major: int = 0  # 0 (with minor): taken from the host node
    minor: int = 0
    file_mode: int | None = None
    permissions: str = ""  # cgroup access; empty: rwm; "none": no access rule
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class IntelRdt:
    clos_id: str = ""
    l3_cache_schema: str = ""
    mem_bw_schema: str = ""
    schemata: tuple[str, ...] | None = None
    enable_monitoring: bool = False


@dataclass(frozen=True)
class NetDevice:
    host_interface_name: str
    name: str


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()
    intel_rdt: IntelRdt | None = None
    net_devices: tuple[NetDevice, ...] = ()

    def empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks
                    or self.additional_gids or self.intel_rdt or self.net_devices)


@dataclass(frozen=True)
class Device:
    name: str
    edits: ContainerEdits
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    version: str
    kind: str
    vendor: str
    cls: str
    devices: tuple[Device, ...]
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    annotations: dict[str, str] = field(default_factory=dict)

    def device(self, name: str) -> Device | None:
        for d in self.devices:
            if d.name == name:
                return d
        return None


# -- decoding ------------------------------------------------------------------------------

def load_document(data: bytes, yaml_syntax: bool) -> Any:
    """The file's content as plain data (dicts, lists, scalars)."""
    try:
        if yaml_syntax:
            return yaml.load(data, Loader=_Loader)  # a safe loader
        return json.loads(data)
    except (yaml.YAMLError, ValueError) as exc:
        kind = "YAML" if yaml_syntax else "JSON"
        raise SpecError(f"not valid {kind}: {_one_line(str(exc))}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _object(value: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    """`value`'s fields by their canonical name; unknown fields are errors."""
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object, got {_type(value)}")
    canonical = {k.lower(): k for k in known}
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = canonical.get(key.lower()) if isinstance(key, str) else None
        if name is None:
            raise SpecError(f"{where}: unknown field {key!r}")
        if item is not None:  # null is the same as absent, as in the reference
            out[name] = item
    return out


def _type(value: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _str(obj: dict[str, Any], key: str, where: str, required: bool = False) -> str:
    if key not in obj:
        if required:
            raise SpecError(f"{where}: {key} is required")
        return ""
    value = obj[key]
    if not isinstance(value, str):
        raise SpecError(f"{where}.{key} must be a string, got {_type(value)}")
    if required and not value:
        raise SpecError(f"{where}: {key} must not be empty")
    return value


def _strings(obj: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _int(obj: dict[str, Any], key: str, where: str, lo: int, hi: int) -> int | None:
    if key not in obj:
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}.{key} must be an integer, got {_type(value)}")
    if not lo <= value <= hi:
        raise SpecError(f"{where}.{key} {value} is out of range [{lo}, {hi}]")
    return value


_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)


def _env(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    for v in values:
        if v.find("=") <= 0:
            raise SpecError(f"{where}: invalid environment variable {v!r} (want KEY=VALUE)")
    return values


def _annotations(obj: dict[str, Any], where: str) -> dict[str, str]:
    value = obj.get("annotations", {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise SpecError(f"{where}.annotations must map strings to strings")
    return dict(value)


def _device_node(value: Any, where: str) -> DeviceNode:
    o = _object(value, where, ("path", "hostPath", "type", "major", "minor", "fileMode",
                               "permissions", "uid", "gid"))
    path = _str(o, "path", where, required=True)
    where = f"{where} ({path})"
    node = DeviceNode(
        path=path, host_path=_str(o, "hostPath", where), type=_str(o, "type", where),
        major=_int(o, "major", where, *_INT64) or 0, minor=_int(o, "minor", where, *_INT64) or 0,
        file_mode=_int(o, "fileMode", where, 0, 0o7777_7777),
        permissions=_str(o, "permissions", where),
        uid=_int(o, "uid", where, *_UINT32), gid=_int(o, "gid", where, *_UINT32))
    if node.type not in DEVICE_TYPES:
        raise SpecError(f"{where}: invalid type {node.type!r} (want b, c, u or p)")
    perms = node.permissions
    if perms not in ("", NO_PERMISSIONS) and perms.strip("rwm"):
        raise SpecError(f"{where}: invalid permissions {perms!r} (want letters of rwm, "
                        "or none)")
    return node


def _mount(value: Any, where: str) -> Mount:
    o = _object(value, where, ("hostPath", "containerPath", "options", "type"))
    return Mount(host_path=_str(o, "hostPath", where, required=True),
                 container_path=_str(o, "containerPath", where, required=True),
                 options=_strings(o, "options", where), type=_str(o, "type", where))


def _hook(value: Any, where: str) -> Hook:
    o = _object(value, where, ("hookName", "path", "args", "env", "timeout"))
    name = _str(o, "hookName", where)
    if name not in HOOK_NAMES:
        raise SpecError(f"{where}: invalid hookName {name!r} (want one of "
                        f"{', '.join(HOOK_NAMES)})")
    path = _str(o, "path", where, required=True)
    if not path.startswith("/"):
        raise SpecError(f"{where}: hook path {path!r} must be absolute")
    timeout = _int(o, "timeout", where, *_INT64)
    if timeout is not None and timeout <= 0:
        raise SpecError(f"{where}: hook timeout must be greater than zero, got {timeout}")
    return Hook(hook_name=name, path=path, args=_strings(o, "args", where),
                env=_env(_strings(o, "env", where), where), timeout=timeout)


def _intel_rdt(value: Any, where: str) -> IntelRdt:
    o = _object(value, where, ("closID", "l3CacheSchema", "memBwSchema", "schemata",
                               "enableMonitoring"))
    clos = _str(o, "closID", where)
    if clos != "/" and (len(clos) >= 4096 or clos in (".", "..") or "/" in clos
                        or "\n" in clos):
        raise SpecError(f"{where}: invalid closID {clos!r}")
    monitoring = o.get("enableMonitoring", False)
    if not isinstance(monitoring, bool):
        raise SpecError(f"{where}.enableMonitoring must be a boolean")
    return IntelRdt(clos_id=clos, l3_cache_schema=_str(o, "l3CacheSchema", where),
                    mem_bw_schema=_str(o, "memBwSchema", where),
                    schemata=_strings(o, "schemata", where) if "schemata" in o else None,
                    enable_monitoring=monitoring)


def _net_devices(values: list[Any], where: str) -> tuple[NetDevice, ...]:
    out: list[NetDevice] = []
    hosts: set[str] = set()
    names: set[str] = set()
    for i, value in enumerate(values):
        w = f"{where}[{i}]"
        o = _object(value, w, ("hostInterfaceName", "name"))
        dev = NetDevice(_str(o, "hostInterfaceName", w, required=True),
                        _str(o, "name", w, required=True))
        if dev.host_interface_name in hosts:
            raise SpecError(f"{w}: duplicate hostInterfaceName {dev.host_interface_name!r}")
        if dev.name in names:
            raise SpecError(f"{w}: duplicate name {dev.name!r}")
        hosts.add(dev.host_interface_name)
        names.add(dev.name)
        out.append(dev)
    return tuple(out)


def _list(o: dict[str, Any], key: str, where: str) -> list[Any]:
    value = o.get(key, [])
    if not isinstance(value, list):
        raise SpecError(f"{where}.{key} must be a list, got {_type(value)}")
    return value


def _edits(value: Any, where: str) -> ContainerEdits:
    o = _object(value, where, ("env", "deviceNodes", "mounts", "hooks", "additionalGids",
                               "intelRdt", "netDevices"))
    gids = _list(o, "additionalGids", where)
    for g in gids:
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < 2**32:
            raise SpecError(f"{where}.additionalGids: {g!r} is not a group id")
    return ContainerEdits(
        env=_env(_strings(o, "env", where), f"{where}.env"),
        device_nodes=tuple(_device_node(v, f"{where}.deviceNodes[{i}]")
                           for i, v in enumerate(_list(o, "deviceNodes", where))),
        mounts=tuple(_mount(v, f"{where}.mounts[{i}]")
                     for i, v in enumerate(_list(o, "mounts", where))),
        hooks=tuple(_hook(v, f"{where}.hooks[{i}]")
                    for i, v in enumerate(_list(o, "hooks", where))),
        additional_gids=tuple(gids),
        intel_rdt=_intel_rdt(o["intelRdt"], f"{where}.intelRdt") if "intelRdt" in o else None,
        net_devices=_net_devices(_list(o, "netDevices", where), f"{where}.netDevices"))


# -- versions ------------------------------------------------------------------------------

def _all_edits(spec: Spec) -> list[ContainerEdits]:
    return [spec.edits, *(d.edits for d in spec.devices)]


def required_version(spec: Spec) -> tuple[str, str]:
    """The lowest spec version with every feature `spec` uses, and the newest such
    feature (empty when the earliest version will do)."""
    edits = _all_edits(spec)
    if any(e.intel_rdt and (e.intel_rdt.schemata is not None or e.intel_rdt.enable_monitoring)
           for e in edits):
        return "1.1.0", "intelRdt schemata/enableMonitoring"
    if any(e.net_devices for e in edits):
        return "1.1.0", "netDevices"
    if any(e.intel_rdt for e in edits):
        return "0.7.0", "intelRdt"
    if any(e.additional_gids for e in edits):
        return "0.7.0", "additionalGids"
    if spec.annotations or any(d.annotations for d in spec.devices):
        return "0.6.0", "annotations"
    if "." in spec.cls:
        return "0.6.0", f"a dot in the class name {spec.cls!r}"
    for d in spec.devices:
        if d.name[0].isdigit():
            return "0.5.0", f"device name {d.name!r} starting with a digit"
    if any(n.host_path for e in edits for n in e.device_nodes):
        return "0.5.0", "deviceNodes hostPath"
    if any(m.type for e in edits for m in e.mounts):
        return "0.4.0", "mounts type"
    return EARLIEST, ""


def _check_version(spec: Spec) -> None:
    if spec.version not in VERSIONS:
        raise SpecError(f"cdiVersion {spec.version!r} is not a released CDI spec version "
                        f"({EARLIEST} … {CURRENT} are supported)")
    need, feature = required_version(spec)
    if VERSIONS.index(spec.version) < VERSIONS.index(need):
        why = f" ({feature} was added in {need})" if feature else ""
        raise SpecError(f"cdiVersion {spec.version} is too old for this spec: it needs at "
                        f"least {need}{why}")


# -- the whole file ------------------------------------------------------------------------

def raw_kind(doc: Any) -> str:
    """The `kind` a document declares, if it has one, even when the rest is invalid (so
    an error can be told to whoever asks for that kind's devices)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(key, str) and key.lower() == "kind" and isinstance(value, str):
                return value
    return ""


def parse_document(doc: Any) -> Spec:
    if doc is None:
        raise SpecError("the file is empty")
    o = _object(doc, "spec", ("cdiVersion", "kind", "annotations", "devices",
                              "containerEdits"))
    version = _str(o, "cdiVersion", "spec", required=True).removeprefix("v")
    kind = _str(o, "kind", "spec", required=True)
    try:
        vendor, cls = split_kind(kind)
    except CDINameError as exc:
        raise SpecError(f"invalid kind: {exc}") from None
    edits = _edits(o.get("containerEdits", {}), "containerEdits")
    devices: list[Device] = []
    seen: set[str] = set()
    raw_devices = _list(o, "devices", "spec")
    for i, value in enumerate(raw_devices):
        where = f"devices[{i}]"
        d = _object(value, where, ("name", "annotations", "containerEdits"))
        name = _str(d, "name", where, required=True)
        try:
            validate_device_name(name)
        except CDINameError as exc:
            raise SpecError(f"{where}: {exc}") from None
        where = f"device {name!r}"
        if name in seen:
            raise SpecError(f"device {name!r} is defined twice")
        seen.add(name)
        dev_edits = _edits(d.get("containerEdits", {}), f"{where} containerEdits")
        if dev_edits.empty():
            raise SpecError(f"{where} has no containerEdits")
        devices.append(Device(name, dev_edits, _annotations(d, where)))
    if not devices:
        raise SpecError("the spec defines no devices")
    spec = Spec(version=version, kind=kind, vendor=vendor, cls=cls, devices=tuple(devices),
                edits=edits, annotations=_annotations(o, "spec"))
    _check_version(spec)
    return spec


def parse(data: bytes, yaml_syntax: bool) -> Spec:
    """A spec file's bytes → Spec; raises SpecError saying what is wrong."""
    return parse_document(load_document(data, yaml_syntax))
