"""Applying a merged NRI adjustment (nri/merge.py) to a container's OCI spec.

`apply_to_spec` puts it into the spec dict container/spec.py builds, in the order and with
the semantics of containerd/nri's spec generator, with these differences, each because
the node would otherwise run something other than asked.

Resources go through the host's `ResourceMapper` (a controller the node lacks is dropped
or refused, as for CRI resources); block I/O classes are refused (crishim has no class
configuration); an RDT class becomes the CLOS id, as containerd resolves it.

Fields the OCI runtime does not know (`RuntimeSupport`, from `<runtime> features`) are
refused rather than silently ignored; an rlimit replaces one of the same type instead of
repeating it. `update_oci_resources` maps an update's resources the same way.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as cri
from crishim.cdi import edits as cdi_edits
from crishim.cdi.edits import Injection
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.cgroups import CgroupFacts
from crishim.nri.merge import marked
from crishim.oci import resources as oci_resources
from crishim.oci import spec as oci_spec
from crishim.oci.resources import ResourceMapper
from crishim.validate import resources as resource_checks


@dataclass(frozen=True)
class RuntimeSupport:
    """The optional OCI fields the container's OCI runtime applies (runc 1.1 ignores
    ioPriority, scheduler, netDevices and memoryPolicy without a word)."""

    io_priority: bool = True
    scheduler: bool = True
    net_devices: bool = True
    memory_policy: bool = True
    intel_rdt: bool = True

    @classmethod
    def from_features(cls, raw: bytes) -> RuntimeSupport:
        """From `<runtime> features` output; without one (an old runtime), everything is
        assumed, as containerd assumes it."""
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls()
        linux = doc.get("linux") if isinstance(doc.get("linux"), dict) else {}
        assert isinstance(linux, dict)

        def enabled(name: str) -> bool:
            entry = linux.get(name)
            return isinstance(entry, dict) and entry.get("enabled") is not False

        version = str(doc.get("ociVersionMax", ""))
        # ioPriority and scheduler came with runtime-spec 1.1.
        spec11 = _version(version) >= (1, 1)
        rdt = linux.get("intelRdt")
        return cls(io_priority=spec11, scheduler=spec11, net_devices=enabled("netDevices"),
                   memory_policy=enabled("memoryPolicy"),
                   intel_rdt=not (isinstance(rdt, dict) and rdt.get("enabled") is False))


def _version(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("-", 1)[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def _refuse(what: str) -> FailedPrecondition:
    return FailedPrecondition(f"an NRI plugin set {what}, which this node's OCI runtime "
                              "does not apply (see `<runtime> features`)")


def cdi_device_names(adj: nri.ContainerAdjustment) -> list[str]:
    """The CDI devices an adjustment asks for, to resolve (cdi/registry.py) before
    apply_to_spec."""
    return [d.name for d in adj.CDI_devices]


def apply_to_spec(spec: dict[str, Any], adj: nri.ContainerAdjustment, *,
                  cdi: Sequence[Injection] = (), mapper: ResourceMapper | None = None,
                  support: RuntimeSupport | None = None,
                  mountinfo: Callable[[], str] | None = None) -> None:
    """Apply a merged adjustment to `spec` (an OCI config.json dict), in place.

    `cdi`: the edits of `cdi_device_names(adj)`, resolved by the caller (CDIRegistry is
    asynchronous); `mapper`: the host's resource mapping (default: every controller,
    cgroup v2); `support`: what the OCI runtime applies; `mountinfo`: reads
    /proc/self/mountinfo, to check that a shared or slave mount's source can propagate
    (default: the real file). Blocking (CDI device stats, mountinfo): call it where the
    spec is built, on a worker thread.
    """
    mapper = mapper or ResourceMapper(CgroupFacts.everything(2))
    support = support or RuntimeSupport()
    process: dict[str, Any] = spec.setdefault("process", {})
    linux: dict[str, Any] = spec.setdefault("linux", {})
    lx = adj.linux
    _spec_annotations(spec, dict(adj.annotations))
    _spec_env(process, list(adj.env))
    if adj.args:
        process["args"] = list(adj.args)
    _spec_hooks(spec, adj.hooks)
    if adj.CDI_devices:
        names = cdi_device_names(adj)
        if len(cdi) == 0:
            raise FailedPrecondition(f"CDI devices {', '.join(names)} asked for by an NRI "
                                     "plugin were not resolved")
        cdi_edits.apply(spec, cdi)
    _spec_devices(linux, list(lx.devices))
    if lx.cgroups_path:
        linux["cgroupsPath"] = lx.cgroups_path
    if lx.HasField("oom_score_adj"):
        if not -1000 <= lx.oom_score_adj.value <= 1000:
            raise InvalidArgument(f"NRI adjustment: oom_score_adj {lx.oom_score_adj.value} "
                                  "must be in -1000..1000")
        process["oomScoreAdj"] = lx.oom_score_adj.value
    if lx.HasField("io_priority"):
        _spec_ioprio(process, lx.io_priority, support)
    if lx.HasField("scheduler"):
        _spec_scheduler(process, lx.scheduler, support)
    if lx.HasField("seccomp_policy"):
        linux["seccomp"] = seccomp_to_oci(lx.seccomp_policy)
    _spec_namespaces(linux, list(lx.namespaces))
    _spec_sysctl(linux, dict(lx.sysctl))
    _spec_net_devices(linux, dict(lx.net_devices.items()), support)
    if lx.HasField("memory_policy"):
        if not support.memory_policy:
            raise _refuse("a memory policy")
        mp = lx.memory_policy
        linux["memoryPolicy"] = {k: v for k, v in (
            ("mode", nri.MpolMode.Name(mp.mode)), ("nodes", mp.nodes),
            ("flags", [nri.MpolFlag.Name(f) for f in mp.flags])) if v}
    if lx.HasField("resources"):
        _spec_resources(linux, lx.resources, mapper)
        res = lx.resources
        if res.HasField("blockio_class"):
            if res.blockio_class.value:
                raise FailedPrecondition(
                    f"an NRI plugin set block I/O class {res.blockio_class.value!r}: crishim "
                    "has no block I/O class configuration to resolve it")
            linux.setdefault("resources", {}).pop("blockIO", None)
        if res.HasField("rdt_class"):
            if res.rdt_class.value:
                if not support.intel_rdt:
                    raise _refuse("an RDT class")
                # As containerd resolves a class: the resctrl group of that name.
                linux["intelRdt"] = {"closID": res.rdt_class.value}
            else:
                linux.pop("intelRdt", None)
    if lx.HasField("rdt"):
        _spec_rdt(linux, lx.rdt, support)
    _spec_mounts(spec, list(adj.mounts), mountinfo)
    _spec_rlimits(process, list(adj.rlimits))


def _spec_annotations(spec: dict[str, Any], values: dict[str, str]) -> None:
    annotations: dict[str, str] = spec.setdefault("annotations", {})
    for key in values:
        name, remove = marked(key)
        if remove:
            annotations.pop(name, None)
    for key, value in values.items():
        if not marked(key)[1]:
            annotations[key] = value


def _spec_env(process: dict[str, Any], env: list[nri.KeyValue]) -> None:
    if not env:
        return
    mods = {marked(e.key)[0]: e for e in env}
    out: list[str] = []
    index: dict[str, int] = {}

    def add(key: str, value: str) -> None:
        if key in index:
            out[index[key]] = f"{key}={value}"
        else:
            index[key] = len(out)
            out.append(f"{key}={value}")

    for entry in process.get("env") or ():
        if "=" not in entry:
            continue  # not a variable (containerd drops these too)
        key, value = entry.split("=", 1)
        e = mods.pop(key, None)
        if e is None:
            add(key, value)
        elif not marked(e.key)[1]:
            add(e.key, e.value)
    for e in env:
        if not marked(e.key)[1] and e.key in mods:
            add(e.key, e.value)
    process["env"] = out


_HOOKS = (("prestart", "prestart"), ("poststart", "poststart"), ("poststop", "poststop"),
          ("create_runtime", "createRuntime"), ("create_container", "createContainer"),
          ("start_container", "startContainer"))


def hook_to_oci(h: nri.Hook) -> dict[str, Any]:
    out: dict[str, Any] = {"path": h.path}
    if h.args:
        out["args"] = list(h.args)
    if h.env:
        out["env"] = list(h.env)
    if h.HasField("timeout"):
        out["timeout"] = h.timeout.value
    return out


def _spec_hooks(spec: dict[str, Any], hooks: nri.Hooks) -> None:
    for name, oci_name in _HOOKS:
        for h in getattr(hooks, name):
            if not h.path.startswith("/"):
                raise InvalidArgument(f"NRI adjustment: {oci_name} hook path {h.path!r} "
                                      "must be absolute")
            spec.setdefault("hooks", {}).setdefault(oci_name, []).append(hook_to_oci(h))


def device_access(d: nri.LinuxDevice) -> str:
    """The cgroup access an injected device gets: read-write, plus mknod for block
    devices (containerd/nri's rule, whatever the file mode)."""
    return "rwm" if d.type == "b" else "rw"


def _spec_devices(linux: dict[str, Any], devices: list[nri.LinuxDevice]) -> None:
    for d in devices:
        path, remove = marked(d.path)
        linux["devices"] = [x for x in linux.get("devices") or () if x.get("path") != path]
        if remove:
            continue
        if d.type not in ("c", "b", "u", "p"):
            raise InvalidArgument(f"NRI adjustment: device {d.path} has type {d.type!r}; "
                                  "it must be c, b, u or p")
        dev: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major,
                               "minor": d.minor}
        if d.HasField("file_mode"):
            # Permission bits only: the rest of a Go FileMode is not a Unix mode.
            dev["fileMode"] = d.file_mode.value & 0o777
        if d.HasField("uid"):
            dev["uid"] = d.uid.value
        if d.HasField("gid"):
            dev["gid"] = d.gid.value
        linux["devices"].append(dev)
        rules: list[dict[str, Any]] = linux.setdefault("resources", {}).setdefault("devices", [])
        rules.append({"allow": True, "type": d.type, "major": d.major, "minor": d.minor,
                      "access": device_access(d)})


_IOPRIO_MAX = 7


def _spec_ioprio(process: dict[str, Any], io: nri.LinuxIOPriority,
                 support: RuntimeSupport) -> None:
    cls = getattr(io, "class")
    if cls == nri.IOPRIO_CLASS_NONE:
        process.pop("ioPriority", None)
        return
    if not support.io_priority:
        raise _refuse("an I/O priority")
    if not 0 <= io.priority <= _IOPRIO_MAX:
        raise InvalidArgument(f"NRI adjustment: I/O priority {io.priority} must be in "
                              f"0..{_IOPRIO_MAX}")
    process["ioPriority"] = {"class": nri.IOPrioClass.Name(cls), "priority": io.priority}


def _spec_scheduler(process: dict[str, Any], s: nri.LinuxScheduler,
                    support: RuntimeSupport) -> None:
    if s.policy == nri.SCHED_NONE:
        process.pop("scheduler", None)
        return
    if not support.scheduler:
        raise _refuse("a scheduling policy")
    out: dict[str, Any] = {"policy": nri.LinuxSchedulerPolicy.Name(s.policy)}
    for key, value in (("nice", s.nice), ("priority", s.priority), ("runtime", s.runtime),
                       ("deadline", s.deadline), ("period", s.period)):
        if value:
            out[key] = value
    if s.flags:
        out["flags"] = [nri.LinuxSchedulerFlag.Name(f) for f in s.flags]
    process["scheduler"] = out


def seccomp_to_oci(p: nri.LinuxSeccomp) -> dict[str, Any]:
    """An NRI seccomp policy as the OCI linux.seccomp object."""
    out: dict[str, Any] = {"defaultAction": p.default_action}
    if p.HasField("default_errno"):
        out["defaultErrnoRet"] = p.default_errno.value
    if p.architectures:
        out["architectures"] = list(p.architectures)
    if p.flags:
        out["flags"] = list(p.flags)
    if p.listener_path:
        out["listenerPath"] = p.listener_path
    if p.listener_metadata:
        out["listenerMetadata"] = p.listener_metadata
    syscalls = []
    for s in p.syscalls:
        call: dict[str, Any] = {"names": list(s.names), "action": s.action}
        if s.HasField("errno_ret"):
            call["errnoRet"] = s.errno_ret.value
        if s.args:
            call["args"] = [{"index": a.index, "value": a.value, "valueTwo": a.value_two,
                             "op": a.op} for a in s.args]
        syscalls.append(call)
    if syscalls:
        out["syscalls"] = syscalls
    return out


_NAMESPACES = ("pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time")


def _spec_namespaces(linux: dict[str, Any], namespaces: list[nri.LinuxNamespace]) -> None:
    for n in namespaces:
        kind, remove = marked(n.type)
        if kind not in _NAMESPACES:
            raise InvalidArgument(f"NRI adjustment: unknown namespace type {kind!r}")
        current = [x for x in linux.get("namespaces") or () if x.get("type") != kind]
        if not remove:
            entry = {"type": kind}
            if n.path:
                entry["path"] = n.path
            # Replaced where it was, so the runtime joins namespaces in the same order.
            old = [i for i, x in enumerate(linux.get("namespaces") or ())
                   if x.get("type") == kind]
            current.insert(old[0] if old else len(current), entry)
        linux["namespaces"] = current


_SYSCTL_NS = {"net": "network", "uts": "uts", "ipc": "ipc"}


def _spec_sysctl(linux: dict[str, Any], values: dict[str, str]) -> None:
    sysctl: dict[str, str] = linux.setdefault("sysctl", {}) if values else {}
    own = {n.get("type") for n in linux.get("namespaces") or ()}
    for key, value in values.items():
        name, remove = marked(key)
        if remove:
            sysctl.pop(name, None)
            continue
        # What runc would refuse at start, refused here with the reason.
        ns = oci_spec.sysctl_namespace(name)
        if ns is None:
            raise InvalidArgument(f"NRI adjustment: sysctl {name} is not namespaced: it "
                                  "would change the node")
        if _SYSCTL_NS[ns] not in own:
            raise InvalidArgument(f"NRI adjustment: sysctl {name} belongs to the "
                                  f"{_SYSCTL_NS[ns]} namespace, which this container "
                                  "shares with the node")
        sysctl[name] = value


def _spec_net_devices(linux: dict[str, Any], devices: dict[str, nri.LinuxNetDevice],
                      support: RuntimeSupport) -> None:
    for key, dev in devices.items():
        name, remove = marked(key)
        if remove:
            linux.get("netDevices", {}).pop(name, None)
            continue
        if not support.net_devices:
            raise _refuse(f"net device {name}")
        linux.setdefault("netDevices", {})[name] = {"name": dev.name} if dev.name else {}


def _spec_rdt(linux: dict[str, Any], rdt: nri.LinuxRdt, support: RuntimeSupport) -> None:
    if rdt.remove:
        linux.pop("intelRdt", None)
    values: dict[str, Any] = {}
    if rdt.HasField("clos_id"):
        values["closID"] = rdt.clos_id.value
    if rdt.HasField("schemata"):
        values["schemata"] = list(rdt.schemata.value)
    if rdt.HasField("enable_monitoring"):
        values["enableMonitoring"] = rdt.enable_monitoring.value
    if values:
        if not support.intel_rdt:
            raise _refuse("Intel RDT")
        linux.setdefault("intelRdt", {}).update(values)


def _spec_resources(linux: dict[str, Any], res: nri.LinuxResources,
                    mapper: ResourceMapper) -> None:
    """Memory limit, cpu, hugepages, unified, pids and device rules, checked and mapped
    as the CRI's (oci/resources.py), so a controller the node lacks is handled alike."""
    out: dict[str, Any] = linux.setdefault("resources", {})
    crires = cri.LinuxContainerResources()
    if res.HasField("cpu"):
        c = res.cpu
        # Unsigned in NRI, signed in the CRI: past int64 is no value the kernel takes.
        for name, value in (("cpu_shares", c.shares.value), ("cpu_period", c.period.value)):
            if value >= 1 << 63:
                raise InvalidArgument(f"NRI adjustment: cpu {name} {value} is out of range")
            setattr(crires, name, value)
        crires.cpu_quota = c.quota.value
        crires.cpuset_cpus, crires.cpuset_mems = c.cpus, c.mems
    # Only the limit counts, and swap follows it (no swap beyond the limit), as in
    # containerd/nri's generator.
    if res.HasField("memory") and res.memory.limit.value:
        crires.memory_limit_in_bytes = res.memory.limit.value
    crires.hugepage_limits.extend(cri.HugepageLimit(page_size=h.page_size, limit=h.limit)
                                  for h in res.hugepage_limits)
    crires.unified.update(res.unified)
    try:
        resource_checks.check(crires, mapper.cgroups.v2)
    except InvalidArgument as exc:
        raise InvalidArgument(f"NRI adjustment: {exc}") from None
    mapped = mapper.linux(crires)
    if "cpu" in mapped:
        out.setdefault("cpu", {}).update(mapped["cpu"])
    if res.HasField("cpu"):
        for name, key in (("realtime_runtime", "realtimeRuntime"),
                          ("realtime_period", "realtimePeriod")):
            if res.cpu.HasField(name):
                _require(mapper, "cpu", f"cpu {key}")
                if mapper.cgroups.has("cpu"):
                    out.setdefault("cpu", {})[key] = getattr(res.cpu, name).value
    if "memory" in mapped:
        out.setdefault("memory", {}).update(mapped["memory"])
    for h in mapped.get("hugepageLimits", ()):
        limits: list[dict[str, Any]] = out.setdefault("hugepageLimits", [])
        limits[:] = [x for x in limits if x.get("pageSize") != h["pageSize"]] + [h]
    if "unified" in mapped:
        out.setdefault("unified", {}).update(mapped["unified"])
    if res.HasField("pids") and res.pids.limit > -1:
        _require(mapper, "pids", "a pids limit")
        if mapper.cgroups.has("pids"):
            out["pids"] = {"limit": res.pids.limit}
    for d in res.devices:
        if d.type not in ("", "a", "c", "b"):
            raise InvalidArgument(f"NRI adjustment: device rule type {d.type!r} must be "
                                  "a, c or b")
        rule: dict[str, Any] = {"allow": d.allow, "access": d.access}
        if d.type:
            rule["type"] = d.type
        if d.HasField("major"):
            rule["major"] = d.major.value
        if d.HasField("minor"):
            rule["minor"] = d.minor.value
        out.setdefault("devices", []).append(rule)


def _require(mapper: ResourceMapper, controller: str, what: str) -> None:
    if mapper.policy == oci_resources.FAIL and not mapper.cgroups.has(controller):
        raise FailedPrecondition(f"an NRI plugin set {what}, which needs the {controller} "
                                 "cgroup controller this node does not have")


def _clean(path: str) -> str:
    return "/" + os.path.normpath("/" + path).lstrip("/")


def _depth(path: str) -> int:
    return _clean(path).count("/") if _clean(path) != "/" else 0


def mount_to_oci(m: nri.Mount) -> tuple[dict[str, Any], str]:
    """An NRI mount as an OCI one, and the last propagation option it names ("" if
    none)."""
    propagation = ""
    for opt in m.options:
        if opt in ("rprivate", "rshared", "rslave"):
            propagation = opt
    out: dict[str, Any] = {"destination": m.destination}
    if m.type:
        out["type"] = m.type
    if m.source:
        out["source"] = m.source
    if m.options:
        out["options"] = list(m.options)
    return out, propagation


def _read_mountinfo() -> str:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def source_propagation(source: str, mountinfo: str) -> set[str]:
    """The propagation of the mount `source` lies on: {"shared"}, {"slave"}, both, or
    empty (private). From mountinfo's optional fields of the longest matching mount."""
    best, tags = "", set[str]()
    path = os.path.normpath(source)
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 7:
            continue
        point = fields[4].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and \
                len(point) >= len(best):
            best = point
            opts = fields[6:fields.index("-")] if "-" in fields else []
            tags = {o.split(":", 1)[0] for o in opts if ":" in o} & {"shared", "master"}
    return {"slave" if t == "master" else t for t in tags}


def _spec_mounts(spec: dict[str, Any], mounts: list[nri.Mount],
                 mountinfo: Callable[[], str] | None) -> None:
    if not mounts:
        return
    linux: dict[str, Any] = spec.setdefault("linux", {})
    current: list[dict[str, Any]] = spec.setdefault("mounts", [])
    info: str | None = None
    for m in mounts:
        dest, remove = marked(m.destination)
        current[:] = [x for x in current if _clean(x.get("destination", "")) != _clean(dest)]
        if remove:
            continue
        if not m.destination.startswith("/"):
            raise InvalidArgument(f"NRI adjustment: mount destination {m.destination!r} "
                                  "must be absolute")
        mount, propagation = mount_to_oci(m)
        if propagation in ("rshared", "rslave"):
            if info is None:
                info = (mountinfo or _read_mountinfo)()
            have = source_propagation(m.source, info) if m.source.startswith("/") \
                else {"shared"}
            wanted = {"shared"} if propagation == "rshared" else {"shared", "slave"}
            if not have & wanted:
                raise FailedPrecondition(
                    f"NRI adjustment: mount {m.destination} asks for {propagation} "
                    f"propagation but its source {m.source} is not on a "
                    f"{' or '.join(sorted(wanted))} mount")
            root = linux.get("rootfsPropagation", "")
            if propagation == "rshared":
                linux["rootfsPropagation"] = "rshared"
            elif root not in ("rshared", "rslave"):
                linux["rootfsPropagation"] = "rslave"
        current.append(mount)
    # Parents before children; the same order containerd/nri's generator sorts into.
    current.sort(key=lambda x: (_depth(x.get("destination", "")), x.get("destination", "")))


def _spec_rlimits(process: dict[str, Any], rlimits: list[nri.POSIXRlimit]) -> None:
    for r in rlimits:
        if not r.type.startswith("RLIMIT_"):
            raise InvalidArgument(f"NRI adjustment: rlimit type {r.type!r} is not an "
                                  "RLIMIT_* name")
        if r.soft > r.hard:
            raise InvalidArgument(f"NRI adjustment: {r.type} soft limit {r.soft} is above "
                                  f"its hard limit {r.hard}")
        limits: list[dict[str, Any]] = process.setdefault("rlimits", [])
        # One entry per type: a repeated type is what the runtime spec forbids.
        limits[:] = [x for x in limits if x.get("type") != r.type]
        limits.append({"type": r.type, "hard": r.hard, "soft": r.soft})


# --- updates --------------------------------------------------------------------------


def update_oci_resources(base: Mapping[str, Any], changes: nri.LinuxResources,
                         mapper: ResourceMapper) -> dict[str, Any]:
    """The OCI resources of an update (`base`) with what the plugins set for the
    container itself (`changes`), checked and mapped to the host as the CRI's are (a
    memory limit brings its swap along, as in containerd/nri's generator)."""
    linux: dict[str, Any] = {"resources": copy.deepcopy(dict(base))}
    _spec_resources(linux, changes, mapper)
    out: dict[str, Any] = linux["resources"]
    return out
