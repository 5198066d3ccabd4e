"""crishim's pod and container records as NRI's PodSandbox and Container."""

from __future__ import annotations

from typing import Any

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.spec import PodInfo, SpecInputs, build_spec
from crishim.container.user import ResolvedUser
from crishim.nri.convert import container_to_nri, pod_to_nri, resources_from_cri
from crishim.store.container import Container
from crishim.store.sandbox import READY, Sandbox


def _pod(host_network: bool = False, **kw: Any) -> Sandbox:
    ns = pb.NamespaceOption(network=pb.NODE if host_network else pb.POD, pid=pb.CONTAINER,
                            ipc=pb.POD)
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", uid="u-1", namespace="prod", attempt=1),
        labels={"app": "web"}, annotations={"a": "1"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent="/kubepods/burstable/podu-1",
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns),
            overhead=pb.LinuxContainerResources(cpu_shares=10),
            resources=pb.LinuxContainerResources(cpu_quota=50000, cpu_period=100000,
                                                 memory_limit_in_bytes=1 << 30)))
    fields: dict[str, Any] = {
        "id": "p1", "name": "web_prod_u-1_1", "config": config, "runtime_handler": "runc",
        "created_at": 1, "state": READY, "pid": 4242, "ips": ["10.0.0.5", "fd00::5"],
        "netns_path": "" if host_network else "/run/crishim/netns/p1",
        "cgroups_path": "/kubepods/burstable/podu-1/crishim-p1"}
    fields.update(kw)
    return Sandbox(**fields)


def test_a_pod_carries_its_identity_resources_and_namespaces() -> None:
    p = pod_to_nri(_pod())
    assert (p.id, p.name, p.uid, p.namespace, p.runtime_handler) == \
        ("p1", "web", "u-1", "prod", "runc")
    assert dict(p.labels) == {"app": "web"} and p.annotations["a"] == "1"
    assert p.annotations["io.kubernetes.cri.sandbox-id"] == "p1"
    assert p.annotations["io.kubernetes.cri.container-type"] == "sandbox"
    assert p.pid == 4242 and list(p.ips) == ["10.0.0.5", "fd00::5"]
    lx = p.linux
    assert lx.cgroup_parent == "/kubepods/burstable/podu-1"
    assert lx.cgroups_path == "/kubepods/burstable/podu-1/crishim-p1"
    assert lx.pod_overhead.cpu.shares.value == 10
    assert lx.pod_resources.memory.limit.value == 1 << 30
    assert lx.pod_resources.cpu.quota.value == 50000
    assert [(n.type, n.path) for n in lx.namespaces] == [
        ("pid", ""), ("network", "/run/crishim/netns/p1"), ("ipc", ""), ("uts", ""),
        ("mount", "")]


def test_a_host_network_pod_has_no_network_namespace() -> None:
    types = [n.type for n in pod_to_nri(_pod(host_network=True)).linux.namespaces]
    assert "network" not in types and "uts" not in types


def test_a_pod_in_a_user_namespace_names_it() -> None:
    p = pod_to_nri(_pod(userns_path="/run/crishim/userns/p1"))
    assert nri.LinuxNamespace(type="user", path="/run/crishim/userns/p1") in \
        p.linux.namespaces


def _config() -> pb.ContainerConfig:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app", attempt=0),
        image=pb.ImageSpec(image="busybox"), command=["/bin/sh"], args=["-c", "true"],
        envs=[pb.KeyValue(key="FOO", value=b"bar")], labels={"l": "1"},
        annotations={"io.kubernetes.container.hash": "abc"},
        mounts=[pb.Mount(container_path="/data", host_path="/tmp", readonly=True)],
        CDI_devices=[pb.CDIDevice(name="vendor.com/gpu=0")],
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(cpu_shares=512, memory_limit_in_bytes=64 << 20,
                                                 oom_score_adj=100),
            security_context=pb.LinuxContainerSecurityContext(
                seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))))


def _ctr(**kw: Any) -> Container:
    fields: dict[str, Any] = {
        "id": "c1", "pod_id": "p1", "name": "app_web_prod_u-1_0", "config": _config(),
        "runtime_handler": "runc", "created_at": 100, "image_name": "busybox:latest",
        "image_id": "sha256:1", "image_ref": "sha256:1", "bundle": "/b", "rootfs": "/r",
        "persist_dir": "/p", "uid": 1000, "gid": 1000, "gids": [1000, 10],
        "cgroups_path": "/kubepods/podu-1/crishim-c1"}
    fields.update(kw)
    return Container(**fields)


def _built_spec() -> dict[str, Any]:
    return build_spec(SpecInputs(
        container_id="c1", config=_config(),
        pod=PodInfo(id="p1", name="web", namespace="prod", uid="u-1", pause_pid=4242,
                    netns_path="/run/crishim/netns/p1", cgroup_parent="/kubepods/podu-1"),
        image_config={"Env": ["PATH=/bin"]}, image_name="busybox:latest", rootfs="/r",
        user=ResolvedUser(uid=1000, gid=1000, additional_gids=[10])))


def test_a_container_from_its_built_spec() -> None:
    spec = _built_spec()
    spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 512}]
    spec["hooks"] = {"prestart": [{"path": "/bin/hook", "args": ["hook"], "timeout": 3}]}
    c = container_to_nri(_ctr(), spec)
    assert (c.id, c.pod_sandbox_id, c.name, c.state) == ("c1", "p1", "app",
                                                         nri.CONTAINER_CREATED)
    assert dict(c.labels) == {"l": "1"}
    # The spec's annotations (sandbox id, ...) with the CRI config's.
    assert c.annotations["io.kubernetes.cri.sandbox-id"] == "p1"
    assert c.annotations["io.kubernetes.container.hash"] == "abc"
    assert list(c.args) == ["/bin/sh", "-c", "true"]
    assert "FOO=bar" in c.env and "PATH=/bin" in c.env
    data = next(m for m in c.mounts if m.destination == "/data")
    assert (data.type, data.source, list(data.options)) == ("bind", "/tmp",
                                                            ["rbind", "rprivate", "ro"])
    assert c.hooks.prestart[0].path == "/bin/hook" and c.hooks.prestart[0].timeout.value == 3
    assert [(r.type, r.hard, r.soft) for r in c.rlimits] == [("RLIMIT_NOFILE", 1024, 512)]
    assert (c.user.uid, c.user.gid, list(c.user.additional_gids)) == (1000, 1000, [10])
    assert [d.name for d in c.CDI_devices] == ["vendor.com/gpu=0"]
    lx = c.linux
    assert nri.LinuxNamespace(type="network", path="/run/crishim/netns/p1") in lx.namespaces
    assert lx.resources.cpu.shares.value == 512
    assert lx.resources.memory.limit.value == 64 << 20
    assert lx.resources.devices[0].allow is False
    assert lx.oom_score_adj.value == 100
    assert lx.cgroups_path == "/kubepods/podu-1/crishim-c1"
    assert lx.seccomp_profile.profile_type == nri.SecurityProfile.RUNTIME_DEFAULT
    assert lx.seccomp_policy.default_action == "SCMP_ACT_ERRNO"
    assert any("read" in s.names for s in lx.seccomp_policy.syscalls)


def test_optional_linux_fields_of_the_spec() -> None:
    spec = _built_spec()
    spec["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_BE", "priority": 3}
    spec["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 5,
                                    "flags": ["SCHED_FLAG_RESET_ON_FORK"]}
    spec["linux"]["netDevices"] = {"eth1": {"name": "net1"}}
    spec["linux"]["intelRdt"] = {"closID": "gold", "schemata": ["L3:0=f"]}
    spec["linux"]["sysctl"] = {"net.core.somaxconn": "1024"}
    spec["linux"]["devices"] = [{"path": "/dev/fuse", "type": "c", "major": 10,
                                 "minor": 229, "fileMode": 0o666, "uid": 0, "gid": 0}]
    spec["linux"]["resources"]["pids"] = {"limit": 100}
    spec["linux"]["resources"]["hugepageLimits"] = [{"pageSize": "2MB", "limit": 4}]
    lx = container_to_nri(_ctr(), spec).linux
    assert getattr(lx.io_priority, "class") == nri.IOPRIO_CLASS_BE
    assert lx.io_priority.priority == 3
    assert lx.scheduler.policy == nri.SCHED_BATCH and lx.scheduler.nice == 5
    assert list(lx.scheduler.flags) == [nri.SCHED_FLAG_RESET_ON_FORK]
    assert lx.net_devices["eth1"].name == "net1"
    assert lx.rdt.clos_id.value == "gold" and list(lx.rdt.schemata.value) == ["L3:0=f"]
    assert dict(lx.sysctl) == {"net.core.somaxconn": "1024"}
    dev = lx.devices[0]
    assert (dev.path, dev.type, dev.major, dev.minor, dev.file_mode.value) == \
        ("/dev/fuse", "c", 10, 229, 0o666)
    assert lx.resources.pids.limit == 100
    assert lx.resources.hugepage_limits[0].page_size == "2MB"


def test_a_container_without_its_spec_reads_from_its_config() -> None:
    c = container_to_nri(_ctr(), None)
    assert list(c.args) == ["/bin/sh", "-c", "true"]
    assert list(c.env) == ["FOO=bar"]
    assert [(m.destination, m.source, list(m.options)) for m in c.mounts] == [
        ("/data", "/tmp", ["rbind", "rprivate", "ro"])]
    assert (c.user.uid, list(c.user.additional_gids)) == (1000, [1000, 10])
    assert c.linux.resources.cpu.shares.value == 512
    assert c.linux.oom_score_adj.value == 100
    assert c.linux.cgroups_path == "/kubepods/podu-1/crishim-c1"


def test_container_status_as_nri_reports_it() -> None:
    running = container_to_nri(_ctr(state=pb.CONTAINER_RUNNING, pid=77, started_at=200),
                               None)
    assert (running.state, running.pid, running.started_at, running.created_at) == \
        (nri.CONTAINER_RUNNING, 77, 200, 100)
    done = container_to_nri(_ctr(state=pb.CONTAINER_EXITED, exit_code=0, finished_at=300,
                                 reason="Completed"), None)
    assert (done.state, done.status_reason, done.finished_at) == \
        (nri.CONTAINER_STOPPED, "Completed", 300)
    failed = container_to_nri(_ctr(state=pb.CONTAINER_EXITED, exit_code=137,
                                   reason="OOMKilled", message="oom"), None)
    assert (failed.status_reason, failed.exit_code, failed.status_message) == \
        ("Error", 137, "oom")


def test_cri_resources_keep_zero_as_set_fields() -> None:
    r = resources_from_cri(pb.LinuxContainerResources(
        cpuset_cpus="0-3", hugepage_limits=[pb.HugepageLimit(page_size="1GB", limit=1)],
        unified={"memory.high": "1"}))
    assert r.cpu.HasField("shares") and r.cpu.shares.value == 0
    assert r.memory.HasField("limit") and r.cpu.cpus == "0-3"
    assert r.hugepage_limits[0].page_size == "1GB" and dict(r.unified) == {"memory.high": "1"}


def test_a_request_cannot_claim_crishims_own_annotations_to_a_plugin() -> None:
    # A pod's annotations reach a plugin, but crishim's own names say what crishim made:
    # a container may not pose as another pod's (io.kubernetes.cri.sandbox-id).
    spoof = {"io.kubernetes.cri.sandbox-id": "other-pod",
             "io.kubernetes.cri.image-name": "trusted:latest", "app.example/x": "1"}
    config = _config()
    config.annotations.update(spoof)
    built = container_to_nri(_ctr(config=config), _built_spec())
    assert built.annotations["io.kubernetes.cri.sandbox-id"] == "p1"
    assert built.annotations["io.kubernetes.cri.image-name"] == "busybox:latest"
    assert built.annotations["app.example/x"] == "1"
    bare = container_to_nri(_ctr(config=config), None)
    assert "io.kubernetes.cri.sandbox-id" not in bare.annotations
    assert bare.annotations["app.example/x"] == "1"
    pod = _pod()
    pod.config.annotations.update(spoof)
    seen = pod_to_nri(pod)
    assert seen.annotations["io.kubernetes.cri.sandbox-id"] == "p1"
    assert "io.kubernetes.cri.image-name" not in seen.annotations
    assert seen.annotations["app.example/x"] == "1"
