"""NRI adjustments: merging several plugins' replies (owners, conflicts, removals), applying
the result to a container's OCI spec, updates, and the default validator."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection
from crishim.cdi.spec import ContainerEdits, DeviceNode
from crishim.config import DefaultValidatorConfig
from crishim.container.spec import PodInfo, SpecInputs, build_spec
from crishim.container.user import ResolvedUser
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.cgroups import SWAP, CgroupFacts
from crishim.nri import apply, merge
from crishim.nri.apply import RuntimeSupport, apply_to_spec
from crishim.nri.merge import AdjustmentConflict, Result
from crishim.nri.validate import AdjustmentRejected, validate_adjustment
from crishim.oci.resources import DROP, FAIL, ResourceMapper

NULL = os.stat("/dev/null")


def _spec() -> dict[str, Any]:
    """A container's spec as crishim builds it."""
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                command=["/bin/sh"], args=["-c", "sleep 1"],
                                envs=[pb.KeyValue(key="FOO", value=b"crishim")])
    return build_spec(SpecInputs(
        container_id="c1", config=config,
        pod=PodInfo(id="p1", name="pod", namespace="ns", uid="u", pause_pid=42,
                    netns_path="/run/netns/p1", cgroup_parent="/kubepods/podu"),
        image_config={"Env": ["PATH=/bin", "HOME=/root"]}, image_name="busybox",
        rootfs="/r", user=ResolvedUser(uid=0, gid=0)))


# What runc's config.json decoding accepts: the types of the OCI runtime spec's fields.
_STR, _INT, _BOOL = str, int, bool


def _check_list(value: Any, where: str, item: Any) -> None:
    assert isinstance(value, list), where
    for i, v in enumerate(value):
        item(v, f"{where}[{i}]")


def _typed(shape: dict[str, Any]) -> Any:
    def check(obj: Any, where: str) -> None:
        assert isinstance(obj, dict), f"{where} is not an object"
        for key, value in obj.items():
            assert key in shape, f"{where}.{key} is not an OCI field"
            want = shape[key]
            if isinstance(want, type):
                assert isinstance(value, want) and not (want is int and isinstance(value, bool)), \
                    f"{where}.{key}={value!r} is not {want.__name__}"
            else:
                want(value, f"{where}.{key}")
    return check


def _strs(v: Any, where: str) -> None:
    _check_list(v, where, lambda x, w: _typed({})(x, w) if not isinstance(x, str) else None)


def _list_of(shape: dict[str, Any]) -> Any:
    return lambda v, where: _check_list(v, where, _typed(shape))


def _map_str(v: Any, where: str) -> None:
    assert isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), where


_HOOK = {"path": _STR, "args": _strs, "env": _strs, "timeout": _INT}
_SHAPES: dict[str, Any] = {
    "ociVersion": _STR, "hostname": _STR, "domainname": _STR,
    "root": _typed({"path": _STR, "readonly": _BOOL}),
    "annotations": _map_str,
    "mounts": _list_of({"destination": _STR, "type": _STR, "source": _STR,
                        "options": _strs}),
    "hooks": _typed({k: _list_of(_HOOK) for k in ("prestart", "createRuntime",
                                                  "createContainer", "startContainer",
                                                  "poststart", "poststop")}),
    "process": _typed({
        "terminal": _BOOL, "user": _typed({"uid": _INT, "gid": _INT,
                                           "additionalGids": lambda v, w: None}),
        "args": _strs, "env": _strs, "cwd": _STR, "noNewPrivileges": _BOOL,
        "capabilities": lambda v, w: None, "apparmorProfile": _STR, "oomScoreAdj": _INT,
        "rlimits": _list_of({"type": _STR, "hard": _INT, "soft": _INT}),
        "ioPriority": _typed({"class": _STR, "priority": _INT}),
        "scheduler": _typed({"policy": _STR, "nice": _INT, "priority": _INT,
                             "flags": _strs, "runtime": _INT, "deadline": _INT,
                             "period": _INT})}),
    "linux": _typed({
        "namespaces": _list_of({"type": _STR, "path": _STR}),
        "devices": _list_of({"path": _STR, "type": _STR, "major": _INT, "minor": _INT,
                             "fileMode": _INT, "uid": _INT, "gid": _INT}),
        "cgroupsPath": _STR, "sysctl": _map_str, "maskedPaths": _strs,
        "readonlyPaths": _strs, "rootfsPropagation": _STR,
        "seccomp": _typed({"defaultAction": _STR, "defaultErrnoRet": _INT,
                           "architectures": _strs, "flags": _strs, "listenerPath": _STR,
                           "listenerMetadata": _STR,
                           "syscalls": _list_of({"names": _strs, "action": _STR,
                                                 "errnoRet": _INT,
                                                 "args": _list_of({"index": _INT,
                                                                   "value": _INT,
                                                                   "valueTwo": _INT,
                                                                   "op": _STR})})}),
        "netDevices": lambda v, w: [_typed({"name": _STR})(d, f"{w}.{k}")
                                    for k, d in v.items()],
        "intelRdt": _typed({"closID": _STR, "schemata": _strs, "enableMonitoring": _BOOL,
                            "l3CacheSchema": _STR, "memBwSchema": _STR}),
        "memoryPolicy": _typed({"mode": _STR, "nodes": _STR, "flags": _strs}),
        "resources": _typed({
            "devices": _list_of({"allow": _BOOL, "type": _STR, "major": _INT,
                                 "minor": _INT, "access": _STR}),
            "memory": _typed({"limit": _INT, "swap": _INT, "reservation": _INT}),
            "cpu": _typed({"shares": _INT, "quota": _INT, "period": _INT,
                           "realtimeRuntime": _INT, "realtimePeriod": _INT, "cpus": _STR,
                           "mems": _STR}),
            "pids": _typed({"limit": _INT}),
            "hugepageLimits": _list_of({"pageSize": _STR, "limit": _INT}),
            "unified": _map_str, "blockIO": lambda v, w: None}),
    }),
}


def assert_runc_accepts(spec: dict[str, Any]) -> None:
    """The spec has the OCI runtime spec's shape: known fields, right types, one rlimit
    per type, absolute mount destinations, valid JSON."""
    json.loads(json.dumps(spec))
    _typed(_SHAPES)(spec, "spec")
    types = [r["type"] for r in spec["process"].get("rlimits", [])]
    assert len(types) == len(set(types)), "an rlimit type repeats"
    for m in spec["mounts"]:
        assert m["destination"].startswith("/")


def _apply(adj: nri.ContainerAdjustment, spec: dict[str, Any] | None = None,
           **kw: Any) -> dict[str, Any]:
    spec = spec if spec is not None else _spec()
    apply_to_spec(spec, adj, **kw)
    assert_runc_accepts(spec)
    return spec


def _result() -> Result:
    return Result(nri.PodSandbox(id="p1", name="pod"),
                  nri.Container(id="c1", pod_sandbox_id="p1", name="app",
                                env=["PATH=/bin", "FOO=crishim"], args=["/bin/sh"],
                                mounts=[nri.Mount(destination="/data", source="/x",
                                                  type="bind")]))


# --- the spec, one adjustment kind at a time ------------------------------------------


def test_the_built_spec_itself_has_the_oci_shape() -> None:
    assert_runc_accepts(_spec())


def test_annotations_are_added_and_removed() -> None:
    spec = _spec()
    spec["annotations"]["old"] = "x"
    _apply(nri.ContainerAdjustment(annotations={"new": "1", "-old": ""}), spec)
    assert spec["annotations"]["new"] == "1"
    assert "old" not in spec["annotations"]


def test_env_is_set_replaced_and_removed_in_place() -> None:
    spec = _apply(nri.ContainerAdjustment(env=[
        nri.KeyValue(key="FOO", value="nri"), nri.KeyValue(key="-HOME"),
        nri.KeyValue(key="NEW", value="a=b")]))
    env = spec["process"]["env"]
    assert "FOO=nri" in env and "FOO=crishim" not in env
    assert not any(e.startswith("HOME=") for e in env)
    assert env[-1] == "NEW=a=b"
    # The replaced variable keeps its place.
    assert env.index("FOO=nri") < env.index("NEW=a=b")


def test_args_replace_the_command() -> None:
    spec = _apply(nri.ContainerAdjustment(args=["/bin/echo", "hi"]))
    assert spec["process"]["args"] == ["/bin/echo", "hi"]


def test_hooks_are_appended_by_kind() -> None:
    hooks = nri.Hooks(prestart=[nri.Hook(path="/bin/a", args=["a", "1"])],
                      create_runtime=[nri.Hook(path="/bin/b", env=["X=1"],
                                               timeout=nri.OptionalInt(value=5))],
                      poststop=[nri.Hook(path="/bin/c")])
    spec = _apply(nri.ContainerAdjustment(hooks=hooks))
    assert spec["hooks"]["prestart"] == [{"path": "/bin/a", "args": ["a", "1"]}]
    assert spec["hooks"]["createRuntime"] == [{"path": "/bin/b", "env": ["X=1"],
                                               "timeout": 5}]
    assert spec["hooks"]["poststop"] == [{"path": "/bin/c"}]
    with pytest.raises(InvalidArgument, match="absolute"):
        _apply(nri.ContainerAdjustment(hooks=nri.Hooks(poststart=[nri.Hook(path="x")])))


def test_mounts_are_added_replaced_removed_and_sorted() -> None:
    spec = _spec()
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": "/old",
                           "options": ["rbind", "rw"]})
    spec["mounts"].append({"destination": "/gone", "type": "bind", "source": "/g",
                           "options": ["rbind"]})
    adj = nri.ContainerAdjustment(mounts=[
        nri.Mount(destination="/data", type="bind", source="/new", options=["rbind", "ro"]),
        nri.Mount(destination="-/gone"),
        nri.Mount(destination="/a/b/c", type="tmpfs", source="tmpfs", options=["nosuid"]),
        nri.Mount(destination="/a", type="bind", source="/host/a", options=["rbind"])])
    _apply(adj, spec)
    dests = [m["destination"] for m in spec["mounts"]]
    assert "/gone" not in dests
    assert [m for m in spec["mounts"] if m["destination"] == "/data"] == [
        {"destination": "/data", "type": "bind", "source": "/new", "options": ["rbind", "ro"]}]
    assert dests.index("/a") < dests.index("/a/b/c")
    depths = [d.count("/") for d in dests]
    assert depths == sorted(depths)


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:5 / /private rw - tmpfs tmpfs rw
31 22 0:6 / /slave rw master:3 - tmpfs tmpfs rw
"""


def test_a_shared_mount_needs_a_shared_source_and_sets_rootfs_propagation() -> None:
    spec = _apply(nri.ContainerAdjustment(mounts=[nri.Mount(
        destination="/m", type="bind", source="/var/lib/x", options=["rbind", "rshared"])]),
        mountinfo=lambda: MOUNTINFO)
    assert spec["linux"]["rootfsPropagation"] == "rshared"
    with pytest.raises(FailedPrecondition, match="not on a shared mount"):
        _apply(nri.ContainerAdjustment(mounts=[nri.Mount(
            destination="/m", type="bind", source="/private/x",
            options=["rbind", "rshared"])]), mountinfo=lambda: MOUNTINFO)
    spec = _apply(nri.ContainerAdjustment(mounts=[nri.Mount(
        destination="/m", type="bind", source="/slave/x", options=["rbind", "rslave"])]),
        mountinfo=lambda: MOUNTINFO)
    assert spec["linux"]["rootfsPropagation"] == "rslave"


def test_devices_are_added_with_a_cgroup_rule_and_removed() -> None:
    spec = _spec()
    spec["linux"]["devices"].append({"path": "/dev/old", "type": "c", "major": 1,
                                     "minor": 7})
    adj = nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(devices=[
        nri.LinuxDevice(path="/dev/nri-null", type="c", major=1, minor=3,
                        file_mode=nri.OptionalFileMode(value=0o20666),
                        uid=nri.OptionalUInt32(value=0)),
        nri.LinuxDevice(path="/dev/blk", type="b", major=8, minor=0),
        nri.LinuxDevice(path="-/dev/old")]))
    _apply(adj, spec)
    devices = {d["path"]: d for d in spec["linux"]["devices"]}
    assert devices["/dev/nri-null"] == {"path": "/dev/nri-null", "type": "c", "major": 1,
                                        "minor": 3, "fileMode": 0o666, "uid": 0}
    assert "/dev/old" not in devices
    rules = spec["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"} in rules
    assert {"allow": True, "type": "b", "major": 8, "minor": 0, "access": "rwm"} in rules
    with pytest.raises(InvalidArgument, match="type 'x'"):
        _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            devices=[nri.LinuxDevice(path="/dev/x", type="x")])))


def test_cdi_devices_apply_the_resolved_edits() -> None:
    edits = ContainerEdits(env=("VENDOR=1",), device_nodes=(
        DeviceNode(path="/dev/vendor0", host_path="/dev/null"),))
    adj = nri.ContainerAdjustment(CDI_devices=[nri.CDIDevice(name="vendor.com/gpu=0")])
    assert apply.cdi_device_names(adj) == ["vendor.com/gpu=0"]
    spec = _apply(adj, cdi=[Injection("vendor.com/gpu=0", edits)])
    assert "VENDOR=1" in spec["process"]["env"]
    dev = next(d for d in spec["linux"]["devices"] if d["path"] == "/dev/vendor0")
    assert (dev["major"], dev["minor"]) == (os.major(NULL.st_rdev), os.minor(NULL.st_rdev))
    with pytest.raises(FailedPrecondition, match=r"vendor\.com/gpu=0 .*not resolved"):
        _apply(adj)


def test_rlimits_replace_one_of_the_same_type() -> None:
    spec = _apply(nri.ContainerAdjustment(rlimits=[
        nri.POSIXRlimit(type="RLIMIT_NOFILE", soft=512, hard=1024),
        nri.POSIXRlimit(type="RLIMIT_NPROC", soft=10, hard=20)]))
    limits = {r["type"]: r for r in spec["process"]["rlimits"]}
    assert limits["RLIMIT_NOFILE"] == {"type": "RLIMIT_NOFILE", "soft": 512, "hard": 1024}
    assert limits["RLIMIT_NPROC"]["hard"] == 20
    with pytest.raises(InvalidArgument, match="soft limit 30 is above"):
        _apply(nri.ContainerAdjustment(rlimits=[
            nri.POSIXRlimit(type="RLIMIT_CORE", soft=30, hard=20)]))


def _res_adj(**kw: Any) -> nri.ContainerAdjustment:
    return nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        resources=nri.LinuxResources(**kw)))


def test_cpu_and_memory_resources() -> None:
    spec = _apply(_res_adj(
        cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=512),
                         quota=nri.OptionalInt64(value=50000),
                         period=nri.OptionalUInt64(value=100000),
                         realtime_runtime=nri.OptionalInt64(value=1000),
                         cpus="0-1", mems="0"),
        memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=64 << 20))))
    res = spec["linux"]["resources"]
    assert res["cpu"] == {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0-1",
                          "mems": "0", "realtimeRuntime": 1000}
    # Swap follows the limit: no swap beyond it.
    assert res["memory"] == {"limit": 64 << 20, "swap": 64 << 20}
    with pytest.raises(InvalidArgument, match="NRI adjustment: cpu_period"):
        _apply(_res_adj(cpu=nri.LinuxCPU(period=nri.OptionalUInt64(value=10))))
    with pytest.raises(InvalidArgument, match="cpu_shares 18446744073709551615 is out"):
        _apply(_res_adj(cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=2**64 - 1))))


def test_hugepages_unified_pids_and_device_rules() -> None:
    spec = _spec()
    spec["linux"]["resources"]["hugepageLimits"] = [{"pageSize": "2MB", "limit": 1}]
    _apply(_res_adj(hugepage_limits=[nri.HugepageLimit(page_size="2MB", limit=2 << 20)],
                    unified={"memory.high": "1000000"},
                    pids=nri.LinuxPids(limit=100),
                    devices=[nri.LinuxDeviceCgroup(allow=True, type="c",
                                                   major=nri.OptionalInt64(value=10),
                                                   access="rwm")]), spec)
    res = spec["linux"]["resources"]
    assert res["hugepageLimits"] == [{"pageSize": "2MB", "limit": 2 << 20}]
    assert res["unified"] == {"memory.high": "1000000"}
    assert res["pids"] == {"limit": 100}
    assert res["devices"][-1] == {"allow": True, "access": "rwm", "type": "c", "major": 10}


def test_a_missing_controller_drops_or_refuses_like_cri_resources() -> None:
    facts = CgroupFacts(1, frozenset({"cpu", "memory", "pids", SWAP}))
    adj = _res_adj(hugepage_limits=[nri.HugepageLimit(page_size="2MB", limit=2 << 20)])
    spec = _apply(adj, mapper=ResourceMapper(facts, DROP))
    assert "hugepageLimits" not in spec["linux"]["resources"]
    with pytest.raises(FailedPrecondition, match="hugetlb"):
        _apply(adj, mapper=ResourceMapper(facts, FAIL))
    with pytest.raises(InvalidArgument, match="cgroup v2"):
        _apply(_res_adj(unified={"memory.high": "1"}), mapper=ResourceMapper(facts, DROP))


def test_block_io_classes_are_refused_and_rdt_classes_become_the_clos_id() -> None:
    with pytest.raises(FailedPrecondition, match="block I/O class 'slow'"):
        _apply(_res_adj(blockio_class=nri.OptionalString(value="slow")))
    spec = _spec()
    spec["linux"]["resources"]["blockIO"] = {"weight": 10}
    _apply(_res_adj(blockio_class=nri.OptionalString(value="")), spec)
    assert "blockIO" not in spec["linux"]["resources"]
    spec = _apply(_res_adj(rdt_class=nri.OptionalString(value="gold")))
    assert spec["linux"]["intelRdt"] == {"closID": "gold"}


def test_rdt_fields_and_removal() -> None:
    spec = _spec()
    spec["linux"]["intelRdt"] = {"closID": "old", "l3CacheSchema": "L3:0=f"}
    rdt = nri.LinuxRdt(remove=True, clos_id=nri.OptionalString(value="new"),
                       schemata=nri.OptionalRepeatedString(value=["L3:0=3"]),
                       enable_monitoring=nri.OptionalBool(value=True))
    _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(rdt=rdt)), spec)
    assert spec["linux"]["intelRdt"] == {"closID": "new", "schemata": ["L3:0=3"],
                                         "enableMonitoring": True}


def test_cgroups_path_and_oom_score_adj() -> None:
    spec = _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        cgroups_path="/custom/c1", oom_score_adj=nri.OptionalInt(value=-10))))
    assert spec["linux"]["cgroupsPath"] == "/custom/c1"
    assert spec["process"]["oomScoreAdj"] == -10
    with pytest.raises(InvalidArgument, match="oom_score_adj 5000"):
        _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            oom_score_adj=nri.OptionalInt(value=5000))))


def test_sysctls_are_set_and_removed() -> None:
    spec = _spec()
    spec["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1"}
    _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        sysctl={"net.core.somaxconn": "1024", "-net.ipv4.ip_forward": "",
                "kernel.shmmax": "1000"})), spec)
    assert spec["linux"]["sysctl"] == {"net.core.somaxconn": "1024", "kernel.shmmax": "1000"}


def test_sysctls_runc_would_refuse_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"vm\.swappiness is not namespaced"):
        _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            sysctl={"vm.swappiness": "1"})))
    # A container left in the node's network namespace.
    lx = nri.LinuxContainerAdjustment(namespaces=[nri.LinuxNamespace(type="-network")],
                                      sysctl={"net.core.somaxconn": "1"})
    with pytest.raises(InvalidArgument, match="network namespace, which this container "
                                              "shares with the node"):
        _apply(nri.ContainerAdjustment(linux=lx))


def test_namespaces_are_replaced_in_place_and_removed() -> None:
    spec = _spec()
    before = [n["type"] for n in spec["linux"]["namespaces"]]
    _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(namespaces=[
        nri.LinuxNamespace(type="network", path="/run/netns/other"),
        nri.LinuxNamespace(type="-ipc"), nri.LinuxNamespace(type="cgroup")])), spec)
    ns = spec["linux"]["namespaces"]
    assert {"type": "network", "path": "/run/netns/other"} in ns
    assert [n["type"] for n in ns] == [t for t in before if t != "ipc"] + \
        (["cgroup"] if "cgroup" not in before else [])
    with pytest.raises(InvalidArgument, match="namespace type 'bogus'"):
        _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            namespaces=[nri.LinuxNamespace(type="bogus")])))


def test_seccomp_policy_replaces_the_profile() -> None:
    policy = nri.LinuxSeccomp(default_action="SCMP_ACT_ERRNO",
                              default_errno=nri.OptionalUInt32(value=1),
                              architectures=["SCMP_ARCH_X86_64"], syscalls=[
                                  nri.LinuxSyscall(names=["read", "write"],
                                                   action="SCMP_ACT_ALLOW"),
                                  nri.LinuxSyscall(names=["personality"],
                                                   action="SCMP_ACT_ALLOW", args=[
                                                       nri.LinuxSeccompArg(
                                                           index=0, value=8,
                                                           op="SCMP_CMP_EQ")])])
    spec = _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        seccomp_policy=policy)))
    sc = spec["linux"]["seccomp"]
    assert sc["defaultAction"] == "SCMP_ACT_ERRNO" and sc["defaultErrnoRet"] == 1
    assert sc["syscalls"][1]["args"] == [{"index": 0, "value": 8, "valueTwo": 0,
                                          "op": "SCMP_CMP_EQ"}]


def test_scheduler_io_priority_net_devices_memory_policy() -> None:
    lx = nri.LinuxContainerAdjustment(
        scheduler=nri.LinuxScheduler(policy=nri.SCHED_FIFO, priority=10,
                                     flags=[nri.SCHED_FLAG_RESET_ON_FORK]),
        io_priority=nri.LinuxIOPriority(priority=4, **{"class": nri.IOPRIO_CLASS_BE}),
        net_devices={"eth1": nri.LinuxNetDevice(name="net1")},
        memory_policy=nri.LinuxMemoryPolicy(mode=nri.MPOL_BIND, nodes="0-1",
                                            flags=[nri.MPOL_F_STATIC_NODES]))
    spec = _apply(nri.ContainerAdjustment(linux=lx))
    assert spec["process"]["scheduler"] == {"policy": "SCHED_FIFO", "priority": 10,
                                            "flags": ["SCHED_FLAG_RESET_ON_FORK"]}
    assert spec["process"]["ioPriority"] == {"class": "IOPRIO_CLASS_BE", "priority": 4}
    assert spec["linux"]["netDevices"] == {"eth1": {"name": "net1"}}
    assert spec["linux"]["memoryPolicy"] == {"mode": "MPOL_BIND", "nodes": "0-1",
                                             "flags": ["MPOL_F_STATIC_NODES"]}
    # SCHED_NONE / IOPRIO_CLASS_NONE clear what was there.
    _apply(nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        scheduler=nri.LinuxScheduler(), io_priority=nri.LinuxIOPriority())), spec)
    assert "scheduler" not in spec["process"] and "ioPriority" not in spec["process"]


def test_fields_the_runtime_ignores_are_refused() -> None:
    runc11 = RuntimeSupport.from_features(json.dumps({
        "ociVersionMin": "1.0.0", "ociVersionMax": "1.0.2-dev",
        "linux": {"namespaces": ["pid"]}}).encode())
    assert runc11 == RuntimeSupport(io_priority=False, scheduler=False, net_devices=False,
                                    memory_policy=False, intel_rdt=True)
    runc13 = RuntimeSupport.from_features(json.dumps({
        "ociVersionMax": "1.2.1", "linux": {"netDevices": {"enabled": True},
                                            "intelRdt": {"enabled": False}}}).encode())
    assert runc13.scheduler and runc13.net_devices and not runc13.intel_rdt
    assert RuntimeSupport.from_features(b"") == RuntimeSupport()
    for lx, what in ((nri.LinuxContainerAdjustment(scheduler=nri.LinuxScheduler(
                          policy=nri.SCHED_RR)), "scheduling policy"),
                     (nri.LinuxContainerAdjustment(io_priority=nri.LinuxIOPriority(
                          **{"class": nri.IOPRIO_CLASS_RT})), "I/O priority"),
                     (nri.LinuxContainerAdjustment(net_devices={
                          "eth1": nri.LinuxNetDevice()}), "net device eth1"),
                     (nri.LinuxContainerAdjustment(memory_policy=nri.LinuxMemoryPolicy()),
                      "memory policy")):
        with pytest.raises(FailedPrecondition, match=what):
            _apply(nri.ContainerAdjustment(linux=lx), support=runc11)


def test_an_empty_adjustment_changes_nothing() -> None:
    spec = _spec()
    before = json.dumps(spec, sort_keys=True)
    _apply(nri.ContainerAdjustment(), spec)
    assert json.dumps(spec, sort_keys=True) == before


# --- merging plugins' replies ---------------------------------------------------------


def test_two_plugins_adjusting_different_fields_merge() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(annotations={"x": "1"},
                                                    env=[nri.KeyValue(key="A", value="1")]))
    r.apply_adjustment("b", nri.ContainerAdjustment(annotations={"y": "2"},
                                                    env=[nri.KeyValue(key="B", value="2")]))
    assert dict(r.adjustment.annotations) == {"x": "1", "y": "2"}
    assert [e.key for e in r.adjustment.env] == ["A", "B"]
    # The next plugin sees the container with the earlier adjustments.
    assert list(r.container.env) == ["PATH=/bin", "FOO=crishim", "A=1", "B=2"]
    owners = r.owners.to_proto().owners["c1"]
    assert owners.compound[nri.Env].owners == {"A": "a", "B": "b"}


@pytest.mark.parametrize(("first", "second", "field"), [
    (nri.ContainerAdjustment(annotations={"k": "1"}),
     nri.ContainerAdjustment(annotations={"k": "2"}), "Annotations k"),
    (nri.ContainerAdjustment(env=[nri.KeyValue(key="E", value="1")]),
     nri.ContainerAdjustment(env=[nri.KeyValue(key="E", value="2")]), "Env E"),
    (nri.ContainerAdjustment(mounts=[nri.Mount(destination="/m")]),
     nri.ContainerAdjustment(mounts=[nri.Mount(destination="/m")]), "Mounts /m"),
    (nri.ContainerAdjustment(args=["a"]), nri.ContainerAdjustment(args=["b"]), "Args"),
    (nri.ContainerAdjustment(rlimits=[nri.POSIXRlimit(type="RLIMIT_NOFILE")]),
     nri.ContainerAdjustment(rlimits=[nri.POSIXRlimit(type="RLIMIT_NOFILE")]),
     "Rlimits RLIMIT_NOFILE"),
    (nri.ContainerAdjustment(CDI_devices=[nri.CDIDevice(name="v.com/g=0")]),
     nri.ContainerAdjustment(CDI_devices=[nri.CDIDevice(name="v.com/g=0")]),
     "CdiDevices v.com/g=0"),
    (nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        devices=[nri.LinuxDevice(path="/dev/d")])),
     nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
         devices=[nri.LinuxDevice(path="/dev/d")])), "Devices /dev/d"),
    (_res_adj(memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1))),
     _res_adj(memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=2))), "MemLimit"),
    (_res_adj(cpu=nri.LinuxCPU(cpus="0")), _res_adj(cpu=nri.LinuxCPU(cpus="1")),
     "CPUSetCPUs"),
    (_res_adj(unified={"memory.high": "1"}), _res_adj(unified={"memory.high": "2"}),
     "CgroupsUnified memory.high"),
    (_res_adj(pids=nri.LinuxPids(limit=1)), _res_adj(pids=nri.LinuxPids(limit=2)),
     "PidsLimit"),
    (nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(cgroups_path="/a")),
     nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(cgroups_path="/b")),
     "CgroupsPath"),
    (nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        namespaces=[nri.LinuxNamespace(type="network")])),
     nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
         namespaces=[nri.LinuxNamespace(type="-network")])), "Namespace network"),
    (nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(sysctl={"a.b": "1"})),
     nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(sysctl={"a.b": "2"})),
     "Sysctl a.b"),
    (nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        oom_score_adj=nri.OptionalInt(value=1))),
     nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
         oom_score_adj=nri.OptionalInt(value=2))), "OomScoreAdj"),
])
def test_two_plugins_setting_one_field_conflict(first: nri.ContainerAdjustment,
                                                second: nri.ContainerAdjustment,
                                                field: str) -> None:
    r = _result()
    r.apply_adjustment("10-first", first)
    with pytest.raises(AdjustmentConflict) as exc:
        r.apply_adjustment("20-second", second)
    assert str(exc.value) == (f"NRI plugins '20-second' and '10-first' both tried to set "
                              f"{field}")
    assert exc.value.code.name == "FAILED_PRECONDITION"


def test_a_removal_lets_the_remover_set_the_field_again() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(mounts=[nri.Mount(destination="/m",
                                                                      source="/a")]))
    r.apply_adjustment("b", nri.ContainerAdjustment(mounts=[
        nri.Mount(destination="-/m"), nri.Mount(destination="/m", source="/b")]))
    assert [(m.destination, m.source) for m in r.adjustment.mounts] == [("/m", "/b")]
    with pytest.raises(AdjustmentConflict, match="'c' and 'b'"):
        r.apply_adjustment("c", nri.ContainerAdjustment(mounts=[nri.Mount(destination="/m")]))


def test_removing_a_runtime_mount_keeps_the_marker_for_the_spec() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(mounts=[nri.Mount(destination="-/data")]))
    assert [m.destination for m in r.adjustment.mounts] == ["-/data"]
    assert list(r.container.mounts) == []
    spec = _spec()
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": "/x",
                           "options": ["rbind"]})
    _apply(r.adjustment, spec)
    assert "/data" not in [m["destination"] for m in spec["mounts"]]


def test_a_removed_annotation_and_env_leave_the_merged_result() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(annotations={"k": "1"},
                                                    env=[nri.KeyValue(key="E", value="1")]))
    r.apply_adjustment("b", nri.ContainerAdjustment(annotations={"-k": ""},
                                                    env=[nri.KeyValue(key="-E")]))
    assert dict(r.adjustment.annotations) == {"-k": ""}
    assert [e.key for e in r.adjustment.env] == ["-E"]
    assert "k" not in r.container.annotations


def test_args_with_an_empty_first_element_clear_the_earlier_claim() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(args=["/a"]))
    r.apply_adjustment("b", nri.ContainerAdjustment(args=["", "/b", "x"]))
    assert list(r.adjustment.args) == ["/b", "x"]
    assert list(r.container.args) == ["/b", "x"]


def test_hooks_accumulate_with_every_contributor() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(hooks=nri.Hooks(
        prestart=[nri.Hook(path="/a")])))
    r.apply_adjustment("b", nri.ContainerAdjustment(hooks=nri.Hooks(
        prestart=[nri.Hook(path="/b")])))
    assert [h.path for h in r.adjustment.hooks.prestart] == ["/a", "/b"]
    assert r.owners.owner("c1", nri.OciHooks) == "a,b"


def test_resources_merge_into_the_adjustment_and_the_container() -> None:
    r = _result()
    r.apply_adjustment("a", _res_adj(memory=nri.LinuxMemory(limit=nri.OptionalInt64(
        value=1 << 30)), hugepage_limits=[nri.HugepageLimit(page_size="2MB", limit=1)]))
    r.apply_adjustment("b", _res_adj(cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=2)),
                                     rdt_class=nri.OptionalString(value="gold")))
    res = r.adjustment.linux.resources
    assert res.memory.limit.value == 1 << 30 and res.cpu.shares.value == 2
    assert res.rdt_class.value == "gold" and len(res.hugepage_limits) == 1
    assert r.container.linux.resources.memory.limit.value == 1 << 30


def test_rdt_removal_and_memory_policy_are_claimed() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        rdt=nri.LinuxRdt(clos_id=nri.OptionalString(value="x")),
        memory_policy=nri.LinuxMemoryPolicy(mode=nri.MPOL_BIND, nodes="0"))))
    with pytest.raises(AdjustmentConflict, match="RdtClosID"):
        r.apply_adjustment("b", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            rdt=nri.LinuxRdt(clos_id=nri.OptionalString(value="y")))))
    with pytest.raises(AdjustmentConflict, match="MemoryPolicy"):
        r.apply_adjustment("b", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            memory_policy=nri.LinuxMemoryPolicy())))
    r.apply_adjustment("a", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        rdt=nri.LinuxRdt(remove=True))))
    assert r.adjustment.linux.rdt == nri.LinuxRdt(remove=True)


# --- updates --------------------------------------------------------------------------


def _update(ctr: str, ignore: bool = False, **res: Any) -> nri.ContainerUpdate:
    return nri.ContainerUpdate(container_id=ctr, ignore_failure=ignore,
                               linux=nri.LinuxContainerUpdate(
                                   resources=nri.LinuxResources(**res)))


def test_updates_of_other_containers_merge_per_container() -> None:
    r = _result()
    r.apply_updates("a", [_update("c2", cpu=nri.LinuxCPU(cpus="0-1"))])
    r.apply_updates("b", [_update("c2", memory=nri.LinuxMemory(
        limit=nri.OptionalInt64(value=1 << 30))), _update("c3", cpu=nri.LinuxCPU(mems="0"))])
    assert [u.container_id for u in r.updates] == ["c2", "c3"]
    c2 = r.updates[0].linux.resources
    assert c2.cpu.cpus == "0-1" and c2.memory.limit.value == 1 << 30


def test_conflicting_updates_fail_unless_ignored() -> None:
    r = _result()
    r.apply_updates("a", [_update("c2", cpu=nri.LinuxCPU(cpus="0"))])
    with pytest.raises(AdjustmentConflict, match="'b' and 'a' both tried to set CPUSetCPUs"):
        r.apply_updates("b", [_update("c2", cpu=nri.LinuxCPU(cpus="1"))])
    r.apply_updates("b", [_update("c2", ignore=True, cpu=nri.LinuxCPU(cpus="1"),
                                  memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1)))])
    assert r.updates[0].linux.resources.cpu.cpus == "0"
    assert not r.updates[0].linux.resources.memory.HasField("limit")


def test_updating_the_container_being_created_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="'a' asked to update container c1"):
        _result().apply_updates("a", [_update("c1")])


def test_an_update_reply_changes_the_requested_resources_and_others() -> None:
    asked = nri.LinuxResources(cpu=nri.LinuxCPU(cpus="0-3"),
                               memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30)))
    r = merge.UpdateResult("c1", asked)
    r.apply_updates("a", [_update("c1", cpu=nri.LinuxCPU(cpus="2-3")),
                          _update("c2", cpu=nri.LinuxCPU(cpus="0-1"))])
    assert r.requested is not None
    assert r.requested.cpu.cpus == "2-3" and r.requested.memory.limit.value == 1 << 30
    assert asked.cpu.cpus == "0-3"  # the caller's request is left alone
    assert [u.container_id for u in r.updates] == ["c2"]
    with pytest.raises(AdjustmentConflict, match="'b' and 'a' both tried to set CPUSetCPUs"):
        r.apply_updates("b", [_update("c1", cpu=nri.LinuxCPU(cpus="1"))])
    stop = merge.UpdateResult()
    stop.apply_updates("a", [_update("c2", cpu=nri.LinuxCPU(cpus="0"))])
    assert stop.requested is None and [u.container_id for u in stop.updates] == ["c2"]


def test_update_to_resources_is_the_cri_form() -> None:
    upd = _update("c2", cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=256),
                                         quota=nri.OptionalInt64(value=20000),
                                         period=nri.OptionalUInt64(value=100000),
                                         cpus="1", mems="0"),
                  memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=128 << 20)),
                  hugepage_limits=[nri.HugepageLimit(page_size="1GB", limit=1 << 30)],
                  unified={"memory.high": "5"})
    assert merge.update_to_resources(upd) == pb.LinuxContainerResources(
        cpu_shares=256, cpu_quota=20000, cpu_period=100000, cpuset_cpus="1",
        cpuset_mems="0", memory_limit_in_bytes=128 << 20,
        hugepage_limits=[pb.HugepageLimit(page_size="1GB", limit=1 << 30)],
        unified={"memory.high": "5"})
    assert merge.update_to_resources(_update("c2")) == pb.LinuxContainerResources()
    with pytest.raises(InvalidArgument, match="container c2: cpu_period"):
        merge.update_to_resources(_update("c2", cpu=nri.LinuxCPU(
            period=nri.OptionalUInt64(value=1 << 63))))


# --- the default validator ------------------------------------------------------------


def _validation(r: Result, plugins: tuple[tuple[str, str], ...] = (("a", "10"),),
                pod_annotations: dict[str, str] | None = None,
                profile: nri.SecurityProfile | None = None
                ) -> nri.ValidateContainerAdjustmentRequest:
    pristine = nri.Container(id="c1", name="app")
    if profile is not None:
        pristine.linux.seccomp_profile.CopyFrom(profile)
    req = r.validation_request(pristine, list(plugins))
    req.pod.annotations.update(pod_annotations or {})
    return req


def test_the_validator_disabled_or_unconfigured_lets_everything_through() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(hooks=nri.Hooks(
        prestart=[nri.Hook(path="/a")])))
    validate_adjustment(DefaultValidatorConfig(reject_oci_hook_adjustment=True),
                        _validation(r))
    validate_adjustment(DefaultValidatorConfig(enable=True), _validation(r))


def test_the_validator_rejects_hook_injection_naming_the_plugins() -> None:
    r = _result()
    for p in ("a", "b"):
        r.apply_adjustment(p, nri.ContainerAdjustment(hooks=nri.Hooks(
            prestart=[nri.Hook(path="/" + p)])))
    with pytest.raises(AdjustmentRejected, match="plugins 'a,b' attempted restricted OCI "
                                                 "hook injection"):
        validate_adjustment(DefaultValidatorConfig(enable=True,
                                                   reject_oci_hook_adjustment=True),
                            _validation(r))


@pytest.mark.parametrize(("profile", "knob", "kind"), [
    (None, "reject_unconfined_seccomp_adjustment", "unconfined"),
    (nri.SecurityProfile(profile_type=nri.SecurityProfile.RUNTIME_DEFAULT),
     "reject_runtime_default_seccomp_adjustment", "runtime default"),
    (nri.SecurityProfile(profile_type=nri.SecurityProfile.LOCALHOST, localhost_ref="x"),
     "reject_custom_seccomp_adjustment", "custom"),
])
def test_the_validator_rejects_seccomp_adjustment_by_profile(
        profile: nri.SecurityProfile | None, knob: str, kind: str) -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        seccomp_policy=nri.LinuxSeccomp(default_action="SCMP_ACT_ALLOW"))))
    req = _validation(r, profile=profile)
    with pytest.raises(AdjustmentRejected, match=f"'a' attempted restricted {kind} seccomp"):
        validate_adjustment(DefaultValidatorConfig(enable=True, **{knob: True}), req)
    # The other knobs do not cover this profile.
    others = {k: True for k in ("reject_unconfined_seccomp_adjustment",
                                "reject_runtime_default_seccomp_adjustment",
                                "reject_custom_seccomp_adjustment") if k != knob}
    validate_adjustment(DefaultValidatorConfig(enable=True, **others), req)


def test_the_validator_rejects_namespace_and_sysctl_adjustment() -> None:
    r = _result()
    r.apply_adjustment("a", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        namespaces=[nri.LinuxNamespace(type="network", path="/x")])))
    r.apply_adjustment("b", nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        sysctl={"net.core.somaxconn": "1"})))
    with pytest.raises(AdjustmentRejected, match="namespace adjustment by plugin\\(s\\) 'a' "
                                                 "\\(namespace 'network'\\)"):
        validate_adjustment(DefaultValidatorConfig(enable=True,
                                                   reject_namespace_adjustment=True),
                            _validation(r))
    with pytest.raises(AdjustmentRejected, match="sysctl adjustment by plugin\\(s\\) b"):
        validate_adjustment(DefaultValidatorConfig(enable=True, reject_sysctl_adjustment=True),
                            _validation(r))


def test_the_validator_requires_plugins_from_config_and_annotations() -> None:
    r = _result()
    cfg = DefaultValidatorConfig(enable=True, required_plugins=["a"],
                                 tolerate_missing_plugins_annotation="tolerate")
    validate_adjustment(cfg, _validation(r, plugins=(("a", "10"),)))
    validate_adjustment(DefaultValidatorConfig(enable=True, required_plugins=["10-a"]),
                        _validation(r, plugins=(("a", "10"),)))
    with pytest.raises(AdjustmentRejected, match="required plugin 'a' not present"):
        validate_adjustment(cfg, _validation(r, plugins=()))
    ann = "required-plugins.noderesource.dev"
    with pytest.raises(AdjustmentRejected, match="required plugins \"x,y\" not present"):
        validate_adjustment(cfg, _validation(r, pod_annotations={
            f"{ann}/container.app": "[x, y]", ann: "[z]"}))
    # A container-scoped annotation for another container does not apply.
    validate_adjustment(cfg, _validation(r, pod_annotations={
        f"{ann}/container.other": "[x]"}))
    validate_adjustment(cfg, _validation(r, plugins=(), pod_annotations={
        "tolerate/pod": "true"}))
    with pytest.raises(AdjustmentRejected, match="invalid tolerate annotation"):
        validate_adjustment(cfg, _validation(r, pod_annotations={"tolerate": "maybe"}))
    with pytest.raises(AdjustmentRejected, match="not a list"):
        validate_adjustment(cfg, _validation(r, pod_annotations={ann: "{a: 1}"}))


def test_update_oci_resources_overlays_the_plugins_changes_on_the_request() -> None:
    """UpdateContainer: the request's resources stay but for what a plugin set; a new
    memory limit brings swap along (no swap beyond it); a controller the node lacks is
    dropped as for the CRI's resources."""
    facts = CgroupFacts(1, frozenset({"cpu", "memory", "pids", SWAP}))
    asked = {"cpu": {"shares": 512, "quota": 50000, "period": 100000},
             "memory": {"limit": 64 << 20, "swap": 128 << 20}}
    changes = nri.LinuxResources(
        cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=777)),
        memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=32 << 20)),
        hugepage_limits=[nri.HugepageLimit(page_size="2MB", limit=2 << 20)])
    got = apply.update_oci_resources(asked, changes, ResourceMapper(facts, DROP))
    assert got == {"cpu": {"shares": 777, "quota": 50000, "period": 100000},
                   "memory": {"limit": 32 << 20, "swap": 32 << 20}}
    assert asked["cpu"]["shares"] == 512
    with pytest.raises(FailedPrecondition, match="hugetlb"):
        apply.update_oci_resources(asked, changes, ResourceMapper(facts, FAIL))


def test_applied_resources_override_only_what_the_adjustment_sets() -> None:
    requested = pb.LinuxContainerResources(
        cpu_quota=50000, memory_swap_limit_in_bytes=1 << 30, unified={"a": "1"},
        hugepage_limits=[pb.HugepageLimit(page_size="2MB", limit=1),
                         pb.HugepageLimit(page_size="1GB", limit=2)])
    adj = nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        resources=nri.LinuxResources(
            hugepage_limits=[nri.HugepageLimit(page_size="2MB", limit=9)],
            unified={"b": "2"})))
    out = merge.applied_resources(requested, adj)
    assert out.cpu_quota == 50000 and out.memory_swap_limit_in_bytes == 1 << 30
    assert {h.page_size: h.limit for h in out.hugepage_limits} == {"2MB": 9, "1GB": 2}
    assert dict(out.unified) == {"a": "1", "b": "2"}
    assert requested.hugepage_limits[0].limit == 1  # the request is left as it was
