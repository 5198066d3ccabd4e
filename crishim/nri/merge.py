"""NRI container adjustments: merging what several plugins return.

`Result` collects one CreateContainer's replies, plugin by plugin in index order, as
containerd/nri's adaptation does: every field a plugin sets is claimed by it (per
container, per key for maps and lists keyed by name), and a second plugin setting a field
already claimed is refused (`AdjustmentConflict`, naming both plugins and the field).

A key starting with "-" (annotations, env, mounts by destination, devices by path,
namespaces by type, sysctls, net devices; args starting with "") removes what earlier
plugins or the runtime put there, and releases the claim so the remover may set it anew.
Hooks are never a conflict: they accumulate, with every contributor recorded.

A removal of something the runtime itself set (an env variable, a device, a mount) stays
in the merged adjustment as its marker, so the spec loses it too (containerd/nri keeps
only the mounts' markers, and a plugin's removal of an image's variable is lost there).
nri/apply.py puts the merged adjustment into the spec.

`UpdateResult` merges the replies to UpdateContainer and StopContainer the same way (the
resources asked for the container itself, updates of others); `update_to_resources` turns
a merged update into the CRI resources that go through UpdateContainerResources.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as cri
from crishim.errors import FailedPrecondition, InvalidArgument

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


# --- the merged answer as CRI resources -----------------------------------------------


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
