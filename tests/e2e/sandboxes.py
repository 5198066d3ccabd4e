"""A daemon on its own CNI network for the pod sandbox tests, and the CRI calls they make
through it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc
from tests.e2e.daemon import Daemon
from tests.e2e.faults import networked_daemon

_TAG = os.getpid() % 50
_counter = 0


@dataclass
class Env:
    """Where a sandbox_daemon keeps its files, and its CNI network."""

    tmpdir: str
    bridge: str
    subnet: str
    config: str


def pause_gone(pid: int) -> bool:
    """The pause process has exited. Nobody but init is its parent: where init does not
    reap orphans (some VM/container inits) it stays a zombie, which is gone enough."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


@contextlib.contextmanager
def sandbox_daemon(extra: str = "") -> Iterator[tuple[Daemon, Env]]:
    """A daemon on its own CNI network; `extra` is TOML for the top-level keys."""
    global _counter
    _counter += 1
    # A bridge name and subnet of our own: never the host's network, nor other tests'.
    bridge = f"crisb{_TAG}x{_counter}"
    subnet = f"172.{20 + _TAG % 10}.{100 + _TAG + _counter}.0/24"
    with networked_daemon("crishim-sb", bridge, subnet, extra) as nd:
        yield nd.d, Env(nd.tmpdir, bridge, subnet, nd.config)


def pod_config(name: str, uid: str = "", host_network: bool = False, **kw: Any
               ) -> pb.PodSandboxConfig:
    """A pod named `name` in namespace "e2e"; `kw` are more PodSandboxConfig fields."""
    ns = pb.NamespaceOption(network=pb.NODE if host_network else pb.POD)
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid or f"uid-{name}", namespace="e2e"),
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)), **kw)
    return config


def run_pod(rt: api_pb2_grpc.RuntimeServiceStub, config: pb.PodSandboxConfig) -> str:
    """RunPodSandbox; the pod's id."""
    return str(rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)
               .pod_sandbox_id)


def remove_pod(rt: api_pb2_grpc.RuntimeServiceStub, sid: str) -> None:
    """StopPodSandbox then RemovePodSandbox."""
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)


@contextlib.contextmanager
def running_pod(rt: api_pb2_grpc.RuntimeServiceStub, config: pb.PodSandboxConfig
                ) -> Iterator[str]:
    """A pod run from `config` (its id), stopped and removed at the end."""
    sid = run_pod(rt, config)
    try:
        yield sid
    finally:
        remove_pod(rt, sid)


def status(rt: api_pb2_grpc.RuntimeServiceStub, sid: str,
           verbose: bool = False) -> pb.PodSandboxStatusResponse:
    """PodSandboxStatus of `sid`."""
    return rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid,
                                                          verbose=verbose), timeout=10)


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    """A host command run to its end, its output captured, its exit status not checked."""
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
