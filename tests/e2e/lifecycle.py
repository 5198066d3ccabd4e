"""A daemon on its own CNI network and the CRI calls the container tests make through it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.daemon import Daemon
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import Registry


@dataclass
class Env:
    """A daemon on its own CNI network, with busybox pulled from `registry`."""

    d: Daemon
    tmpdir: str
    bridge: str
    registry: Registry
    busybox: str  # image ref, pulled

    def rt(self) -> Any:
        return self.d.runtime()


@contextlib.contextmanager
def daemon_env(registry: Registry, busybox_ref: str, name: str, bridge: str, subnet: str,
               extra_config: str = "") -> Iterator[Env]:
    """A daemon on its own CNI network with busybox pulled; everything it made is removed
    afterwards, also after a failure. `{tmpdir}` in `extra_config` is the env's temp dir
    (a handler's root there is cleaned up too)."""
    with networked_daemon(name, bridge, subnet, extra_config, busybox_ref,
                          extra_roots=[("runc", "{tmpdir}/second-root")]) as nd:
        yield Env(nd.d, nd.tmpdir, bridge, registry, busybox_ref)


_pods = 0


def run_pod(env: Env, handler: str = "", port_mappings: list[pb.PortMapping] | None = None
            ) -> tuple[str, pb.PodSandboxConfig]:
    """A pod with its own name, logs under the env's temp dir."""
    global _pods
    _pods += 1
    logdir = os.path.join(env.tmpdir, "logs", f"pod{_pods}")
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"pod{_pods}", namespace="e2e", uid=f"uid-{_pods}"),
        hostname=f"pod{_pods}", log_directory=logdir, port_mappings=port_mappings or [],
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption())))
    resp = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler),
                                  timeout=60)
    return resp.pod_sandbox_id, cfg


def remove_pod(env: Env, pod_id: str) -> None:
    """StopPodSandbox then RemovePodSandbox."""
    env.rt().StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    env.rt().RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)


@contextlib.contextmanager
def pod(env: Env, **kw: Any) -> Iterator[tuple[str, pb.PodSandboxConfig]]:
    """run_pod, and the pod removed at the end."""
    pod_id, cfg = run_pod(env, **kw)
    try:
        yield pod_id, cfg
    finally:
        remove_pod(env, pod_id)


def container(env: Env, pod_id: str, pod_cfg: pb.PodSandboxConfig, name: str,
              cmd: list[str] | None, image: str = "", start: bool = True, **kw: Any) -> str:
    """A container created (and started unless `start` is false) in the pod; its id."""
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                             image=pb.ImageSpec(image=image or env.busybox),
                             command=cmd or [], log_path=f"{name}.log", **kw)
    cid = env.rt().CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg), timeout=60).container_id
    if start:
        env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
    return cid


def status(env: Env, cid: str, verbose: bool = False) -> pb.ContainerStatusResponse:
    """ContainerStatus of `cid`."""
    return env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid,
                                                              verbose=verbose), timeout=10)


def wait_exited(env: Env, cid: str, seconds: float = 30) -> pb.ContainerStatus:
    """The status of `cid` once it exited, polled for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        st = status(env, cid).status
        if st.state == pb.CONTAINER_EXITED:
            return st
        time.sleep(0.05)
    raise AssertionError(f"container {cid} did not exit within {seconds}s")


def exec_sync(env: Env, cid: str, cmd: list[str], timeout: int = 10) -> pb.ExecSyncResponse:
    """ExecSync of `cmd` in `cid`."""
    return env.rt().ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout),
                             timeout=timeout + 10)


def log_lines(path: str) -> list[tuple[str, str]]:
    """(stream, text) of each line of a CRI log file, its tags checked."""
    out = []
    with open(path) as fh:
        for line in fh:
            _ts, stream, tag, text = line.rstrip("\n").split(" ", 3)
            assert tag in ("F", "P")
            out.append((stream, text))
    return out
