"""NRI container adjustments: merging what several plugins return, and applying the
result to a container's OCI spec.

`Result` collects one CreateContainer's replies, plugin by plugin in index order, as
containerd/nri's adaptation does: every field a plugin sets is claimed by it (per
container, per key for maps and lists keyed by name), and a second plugin setting a field
already claimed is refused (`AdjustmentConflict`, naming both plugins and the field). A
key starting with "-" (annotations, env, mounts by destination, devices by path,
namespaces by type, sysctls, net devices; args starting with "") removes what earlier
plugins or the runtime put there, and releases the claim so the remover may set it anew.
Hooks are never a conflict: they accumulate, with every contributor recorded. A removal
of something the runtime itself set (an env variable, a device, a mount) stays in the
merged adjustment as its marker, so the spec loses it too (containerd/nri keeps only the
mounts' markers, and a plugin's removal of an image's variable is lost there).

`apply_to_spec` puts a merged adjustment into the OCI spec dict container/spec.py builds,
in the order and with the semantics of containerd/nri's spec generator, with these
differences, each because the node would otherwise run something other than asked:
resources go through the host's `ResourceMapper` (a controller the node lacks is dropped
or refused, as for CRI resources); block I/O classes are refused (crishim has no class
configuration); an RDT class becomes the CLOS id, as containerd resolves it; fields the
OCI runtime does not know (`RuntimeSupport`, from `<runtime> features`) are refused rather
than silently ignored; an rlimit replaces one of the same type instead of repeating it.

`UpdateResult` merges the replies to UpdateContainer and StopContainer the same way (the
resources asked for the container itself, updates of others); `update_to_resources` turns
a merged update into the CRI resources that go through UpdateContainerResources.
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
from crishim.oci import resources as oci_resources
from crishim.oci import spec as oci_spec
from crishim.oci.resources import ResourceMapper

F = nri.Field


class AdjustmentConflict(FailedPrecondition):
    """Two plugins set the same field of a container."""


def marked(key: str) -> tuple[str, bool]:
    """(key without the removal marker, whether it had one)."""
    if key.startswith("-"):
        return key[1:], True
    return key, False


def _field_name(field: int) -> str:
    return nri.Field.Name(field)  # type: ignore[arg-type]


class Owners:
    """Which plugin set which field of which container (containerd/nri's OwningPlugins).
    A cleared claim is stored as "-<plugin>": only that plugin may claim it again
    without a conflict."""

    def __init__(self) -> None:
        self.simple: dict[str, dict[int, str]] = {}
        self.compound: dict[str, dict[int, dict[str, str]]] = {}

    def _conflict(self, field: int, plugin: str, other: str, key: str = "") -> None:
        what = _field_name(field) + (f" {key}" if key else "")
        raise AdjustmentConflict(f"NRI plugins {plugin!r} and {other!r} both tried to set "
                                 f"{what}")

    def claim(self, ctr: str, field: int, plugin: str) -> None:
        owners = self.simple.setdefault(ctr, {})
        other = owners.get(field)
        if other is not None:
            clearer, was_cleared = marked(other)
            if not (was_cleared and clearer == plugin):
                self._conflict(field, plugin, clearer)
        owners[field] = plugin

    def claim_key(self, ctr: str, field: int, key: str, plugin: str) -> None:
        owners = self.compound.setdefault(ctr, {}).setdefault(field, {})
        other = owners.get(key)
        if other is not None:
            clearer, was_cleared = marked(other)
            if not (was_cleared and clearer == plugin):
                self._conflict(field, plugin, clearer, key)
        owners[key] = plugin

    def clear(self, ctr: str, field: int, plugin: str) -> None:
        self.simple.setdefault(ctr, {})[field] = "-" + plugin

    def clear_key(self, ctr: str, field: int, key: str, plugin: str) -> None:
        self.compound.setdefault(ctr, {}).setdefault(field, {})[key] = "-" + plugin

    def accumulate(self, ctr: str, field: int, plugin: str) -> None:
        owners = self.simple.setdefault(ctr, {})
        old = owners.get(field)
        owners[field] = f"{old},{plugin}" if old else plugin

    def owner(self, ctr: str, field: int) -> str | None:
        return self.simple.get(ctr, {}).get(field)

    def key_owners(self, ctr: str, field: int) -> dict[str, str]:
        return dict(self.compound.get(ctr, {}).get(field, {}))

    def to_proto(self) -> nri.OwningPlugins:
        out = nri.OwningPlugins()
        for ctr in sorted(set(self.simple) | set(self.compound)):
            fo = out.owners[ctr]
            fo.simple.update(self.simple.get(ctr, {}))
            for field, keys in self.compound.get(ctr, {}).items():
                fo.compound[field].owners.update(keys)
        return out


def _replace(repeated: Any, items: Sequence[Any]) -> None:
    """Set a repeated message field to `items` (copies, so aliasing is harmless)."""
    kept = [copy.deepcopy(i) for i in items]
    del repeated[:]
    repeated.extend(kept)


def _env_key(entry: str) -> str:
    return entry.split("=", 1)[0]


class _Updates:
    """Plugins' updates of containers, merged one per container with the owners'
    rules (containerd/nri's result for updates)."""

    def __init__(self, owners: Owners) -> None:
        self.owners = owners
        # Of containers other than the one the event is about, in first-asked order.
        self.updates: list[nri.ContainerUpdate] = []
        self._updates: dict[str, nri.ContainerUpdate] = {}

    def _target(self, plugin: str, u: nri.ContainerUpdate) -> nri.ContainerUpdate:
        merged = self._updates.get(u.container_id)
        if merged is None:
            merged = nri.ContainerUpdate(container_id=u.container_id,
                                         ignore_failure=u.ignore_failure)
            merged.linux.resources.SetInParent()
            self._updates[u.container_id] = merged
            self.updates.append(merged)
        else:
            merged.ignore_failure = merged.ignore_failure and u.ignore_failure
        return merged

    def apply_updates(self, plugin: str, updates: Sequence[nri.ContainerUpdate]) -> None:
        """Merge one plugin's updates. An update conflicting with an earlier plugin's
        raises AdjustmentConflict unless it says ignore_failure (then it is dropped
        whole)."""
        for u in updates:
            merged = self._target(plugin, u)
            if not (u.HasField("linux") and u.linux.HasField("resources")):
                continue
            # On a copy: an ignored failure leaves the merged update as it was.
            work = copy.deepcopy(merged.linux.resources)
            try:
                _merge_resources(self.owners, u.container_id, plugin, u.linux.resources,
                                 work, None)
            except AdjustmentConflict:
                if not u.ignore_failure:
                    raise
                continue
            merged.linux.resources.CopyFrom(work)


class Result(_Updates):
    """One CreateContainer's collected result. `container` is the container as the next
    plugin is shown it (the runtime's, with the earlier plugins' adjustments applied:
    containerd sends CreateContainer to the plugins one after the other, each seeing the
    earlier ones' changes); `adjustment` the merged adjustment; `updates` the merged
    updates of other containers (one per container)."""

    def __init__(self, pod: nri.PodSandbox, ctr: nri.Container) -> None:
        super().__init__(Owners())
        self.pod = pod
        self.container = copy.deepcopy(ctr)
        self.adjustment = nri.ContainerAdjustment()

    def _target(self, plugin: str, u: nri.ContainerUpdate) -> nri.ContainerUpdate:
        if u.container_id == self.id:
            raise FailedPrecondition(f"NRI plugin {plugin!r} asked to update container "
                                     f"{u.container_id} while it is being created")
        return super()._target(plugin, u)

    @property
    def id(self) -> str:
        return self.container.id

    def validation_request(self, pristine: nri.Container, plugins: Sequence[tuple[str, str]]
                           ) -> nri.ValidateContainerAdjustmentRequest:
        """What validators are asked: `pristine` is the container before any plugin,
        `plugins` the (name, index) of the plugins consulted."""
        req = nri.ValidateContainerAdjustmentRequest(pod=self.pod, container=pristine,
                                                     adjust=self.adjustment,
                                                     update=self.updates,
                                                     owners=self.owners.to_proto())
        req.plugins.extend(nri.PluginInstance(name=n, index=i) for n, i in plugins)
        return req

    # --- adjustments -------------------------------------------------------------

    def apply_adjustment(self, plugin: str, adj: nri.ContainerAdjustment) -> None:
        """Merge one plugin's adjustment; raises AdjustmentConflict."""
        self._annotations(plugin, dict(adj.annotations))
        self._mounts(plugin, list(adj.mounts))
        self._env(plugin, list(adj.env))
        self._args(plugin, list(adj.args))
        if adj.HasField("hooks"):
            self._hooks(plugin, adj.hooks)
        if adj.HasField("linux"):
            lx = adj.linux
            self._devices(plugin, list(lx.devices))
            if lx.HasField("resources"):
                self._resources(plugin, lx.resources)
            self._linux_scalars(plugin, lx)
            self._namespaces(plugin, list(lx.namespaces))
            self._sysctl(plugin, dict(lx.sysctl))
            self._net_devices(plugin, {k: v for k, v in lx.net_devices.items()})
            if lx.HasField("rdt"):
                self._rdt(plugin, lx.rdt)
        for r in adj.rlimits:
            self.owners.claim_key(self.id, F.Rlimits, r.type, plugin)
            self.container.rlimits.append(r)
            self.adjustment.rlimits.append(r)
        for d in adj.CDI_devices:
            # Opaque references resolved by the runtime: added only, each by one plugin.
            self.owners.claim_key(self.id, F.CdiDevices, d.name, plugin)
            self.adjustment.CDI_devices.append(d)

    def _keyed_map(self, plugin: str, values: dict[str, Any], field: int,
                   target: Any, reply: Any, message: bool) -> None:
        """Annotations, sysctls, net devices: a "-key" removes, a key sets (claimed)."""
        removed = {marked(k)[0] for k in values if marked(k)[1]}

        def put(where: Any, key: str, value: Any) -> None:
            if message:
                where[key].CopyFrom(value)
            else:
                where[key] = value

        for key, value in values.items():
            if marked(key)[1]:
                continue
            if key in removed:
                self.owners.clear_key(self.id, field, key, plugin)
                removed.discard(key)
            self.owners.claim_key(self.id, field, key, plugin)
            reply.pop("-" + key, None)
            put(target, key, value)
            put(reply, key, value)
        for key in removed:
            target.pop(key, None)
            reply.pop(key, None)
            put(reply, "-" + key, nri.LinuxNetDevice() if message else "")

    def _annotations(self, plugin: str, values: dict[str, str]) -> None:
        if values:
            self._keyed_map(plugin, values, F.Annotations, self.container.annotations,
                            self.adjustment.annotations, False)

    def _sysctl(self, plugin: str, values: dict[str, str]) -> None:
        if values:
            self._keyed_map(plugin, values, F.Sysctl, self.container.linux.sysctl,
                            self.adjustment.linux.sysctl, False)

    def _net_devices(self, plugin: str, values: dict[str, nri.LinuxNetDevice]) -> None:
        if values:
            self._keyed_map(plugin, dict(values), F.LinuxNetDevices,
                            self.container.linux.net_devices,
                            self.adjustment.linux.net_devices, True)

    def _keyed_list(self, plugin: str, items: Sequence[Any], key: Callable[[Any], str],
                    field: int, target: Any, target_key: Callable[[Any], str],
                    reply: Any, keep_removals: bool) -> list[Any]:
        """Mounts, devices, env: "-key" entries remove, others add or replace (claimed).
        Returns the added entries (for the container shown to the next plugin)."""
        add = [i for i in items if not marked(key(i))[1]]
        removed = {marked(key(i))[0]: i for i in items if marked(key(i))[1]}
        modified = {key(i) for i in add}
        kept = []
        for r in reply:
            if key(r) in removed:
                self.owners.clear_key(self.id, field, key(r), plugin)
                continue
            kept.append(r)
        _replace(reply, kept)
        _replace(target, [t for t in target if target_key(t) not in removed
                          and target_key(t) not in modified])
        for i in add:
            self.owners.claim_key(self.id, field, key(i), plugin)
            reply.append(i)
        if keep_removals:
            # The runtime's own entries must go too: the marker stays in the result.
            for k, i in removed.items():
                if k not in modified:
                    reply.append(i)
        return add

    def _mounts(self, plugin: str, mounts: list[nri.Mount]) -> None:
        if not mounts:
            return
        added = self._keyed_list(plugin, mounts, lambda m: m.destination, F.Mounts,
                                 self.container.mounts, lambda m: m.destination,
                                 self.adjustment.mounts, keep_removals=True)
        self.container.mounts.extend(added)

    def _devices(self, plugin: str, devices: list[nri.LinuxDevice]) -> None:
        if not devices:
            return
        added = self._keyed_list(plugin, devices, lambda d: d.path, F.Devices,
                                 self.container.linux.devices, lambda d: d.path,
                                 self.adjustment.linux.devices, keep_removals=True)
        self.container.linux.devices.extend(added)

    def _env(self, plugin: str, env: list[nri.KeyValue]) -> None:
        if not env:
            return
        added = self._keyed_list(plugin, env, lambda e: e.key, F.Env,
                                 self.container.env, _env_key, self.adjustment.env,
                                 keep_removals=True)
        self.container.env.extend(f"{e.key}={e.value}" for e in added)

    def _args(self, plugin: str, args: list[str]) -> None:
        if not args:
            return
        if args[0] == "":
            self.owners.clear(self.id, F.Args, plugin)
            args = args[1:]
        self.owners.claim(self.id, F.Args, plugin)
        _replace(self.adjustment.args, args)
        _replace(self.container.args, args)

    def _hooks(self, plugin: str, hooks: nri.Hooks) -> None:
        claimed = False
        for name in ("prestart", "create_runtime", "create_container", "start_container",
                     "poststart", "poststop"):
            added = list(getattr(hooks, name))
            if added:
                getattr(self.adjustment.hooks, name).extend(added)
                getattr(self.container.hooks, name).extend(added)
                claimed = True
        if claimed:
            self.owners.accumulate(self.id, F.OciHooks, plugin)

    def _namespaces(self, plugin: str, namespaces: list[nri.LinuxNamespace]) -> None:
        if not namespaces:
            return
        current = {n.type: n for n in self.container.linux.namespaces}
        for n in namespaces:
            kind, remove = marked(n.type)
            self.owners.claim_key(self.id, F.Namespace, kind, plugin)
            if remove:
                current.pop(kind, None)
            else:
                current[kind] = n
            self.adjustment.linux.namespaces.append(n)
        _replace(self.container.linux.namespaces, list(current.values()))

    def _linux_scalars(self, plugin: str, lx: nri.LinuxContainerAdjustment) -> None:
        target, reply = self.container.linux, self.adjustment.linux
        if lx.cgroups_path:
            self.owners.claim(self.id, F.CgroupsPath, plugin)
            target.cgroups_path = reply.cgroups_path = lx.cgroups_path
        for name, field in (("oom_score_adj", F.OomScoreAdj), ("io_priority", F.IoPriority),
                            ("seccomp_policy", F.SeccompPolicy),
                            ("scheduler", F.LinuxSched)):
            if lx.HasField(name):
                self.owners.claim(self.id, field, plugin)
                getattr(target, name).CopyFrom(getattr(lx, name))
                getattr(reply, name).CopyFrom(getattr(lx, name))
        if lx.HasField("memory_policy"):
            self.owners.claim(self.id, F.MemoryPolicy, plugin)
            reply.memory_policy.CopyFrom(lx.memory_policy)

    def _rdt(self, plugin: str, rdt: nri.LinuxRdt) -> None:
        reply = self.adjustment.linux.rdt
        if rdt.remove:
            for field in (F.RdtClosID, F.RdtSchemata, F.RdtEnableMonitoring):
                self.owners.clear(self.id, field, plugin)
            reply.Clear()
            reply.remove = True
        for name, field in (("clos_id", F.RdtClosID), ("schemata", F.RdtSchemata),
                            ("enable_monitoring", F.RdtEnableMonitoring)):
            if rdt.HasField(name):
                self.owners.claim(self.id, field, plugin)
                getattr(reply, name).CopyFrom(getattr(rdt, name))
                reply.remove = False
        reply.SetInParent()

    def _resources(self, plugin: str, res: nri.LinuxResources) -> None:
        target = self.container.linux.resources
        reply = self.adjustment.linux.resources
        _merge_resources(self.owners, self.id, plugin, res, target, reply)
        for d in res.devices:
            target.devices.append(d)
            reply.devices.append(d)


class UpdateResult(_Updates):
    """One UpdateContainer's (or StopContainer's) collected replies: the plugins may
    change the resources asked for the container itself (`requested`, None for
    StopContainer) and update others (`updates`)."""

    def __init__(self, container_id: str = "",
                 requested: nri.LinuxResources | None = None) -> None:
        super().__init__(Owners())
        self.container_id = container_id
        self.requested = copy.deepcopy(requested) if requested is not None else None

    def _target(self, plugin: str, u: nri.ContainerUpdate) -> nri.ContainerUpdate:
        if self.requested is not None and u.container_id == self.container_id:
            merged = self._updates.get(u.container_id)
            if merged is None:
                # Starts from what was asked; not listed with the others' updates.
                merged = nri.ContainerUpdate(container_id=u.container_id)
                merged.linux.resources.CopyFrom(self.requested)
                self._updates[u.container_id] = merged
            return merged
        return super()._target(plugin, u)

    def apply_updates(self, plugin: str, updates: Sequence[nri.ContainerUpdate]) -> None:
        super().apply_updates(plugin, updates)
        mine = self._updates.get(self.container_id)
        if self.requested is not None and mine is not None:
            self.requested.CopyFrom(mine.linux.resources)


def _merge_resources(owners: Owners, ctr: str, plugin: str, res: nri.LinuxResources,
                     target: nri.LinuxResources, reply: nri.LinuxResources | None) -> None:
    """Claim and copy every resource `res` sets into `target` (and `reply`)."""
    outs = [target] + ([reply] if reply is not None else [])
    mem_fields = (("limit", F.MemLimit), ("reservation", F.MemReservation),
                  ("swap", F.MemSwapLimit), ("kernel", F.MemKernelLimit),
                  ("kernel_tcp", F.MemTCPLimit), ("swappiness", F.MemSwappiness),
                  ("disable_oom_killer", F.MemDisableOomKiller),
                  ("use_hierarchy", F.MemUseHierarchy))
    if res.HasField("memory"):
        _claim_copy(owners, ctr, plugin, res.memory, [o.memory for o in outs], mem_fields)
    cpu_fields = (("shares", F.CPUShares), ("quota", F.CPUQuota), ("period", F.CPUPeriod),
                  ("realtime_runtime", F.CPURealtimeRuntime),
                  ("realtime_period", F.CPURealtimePeriod))
    if res.HasField("cpu"):
        _claim_copy(owners, ctr, plugin, res.cpu, [o.cpu for o in outs], cpu_fields)
        if res.cpu.cpus:
            owners.claim(ctr, F.CPUSetCPUs, plugin)
            for o in outs:
                o.cpu.cpus = res.cpu.cpus
        if res.cpu.mems:
            owners.claim(ctr, F.CPUSetMems, plugin)
            for o in outs:
                o.cpu.mems = res.cpu.mems
    for h in res.hugepage_limits:
        owners.claim_key(ctr, F.HugepageLimits, h.page_size, plugin)
        for o in outs:
            o.hugepage_limits.append(h)
    for key, value in res.unified.items():
        owners.claim_key(ctr, F.CgroupsUnified, key, plugin)
        for o in outs:
            o.unified[key] = value
    _claim_copy(owners, ctr, plugin, res, outs, (
        ("blockio_class", F.BlockioClass), ("rdt_class", F.RdtClass), ("pids", F.PidsLimit)))


def _claim_copy(owners: Owners, ctr: str, plugin: str, src: Any, dsts: list[Any],
                fields: tuple[tuple[str, int], ...]) -> None:
    """Claim each optional field `src` sets and copy it into every message of `dsts`."""
    for name, field in fields:
        if src.HasField(name):
            owners.claim(ctr, field, plugin)
            for d in dsts:
                getattr(d, name).CopyFrom(getattr(src, name))


# --- the OCI spec ---------------------------------------------------------------------


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
        oci_resources.validate(crires, mapper.cgroups.v2)
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


def applied_resources(requested: cri.LinuxContainerResources,
                      adj: nri.ContainerAdjustment) -> cri.LinuxContainerResources:
    """The CRI resources a container gets once `adj` is applied over `requested`: what
    ContainerStatus reports, as containerd reports the created spec's values (cpu,
    cpusets, memory and swap limits, hugepages, unified, OOM score)."""
    out = with_nri_resources(requested, adj.linux.resources)
    if adj.linux.HasField("oom_score_adj"):
        out.oom_score_adj = adj.linux.oom_score_adj.value
    return out


def with_nri_resources(requested: cri.LinuxContainerResources,
                       r: nri.LinuxResources) -> cri.LinuxContainerResources:
    """`requested` with what a plugin set in `r` (an adjustment's or an update's)."""
    out = cri.LinuxContainerResources()
    out.CopyFrom(requested)
    if r.memory.HasField("limit"):
        out.memory_limit_in_bytes = r.memory.limit.value
    if r.memory.HasField("swap"):
        out.memory_swap_limit_in_bytes = r.memory.swap.value
    if r.cpu.HasField("shares"):
        out.cpu_shares = r.cpu.shares.value
    if r.cpu.HasField("quota"):
        out.cpu_quota = r.cpu.quota.value
    if r.cpu.HasField("period"):
        out.cpu_period = r.cpu.period.value
    if r.cpu.cpus:
        out.cpuset_cpus = r.cpu.cpus
    if r.cpu.mems:
        out.cpuset_mems = r.cpu.mems
    if r.hugepage_limits:
        sizes = {h.page_size: h.limit for h in out.hugepage_limits}
        sizes.update((h.page_size, h.limit) for h in r.hugepage_limits)
        del out.hugepage_limits[:]
        out.hugepage_limits.extend(cri.HugepageLimit(page_size=k, limit=v)
                                   for k, v in sizes.items())
    out.unified.update(r.unified)
    return out


def update_to_resources(upd: nri.ContainerUpdate) -> cri.LinuxContainerResources:
    """A plugin's update as CRI resources for UpdateContainerResources (its merge keeps
    whatever is left zero), as containerd converts it: cpu, cpusets, memory limit,
    hugepages and unified."""
    r = upd.linux.resources
    out = cri.LinuxContainerResources()
    if r.HasField("memory"):
        out.memory_limit_in_bytes = r.memory.limit.value
    if r.HasField("cpu"):
        for name, value in (("cpu_shares", r.cpu.shares.value),
                            ("cpu_period", r.cpu.period.value)):
            if value >= 1 << 63:
                raise InvalidArgument(f"NRI update of container {upd.container_id}: "
                                      f"{name} {value} is out of range")
            setattr(out, name, value)
        out.cpu_quota = r.cpu.quota.value
        out.cpuset_cpus = r.cpu.cpus
        out.cpuset_mems = r.cpu.mems
    out.hugepage_limits.extend(cri.HugepageLimit(page_size=h.page_size, limit=h.limit)
                               for h in r.hugepage_limits)
    out.unified.update(r.unified)
    return out
