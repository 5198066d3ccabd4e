"""crishim's pod and container records → the NRI v0.12 PodSandbox and Container messages.

What a plugin sees, as containerd's CRI plugin shows it: pods from their CRI config and
record (the pause's namespaces as crishim made them, its CRI annotations, cgroups path,
pid, IPs);
containers from their OCI spec when it is known (args, env, mounts, hooks, rlimits, user,
Linux namespaces, devices, resources, OOM score, cgroups path, I/O priority, scheduler,
net devices, RDT, sysctls, seccomp) and otherwise from their CRI config, plus the
record's status. Pure: nothing here reads the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as cri
from crishim.oci import annotations as ann
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

# What NRI reports for an exited container's reason, as containerd does.
COMPLETED_REASON = "Completed"
ERROR_REASON = "Error"

_STATES = {cri.CONTAINER_CREATED: nri.CONTAINER_CREATED,
           cri.CONTAINER_RUNNING: nri.CONTAINER_RUNNING,
           cri.CONTAINER_EXITED: nri.CONTAINER_STOPPED,
           cri.CONTAINER_UNKNOWN: nri.CONTAINER_UNKNOWN}

_PROPAGATION = {cri.PROPAGATION_PRIVATE: "rprivate",
                cri.PROPAGATION_HOST_TO_CONTAINER: "rslave",
                cri.PROPAGATION_BIDIRECTIONAL: "rshared"}


def resources_from_cri(res: cri.LinuxContainerResources) -> nri.LinuxResources:
    """CRI resources as NRI's: cpu and memory limit always present (zero meaning unset),
    as containerd hands them to plugins."""
    out = nri.LinuxResources(
        cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=max(res.cpu_shares, 0)),
                         quota=nri.OptionalInt64(value=res.cpu_quota),
                         period=nri.OptionalUInt64(value=max(res.cpu_period, 0)),
                         cpus=res.cpuset_cpus, mems=res.cpuset_mems),
        memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=res.memory_limit_in_bytes)))
    out.hugepage_limits.extend(nri.HugepageLimit(page_size=h.page_size, limit=h.limit)
                               for h in res.hugepage_limits)
    out.unified.update(res.unified)
    return out


def resources_from_oci(res: Mapping[str, Any]) -> nri.LinuxResources:
    """An OCI `linux.resources` object as NRI's LinuxResources (only what it sets)."""
    out = nri.LinuxResources()
    mem = res.get("memory")
    if isinstance(mem, Mapping):
        for key, field in (("limit", "limit"), ("reservation", "reservation"),
                           ("swap", "swap"), ("kernel", "kernel"),
                           ("kernelTCP", "kernel_tcp")):
            if isinstance(mem.get(key), int):
                getattr(out.memory, field).value = mem[key]
        if isinstance(mem.get("swappiness"), int):
            out.memory.swappiness.value = mem["swappiness"]
        for key, field in (("disableOOMKiller", "disable_oom_killer"),
                           ("useHierarchy", "use_hierarchy")):
            if isinstance(mem.get(key), bool):
                getattr(out.memory, field).value = mem[key]
        out.memory.SetInParent()
    cpu = res.get("cpu")
    if isinstance(cpu, Mapping):
        for key, field in (("shares", "shares"), ("quota", "quota"), ("period", "period"),
                           ("realtimeRuntime", "realtime_runtime"),
                           ("realtimePeriod", "realtime_period")):
            if isinstance(cpu.get(key), int):
                getattr(out.cpu, field).value = cpu[key]
        out.cpu.cpus = str(cpu.get("cpus") or "")
        out.cpu.mems = str(cpu.get("mems") or "")
        out.cpu.SetInParent()
    for h in res.get("hugepageLimits") or ():
        out.hugepage_limits.add(page_size=str(h.get("pageSize", "")),
                                limit=int(h.get("limit", 0)))
    for d in res.get("devices") or ():
        rule = out.devices.add(allow=bool(d.get("allow")), type=str(d.get("type") or ""),
                               access=str(d.get("access") or ""))
        if isinstance(d.get("major"), int):
            rule.major.value = d["major"]
        if isinstance(d.get("minor"), int):
            rule.minor.value = d["minor"]
    pids = res.get("pids")
    if isinstance(pids, Mapping):
        out.pids.limit = int(pids.get("limit") or 0)
    unified = res.get("unified")
    if isinstance(unified, Mapping):
        out.unified.update({str(k): str(v) for k, v in unified.items()})
    return out


def _namespaces(entries: Sequence[Mapping[str, Any]]) -> list[nri.LinuxNamespace]:
    return [nri.LinuxNamespace(type=str(n.get("type", "")), path=str(n.get("path") or ""))
            for n in entries]


def _pod_namespaces(pod: Sandbox) -> list[nri.LinuxNamespace]:
    """The pause's namespaces as crishim creates them (sandbox/pause.py): new ones but for
    the pinned network and user namespaces and those shared with the node."""
    opts = pod.namespace_options
    out: list[nri.LinuxNamespace] = []
    if opts.pid != cri.NODE:
        out.append(nri.LinuxNamespace(type="pid"))
    # A network namespace without a path tells a plugin nothing (containerd drops it too).
    if opts.network != cri.NODE and pod.netns_path:
        out.append(nri.LinuxNamespace(type="network", path=pod.netns_path))
    if opts.ipc != cri.NODE:
        out.append(nri.LinuxNamespace(type="ipc"))
    if opts.network != cri.NODE:
        out.append(nri.LinuxNamespace(type="uts"))
    out.append(nri.LinuxNamespace(type="mount"))
    if pod.userns_path:
        out.append(nri.LinuxNamespace(type="user", path=pod.userns_path))
    return out


def pod_to_nri(pod: Sandbox) -> nri.PodSandbox:
    """The NRI view of a pod sandbox."""
    cfg = pod.config
    meta = cfg.metadata
    linux = nri.LinuxPodSandbox(cgroup_parent=cfg.linux.cgroup_parent or pod.cgroup_parent,
                                cgroups_path=pod.cgroups_path,
                                namespaces=_pod_namespaces(pod))
    if cfg.linux.HasField("overhead"):
        linux.pod_overhead.CopyFrom(resources_from_cri(cfg.linux.overhead))
    if cfg.linux.HasField("resources"):
        linux.pod_resources.CopyFrom(resources_from_cri(cfg.linux.resources))
        linux.resources.CopyFrom(linux.pod_resources)
    # The pause spec's CRI annotations over the config's, as containerd shows a pod; none
    # of crishim's own names from the config, so no pod can pose as another to a plugin.
    annotations = ann.without_own(cfg.annotations)
    annotations.update({ann.CONTAINER_TYPE: ann.TYPE_SANDBOX, ann.SANDBOX_ID: pod.id,
                        ann.SANDBOX_NAME: meta.name, ann.SANDBOX_NAMESPACE: meta.namespace,
                        ann.SANDBOX_UID: meta.uid, ann.SANDBOX_LOG_DIR: cfg.log_directory})
    return nri.PodSandbox(
        id=pod.id, name=meta.name, uid=meta.uid, namespace=meta.namespace,
        labels=dict(cfg.labels), annotations=annotations,
        runtime_handler=pod.runtime_handler, linux=linux,
        pid=max(pod.pid, 0), ips=list(pod.ips))


def _hooks(hooks: Mapping[str, Any]) -> nri.Hooks:
    out = nri.Hooks()
    for oci_name, field in (("prestart", "prestart"), ("createRuntime", "create_runtime"),
                            ("createContainer", "create_container"),
                            ("startContainer", "start_container"),
                            ("poststart", "poststart"), ("poststop", "poststop")):
        for h in hooks.get(oci_name) or ():
            hook = getattr(out, field).add(path=str(h.get("path", "")),
                                           args=list(h.get("args") or ()),
                                           env=list(h.get("env") or ()))
            if isinstance(h.get("timeout"), int):
                hook.timeout.value = h["timeout"]
    return out


def _devices(devices: Sequence[Mapping[str, Any]]) -> list[nri.LinuxDevice]:
    out = []
    for d in devices:
        dev = nri.LinuxDevice(path=str(d.get("path", "")), type=str(d.get("type", "")),
                              major=int(d.get("major") or 0), minor=int(d.get("minor") or 0))
        if isinstance(d.get("fileMode"), int):
            dev.file_mode.value = d["fileMode"]
        if isinstance(d.get("uid"), int):
            dev.uid.value = d["uid"]
        if isinstance(d.get("gid"), int):
            dev.gid.value = d["gid"]
        out.append(dev)
    return out


def _seccomp(sc: Mapping[str, Any]) -> nri.LinuxSeccomp:
    out = nri.LinuxSeccomp(default_action=str(sc.get("defaultAction", "")),
                           architectures=[str(a) for a in sc.get("architectures") or ()],
                           flags=[str(f) for f in sc.get("flags") or ()],
                           listener_path=str(sc.get("listenerPath") or ""),
                           listener_metadata=str(sc.get("listenerMetadata") or ""))
    if isinstance(sc.get("defaultErrnoRet"), int):
        out.default_errno.value = sc["defaultErrnoRet"]
    for s in sc.get("syscalls") or ():
        call = out.syscalls.add(names=[str(n) for n in s.get("names") or ()],
                                action=str(s.get("action", "")))
        if isinstance(s.get("errnoRet"), int):
            call.errno_ret.value = s["errnoRet"]
        for a in s.get("args") or ():
            call.args.add(index=int(a.get("index", 0)), value=int(a.get("value", 0)),
                          value_two=int(a.get("valueTwo", 0)), op=str(a.get("op", "")))
    return out


def _scheduler(s: Mapping[str, Any]) -> nri.LinuxScheduler:
    # The OCI names are the NRI enum's names; an unknown one reads as none.
    policy = str(s.get("policy") or "")
    if policy not in nri.LinuxSchedulerPolicy.keys():
        policy = "SCHED_NONE"
    flags = [str(f) for f in s.get("flags") or () if f in nri.LinuxSchedulerFlag.keys()]
    return nri.LinuxScheduler(policy=policy, nice=int(s.get("nice", 0)),
                              priority=int(s.get("priority", 0)), flags=flags,
                              runtime=int(s.get("runtime", 0)),
                              deadline=int(s.get("deadline", 0)),
                              period=int(s.get("period", 0)))


def _seccomp_profile(cfg: cri.ContainerConfig) -> nri.SecurityProfile | None:
    sc = cfg.linux.security_context
    if not sc.HasField("seccomp"):
        return None
    # The CRI and NRI profile types share their numbers (RuntimeDefault 0, Unconfined 1,
    # Localhost 2).
    return nri.SecurityProfile(profile_type=int(sc.seccomp.profile_type),  # type: ignore[arg-type]
                               localhost_ref=sc.seccomp.localhost_ref)


def set_status(ctr: Container, out: nri.Container) -> None:
    """Every field of `out` that the record's status gives, overwritten: what changes in
    a container's NRI view between its events."""
    out.state = _STATES.get(ctr.state, nri.CONTAINER_UNKNOWN)
    reason = ctr.reason
    if ctr.state == cri.CONTAINER_EXITED:
        reason = COMPLETED_REASON if ctr.exit_code == 0 else ERROR_REASON
    out.status_reason = reason
    out.status_message = ctr.message
    out.pid = max(ctr.pid, 0)
    out.created_at = ctr.created_at
    out.started_at = ctr.started_at
    out.finished_at = ctr.finished_at
    out.exit_code = ctr.exit_code


def _from_spec(out: nri.Container, spec: Mapping[str, Any]) -> None:
    process = spec.get("process") or {}
    linux_spec = spec.get("linux") or {}
    # The spec's annotations, with the CRI config's over them (as containerd merges them).
    annotations = {str(k): str(v) for k, v in (spec.get("annotations") or {}).items()}
    annotations.update(out.annotations)
    out.annotations.clear()
    out.annotations.update(annotations)
    out.args.extend(str(a) for a in process.get("args") or ())
    out.env.extend(str(e) for e in process.get("env") or ())
    for m in spec.get("mounts") or ():
        out.mounts.add(destination=str(m.get("destination", "")), type=str(m.get("type") or ""),
                       source=str(m.get("source") or ""),
                       options=[str(o) for o in m.get("options") or ()])
    if spec.get("hooks"):
        out.hooks.CopyFrom(_hooks(spec["hooks"]))
    for r in process.get("rlimits") or ():
        out.rlimits.add(type=str(r.get("type", "")), hard=int(r.get("hard", 0)),
                        soft=int(r.get("soft", 0)))
    user = process.get("user") or {}
    out.user.CopyFrom(nri.User(uid=int(user.get("uid", 0)), gid=int(user.get("gid", 0)),
                               additional_gids=[int(g) for g in
                                                user.get("additionalGids") or ()]))
    linux = out.linux
    linux.namespaces.extend(_namespaces(linux_spec.get("namespaces") or ()))
    linux.devices.extend(_devices(linux_spec.get("devices") or ()))
    if isinstance(linux_spec.get("resources"), Mapping):
        linux.resources.CopyFrom(resources_from_oci(linux_spec["resources"]))
    if isinstance(process.get("oomScoreAdj"), int):
        linux.oom_score_adj.value = process["oomScoreAdj"]
    linux.cgroups_path = str(linux_spec.get("cgroupsPath") or "")
    ioprio = process.get("ioPriority")
    if isinstance(ioprio, Mapping) and ioprio.get("class") in nri.IOPrioClass.keys():
        # "class" is a Python keyword: the field is reached by name.
        linux.io_priority.CopyFrom(nri.LinuxIOPriority(
            priority=int(ioprio.get("priority", 0)),
            **{"class": nri.IOPrioClass.Value(ioprio["class"])}))
    if isinstance(process.get("scheduler"), Mapping):
        linux.scheduler.CopyFrom(_scheduler(process["scheduler"]))
    for host, dev in (linux_spec.get("netDevices") or {}).items():
        linux.net_devices[str(host)].name = str((dev or {}).get("name") or "")
    rdt = linux_spec.get("intelRdt")
    if isinstance(rdt, Mapping):
        linux.rdt.clos_id.value = str(rdt.get("closID") or "")
        linux.rdt.schemata.value.extend(str(s) for s in rdt.get("schemata") or ())
        linux.rdt.schemata.SetInParent()
        linux.rdt.enable_monitoring.value = bool(rdt.get("enableMonitoring"))
    linux.sysctl.update({str(k): str(v) for k, v in (linux_spec.get("sysctl") or {}).items()})
    if isinstance(linux_spec.get("seccomp"), Mapping):
        linux.seccomp_policy.CopyFrom(_seccomp(linux_spec["seccomp"]))


def _from_config(out: nri.Container, ctr: Container) -> None:
    """What the CRI config and record say, for a container whose spec is not at hand."""
    cfg = ctr.config
    out.args.extend(list(cfg.command) + list(cfg.args))
    out.env.extend(f"{kv.key}={_text(kv.value)}" for kv in cfg.envs)
    for m in cfg.mounts:
        opts = ["rbind", _PROPAGATION.get(m.propagation, "rprivate"),
                "ro" if m.readonly else "rw"]
        out.mounts.add(destination=m.container_path, type="bind", source=m.host_path,
                       options=opts)
    out.user.CopyFrom(nri.User(uid=ctr.uid, gid=ctr.gid, additional_gids=list(ctr.gids)))
    res = cfg.linux.resources
    if cfg.linux.HasField("resources"):
        out.linux.resources.CopyFrom(resources_from_cri(res))
    out.linux.oom_score_adj.value = res.oom_score_adj
    out.linux.cgroups_path = ctr.cgroups_path


def _text(value: str | bytes) -> str:
    # The CRI's KeyValue.value is declared bytes in crishim's api.proto.
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def container_to_nri(ctr: Container, spec: dict[str, Any] | None) -> nri.Container:
    """The NRI view of a container; `spec` is its OCI config.json when known (at create:
    the spec being built; later: the bundle's), else the CRI config stands in for it."""
    cfg = ctr.config
    out = nri.Container(id=ctr.id, pod_sandbox_id=ctr.pod_id, name=cfg.metadata.name,
                        labels=dict(cfg.labels), annotations=ann.without_own(cfg.annotations))
    set_status(ctr, out)
    out.CDI_devices.extend(nri.CDIDevice(name=d.name) for d in cfg.CDI_devices)
    out.linux.SetInParent()
    if spec is not None:
        _from_spec(out, spec)
    else:
        _from_config(out, ctr)
    profile = _seccomp_profile(cfg)
    if profile is not None:
        out.linux.seccomp_profile.CopyFrom(profile)
    return out
