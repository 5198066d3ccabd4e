"""A daemon whose pods get cgroups under a test-owned parent, for the stats and cgroup
tests, and the CRI calls they make through it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.daemon import Daemon
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import free_port

MiB = 1024 * 1024
CGROUP_V1 = not os.path.isfile("/sys/fs/cgroup/cgroup.controllers")
CGROUP_ROOT = f"crishim-e2e-stats-{os.getpid()}"
# The systemd driver takes slices only: "<SLICE_ROOT>-pod<n>.slice" in <SLICE_ROOT>.slice.
SLICE_ROOT = f"crishime2estats{os.getpid()}"


@dataclass
class Env:
    """A stats_daemon: its socket, files, image, metrics port and cgroup driver."""

    d: Daemon
    tmpdir: str
    busybox: str
    metrics_port: int
    driver: str  # the cgroup driver the daemon reports (RuntimeConfig)

    def rt(self) -> Any:
        return self.d.runtime()


def _remove_cgroups() -> None:
    """rmdir our test cgroup tree in every hierarchy, deepest first (and stop the test's
    slices, which crishim stops with each pod unless a failing test left one behind)."""
    if os.path.isdir("/run/systemd/system"):
        subprocess.run(["systemctl", "stop", f"{SLICE_ROOT}.slice"], check=False,
                       capture_output=True)
    bases = ([os.path.join("/sys/fs/cgroup", c) for c in os.listdir("/sys/fs/cgroup")]
             if CGROUP_V1 else ["/sys/fs/cgroup"])
    for base in bases:
        top = os.path.join(base, CGROUP_ROOT)
        if not os.path.isdir(top):
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


@contextlib.contextmanager
def stats_daemon(busybox_ref: str) -> Iterator[Env]:
    """The daemon and pod network of a module (test_stats_runtime, test_cgroup_v2)."""
    port = free_port()
    try:
        with networked_daemon("crishim-stats", *module_network("stats"),
                              f'[metrics]\naddress = "127.0.0.1:{port}"\n', busybox_ref) as nd:
            resp = nd.d.runtime().RuntimeConfig(pb.RuntimeConfigRequest(), timeout=10)
            driver = ("systemd" if resp.linux.cgroup_driver == pb.CgroupDriver.SYSTEMD
                      else "cgroupfs")
            yield Env(nd.d, nd.tmpdir, busybox_ref, port, driver)
    finally:
        _remove_cgroups()


_pods = 0


@contextlib.contextmanager
def pod(env: Env) -> Iterator[tuple[str, pb.PodSandboxConfig]]:
    """A pod in a pod-level cgroup of its own under the test-owned parent, removed at the
    end."""
    global _pods
    _pods += 1
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"stats{_pods}", namespace="e2e",
                                       uid=f"uid-stats-{_pods}"),
        hostname=f"stats{_pods}", log_directory=os.path.join(env.tmpdir, "logs", str(_pods)),
        labels={"suite": "stats", "n": str(_pods)},
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=(
            f"/{SLICE_ROOT}.slice/{SLICE_ROOT}-pod{_pods}.slice" if env.driver == "systemd"
            else f"/{CGROUP_ROOT}/pod{_pods}")))
    pod_id = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                    timeout=60).pod_sandbox_id
    try:
        yield pod_id, cfg
    finally:
        env.rt().StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        env.rt().RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)


def container(env: Env, pod_id: str, pod_cfg: pb.PodSandboxConfig, name: str, cmd: list[str],
              rt: Any = None, start: bool = True, **kw: Any) -> str:
    """A busybox container created (and started unless `start` is false); its id."""
    rt = rt or env.rt()
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                             image=pb.ImageSpec(image=env.busybox), command=cmd,
                             labels={"ctr": name}, **kw)
    cid: str = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg), timeout=60).container_id
    if start:
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
    return cid


def container_cgroup(env: Env, cid: str, controller: str) -> str:
    """Host directory of the container's cgroup for `controller`, from its init's view."""
    info = json.loads(env.rt().ContainerStatus(pb.ContainerStatusRequest(
        container_id=cid, verbose=True), timeout=10).info["info"])
    with open(f"/proc/{info['pid']}/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if (CGROUP_V1 and controller in ctrls.split(",")) or (not CGROUP_V1 and not ctrls):
                base = f"/sys/fs/cgroup/{controller}" if CGROUP_V1 else "/sys/fs/cgroup"
                return base + path
    raise AssertionError(f"no {controller} cgroup for {cid}")


def stats(env: Env, cid: str) -> pb.ContainerStats:
    """ContainerStats of `cid`."""
    resp: pb.ContainerStatsResponse = env.rt().ContainerStats(
        pb.ContainerStatsRequest(container_id=cid), timeout=10)
    return resp.stats
