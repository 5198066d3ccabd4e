"""Bad input at the door, through the real socket: each bad value of each field is
refused with INVALID_ARGUMENT (or FAILED_PRECONDITION) naming the field, and leaves
nothing behind: no pod, no container, no bundle, mount, netns or cgroup, and no file
outside crishim's own places.

One daemon and one ready pod for the module; every case runs against them.
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host.facts import hybrid_v2_controllers
from tests.e2e.lifecycle import Env, daemon_env, run_pod
from tests.e2e.registry import Registry

_TAG = os.getpid() % 40
BAD: Any = 9  # a value no enum of the API has
MiB = 1 << 20


@dataclass
class World:
    env: Env
    pod_id: str
    pod_cfg: pb.PodSandboxConfig
    ctr_id: str  # a created (not started) container of the pod
    victim_dir: str  # outside every root: nothing may appear here


def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return sorted(line.split()[4] for line in fh if line.split()[4].startswith(path))


def _state(w: World) -> dict[str, Any]:
    d = w.env.d
    rt = w.env.rt()
    return {
        "pods": sorted(p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                       timeout=10).items),
        "containers": sorted(c.id for c in rt.ListContainers(pb.ListContainersRequest(),
                                                             timeout=10).containers),
        "bundles": sorted(os.listdir(os.path.join(d.root, "containers"))),
        "sandboxes": sorted(os.listdir(os.path.join(d.root, "sandboxes"))),
        "netns": sorted(os.listdir(os.path.join(d.state, "netns")))
        if os.path.isdir(os.path.join(d.state, "netns")) else [],
        "mounts": _mounts_under(d.root) + _mounts_under(d.state),
        "victims": sorted(os.listdir(w.victim_dir)),
        "cgroups": sorted(glob.glob(f"/sys/fs/cgroup/*/crishim-bad-{_TAG}*")
                          + glob.glob(f"/sys/fs/cgroup/crishim-bad-{_TAG}*")),
    }


@pytest.fixture(scope="module")
def world(registry: Registry, busybox_ref: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    with daemon_env(registry, busybox_ref, "crishim-bad", f"crbad{_TAG}",
                    f"10.{100 + _TAG % 50}.97.0/24",
                    '[runtimes.runc]\npath = "runc"\n[runtimes.crun]\npath = "crun"\n') as env:
        pod_id, pod_cfg = run_pod(env)
        cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="good"),
                                 image=pb.ImageSpec(image=env.busybox), command=["true"],
                                 log_path="good.log")
        ctr_id = env.rt().CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg),
            timeout=60).container_id
        victims = tmp_path_factory.mktemp("victims")
        yield World(env, pod_id, pod_cfg, ctr_id, str(victims))


def _refused(call: Callable[[], Any], code: grpc.StatusCode, field: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    message = str(err.value.details())
    assert field in message, message
    return message


# --- RunPodSandbox ---

def _pod(w: World, name: str) -> pb.PodSandboxConfig:
    cfg = pb.PodSandboxConfig()
    cfg.CopyFrom(w.pod_cfg)
    cfg.metadata.name = cfg.metadata.uid = f"bad-{name}"
    cfg.log_directory = os.path.join(w.env.tmpdir, "logs", f"bad-{name}")
    return cfg


PodEdit = Callable[[pb.PodSandboxConfig, World], None]


def _set_resources(**kw: int) -> PodEdit:
    def edit(c: pb.PodSandboxConfig, w: World) -> None:
        for k, v in kw.items():
            setattr(c.linux.resources, k, v)
    return edit


POD_CASES: list[tuple[str, PodEdit, str]] = [
    ("cgroup-escape", lambda c, w: setattr(c.linux, "cgroup_parent",
                                           f"/kubepods/../../crishim-bad-{_TAG}"),
     "cgroup_parent"),
    ("cgroup-relative", lambda c, w: setattr(c.linux, "cgroup_parent",
                                             f"crishim-bad-{_TAG}/x"), "cgroup_parent"),
    ("logdir-relative", lambda c, w: setattr(c, "log_directory", "relative/logs"),
     "log_directory"),
    ("logdir-dotdot", lambda c, w: setattr(c, "log_directory",
                                           w.victim_dir + "/../x"), "log_directory"),
    ("netns-mode", lambda c, w: setattr(c.linux.security_context.namespace_options,
                                        "network", BAD), "namespace_options.network"),
    ("pidns-mode", lambda c, w: setattr(c.linux.security_context.namespace_options,
                                        "pid", BAD), "namespace_options.pid"),
    ("dns-server", lambda c, w: c.dns_config.servers.append("not-an-ip"),
     "dns_config.servers"),
    ("dns-option", lambda c, w: c.dns_config.options.append("ndots:1\nnameserver 1.1.1.1"),
     "dns_config.options"),
    ("dns-search", lambda c, w: c.dns_config.searches.append("a b"), "dns_config.searches"),
    ("hostname", lambda c, w: setattr(c, "hostname", "-not_a_host-"), "hostname"),
    ("hostname-long", lambda c, w: setattr(c, "hostname", "h" * 70), "hostname"),
    ("sysctl-name", lambda c, w: c.linux.sysctls.__setitem__("net.ipv4..x", "1"), "sysctl"),
    ("sysctl-node", lambda c, w: c.linux.sysctls.__setitem__("vm.swappiness", "1"),
     "vm.swappiness"),
    ("name-slash", lambda c, w: setattr(c.metadata, "name", "a/b"), "metadata.name"),
    ("port", lambda c, w: c.port_mappings.append(pb.PortMapping(container_port=70000)),
     "port mapping"),
    ("port-host-ip", lambda c, w: c.port_mappings.append(
        pb.PortMapping(container_port=80, host_port=8080, host_ip="not-an-ip")),
     "port_mappings.host_ip"),
    ("pod-cpu-shares", _set_resources(cpu_shares=-1), "cpu_shares"),
    ("pod-memory", _set_resources(memory_limit_in_bytes=4096), "memory_limit_in_bytes"),
]


@pytest.mark.parametrize(("name", "edit", "field"), POD_CASES,
                         ids=[c[0] for c in POD_CASES])
def test_run_pod_sandbox_refuses(world: World, name: str, edit: PodEdit,
                                 field: str) -> None:
    before = _state(world)
    cfg = _pod(world, name)
    edit(cfg, world)
    _refused(lambda: world.env.rt().RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg), timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT, field)
    assert _state(world) == before


# --- CreateContainer ---

CtrEdit = Callable[[pb.ContainerConfig, World], None]


def _res(**kw: Any) -> CtrEdit:
    def edit(c: pb.ContainerConfig, w: World) -> None:
        for k, v in kw.items():
            setattr(c.linux.resources, k, v)
    return edit


CONTAINER_CASES: list[tuple[str, CtrEdit, str]] = [
    ("log-absolute", lambda c, w: setattr(c, "log_path", w.victim_dir + "/abs.log"),
     "log_path"),
    ("log-dotdot", lambda c, w: setattr(
        c, "log_path", "../" * 12 + w.victim_dir.lstrip("/") + "/up.log"), "log_path"),
    ("log-unnormalised", lambda c, w: setattr(c, "log_path", "a//b.log"), "log_path"),
    ("cpu-shares", _res(cpu_shares=-1), "cpu_shares"),
    ("cpu-period", _res(cpu_period=10), "cpu_period"),
    ("cpu-quota", _res(cpu_quota=-5), "cpu_quota"),
    ("memory", _res(memory_limit_in_bytes=4096), "memory_limit_in_bytes"),
    ("cpuset-cpus", _res(cpuset_cpus="0-999"), "cpuset_cpus"),
    ("cpuset-syntax", _res(cpuset_cpus="0-a"), "cpuset_cpus"),
    ("oom-score", _res(oom_score_adj=5000), "oom_score_adj"),
    ("image-ref", lambda c, w: setattr(c.image, "image", "bad::ref"), "image.image"),
    ("mount-relative", lambda c, w: c.mounts.append(
        pb.Mount(container_path="data", host_path=w.victim_dir)), "mounts[0].container_path"),
    ("mount-propagation", lambda c, w: c.mounts.append(
        pb.Mount(container_path="/data", host_path=w.victim_dir, propagation=BAD)),
     "mounts[0].propagation"),
    ("workdir", lambda c, w: setattr(c, "working_dir", "relative"), "working_dir"),
    ("pid-mode", lambda c, w: setattr(c.linux.security_context.namespace_options, "pid",
                                      BAD), "namespace_options.pid"),
    ("name-slash", lambda c, w: setattr(c.metadata, "name", "a/b"), "metadata.name"),
    ("run-as-user", lambda c, w: c.linux.security_context.run_as_user.CopyFrom(
        pb.Int64Value(value=-1)), "run_as_user"),
    ("device-perms", lambda c, w: c.devices.append(pb.Device(
        container_path="/dev/x", host_path="/dev/null", permissions="rwx")),
     "devices[0].permissions"),
]


@pytest.mark.parametrize(("name", "edit", "field"), CONTAINER_CASES,
                         ids=[c[0] for c in CONTAINER_CASES])
def test_create_container_refuses(world: World, name: str, edit: CtrEdit,
                                  field: str) -> None:
    before = _state(world)
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=f"bad-{name}"),
                             image=pb.ImageSpec(image=world.env.busybox), command=["true"],
                             log_path=f"bad-{name}.log")
    edit(cfg, world)
    _refused(lambda: world.env.rt().CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=world.pod_id, config=cfg, sandbox_config=world.pod_cfg), timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT, field)
    assert _state(world) == before


# --- Update*Resources: the same rules as at create ---

UPDATE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("cpu-shares", {"cpu_shares": -1}, "cpu_shares"),
    ("memory", {"memory_limit_in_bytes": 4096}, "memory_limit_in_bytes"),
    ("cpuset-cpus", {"cpuset_cpus": "0-999"}, "cpuset_cpus"),
    ("cpu-quota", {"cpu_quota": -5}, "cpu_quota"),
]


@pytest.mark.parametrize(("name", "res", "field"), UPDATE_CASES,
                         ids=[c[0] for c in UPDATE_CASES])
def test_update_resources_refuses(world: World, name: str, res: dict[str, Any],
                                  field: str) -> None:
    before = _state(world)
    rt = world.env.rt()
    _refused(lambda: rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=world.ctr_id, linux=pb.LinuxContainerResources(**res)), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT, field)
    _refused(lambda: rt.UpdatePodSandboxResources(pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=world.pod_id, resources=pb.LinuxContainerResources(**res)),
        timeout=30), grpc.StatusCode.INVALID_ARGUMENT, field)
    assert _state(world) == before


def test_pod_without_user_namespace_reports_node(world: World) -> None:
    st = world.env.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(
        pod_sandbox_id=world.pod_id), timeout=10).status
    assert st.linux.namespaces.options.userns_options.mode == pb.NODE


def test_failed_calls_are_logged_once_without_traceback(world: World) -> None:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="logged"),
                             image=pb.ImageSpec(image=world.env.busybox),
                             log_path="/etc/crishim-logged.log")
    _refused(lambda: world.env.rt().CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=world.pod_id, config=cfg, sandbox_config=world.pod_cfg), timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT, "log_path")
    lines = [line for line in world.env.d.logs().splitlines()
             if "crishim-logged.log" in line]
    assert len(lines) == 1, lines
    assert "level=warning" in lines[0] and "method=CreateContainer" in lines[0]
    assert f"pod={world.pod_id}" in lines[0] and "code=INVALID_ARGUMENT" in lines[0]
    assert "Traceback" not in world.env.d.logs()
    assert not os.path.exists("/etc/crishim-logged.log")


def test_start_names_the_version_and_the_host(world: World) -> None:
    with open(world.env.d.log_path, errors="replace") as fh:
        start = next(line for line in fh if 'msg="crishim runtime service"' in line)
    for key in ("version=", "kernel=", "cgroup_version=", "cgroup_driver=", "controllers=",
                "handlers=runc,crun"):
        assert key in start, start
    assert "[" not in start and "'" not in start, start


def test_timed_out_exec_sync_logs_no_unretrieved_exception(world: World) -> None:
    rt = world.env.rt()
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="sleeper"),
                             image=pb.ImageSpec(image=world.env.busybox),
                             command=["sleep", "3600"], log_path="sleeper.log")
    cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=world.pod_id, config=cfg, sandbox_config=world.pod_cfg),
        timeout=60).container_id
    try:
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        for _ in range(2):
            _refused(lambda: rt.ExecSync(pb.ExecSyncRequest(
                container_id=cid, cmd=["sleep", "30"], timeout=1), timeout=30),
                grpc.StatusCode.DEADLINE_EXCEEDED, "timed out")
        time.sleep(1.0)  # the cancelled collect is finished and dropped by now
        logs = world.env.d.logs()
        assert "never retrieved" not in logs
        assert "Traceback" not in logs
    finally:
        rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
        rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
        # Its files go after the reply: gone before the next test takes its snapshot.
        bundle = os.path.join(world.env.d.root, "containers", cid)
        deadline = time.monotonic() + 10
        while os.path.exists(bundle) and time.monotonic() < deadline:
            time.sleep(0.05)


def test_a_handler_that_cannot_run_here_is_not_announced_and_refused(world: World) -> None:
    if not hybrid_v2_controllers():
        pytest.skip("crun runs on this host (cgroup v2, or v1 without controllers in "
                    "/sys/fs/cgroup/unified)")
    rt = world.env.rt()
    # crun refuses a cgroup v1 host whose cgroup2 mount beside it has controllers: the
    # handler is not announced, and the verbose info and the start log say why.
    status = rt.Status(pb.StatusRequest(verbose=True), timeout=30)
    assert {h.name for h in status.runtime_handlers} == {"", "runc"}
    assert {c.type: c.status for c in status.status.conditions}["RuntimeReady"]
    crun = json.loads(status.info["runtimeHandlers"])["crun"]
    assert crun["ready"] is False and "hybrid" in crun["reason"], crun
    assert json.loads(status.info["runtimeHandlers"])["runc"]["ready"] is True
    with open(world.env.d.log_path, errors="replace") as fh:
        warned = [line for line in fh if "runtime handler cannot run on this host" in line]
    assert len(warned) == 1 and "handler=crun" in warned[0], warned
    # A pod for it is FAILED_PRECONDITION naming the handler and why; nothing is left.
    before = _state(world)
    message = _refused(lambda: rt.RunPodSandbox(pb.RunPodSandboxRequest(
        config=_pod(world, "crun"), runtime_handler="crun"), timeout=60),
        grpc.StatusCode.FAILED_PRECONDITION, "runtime handler 'crun'")
    assert "hybrid" in message and "/sys/fs/cgroup/unified" in message, message
    assert _state(world) == before
