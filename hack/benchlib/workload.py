"""The pod every scenario makes, and timed CRI calls.

The pod looks like one the kubelet would send (metadata, log dir, DNS, cgroup parent,
BestEffort resources) so both runtimes do their real work. The container's shell exits
on SIGTERM right away, so StopContainer measures the runtime, not a grace period.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc as pbg

RPC_TIMEOUT = 120.0
CGROUP_PARENT = "/crishim-bench"
CONTAINER_CMD = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]


class Unsupported(Exception):
    """The runtime answered UNIMPLEMENTED: report it, don't crash."""

    def __init__(self, rpc: str, detail: str) -> None:
        super().__init__(f"{rpc}: {detail}")
        self.rpc = rpc


def timed(rpc: str, fn: Callable[..., Any], req: Any) -> tuple[Any, float]:
    """Call a unary RPC; return (reply, seconds). UNIMPLEMENTED → Unsupported."""
    t0 = time.perf_counter()
    try:
        reply = fn(req, timeout=RPC_TIMEOUT)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise Unsupported(rpc, "UNIMPLEMENTED") from None
        raise
    return reply, time.perf_counter() - t0


def cgroup_parent(runtime: str, pod_uid: str) -> str:
    # kubelet (cgroupfs driver) style: /kubepods/besteffort/pod<uid>
    return f"{CGROUP_PARENT}/{runtime}/pod{pod_uid}"


# The kubelet gives each `hostUsers: false` pod its own 65536 host ids; these are above
# the ranges the e2e tests use.
USERNS_SIZE = 65536
_USERNS_FIRST = 200
_userns_ranges = itertools.count()


def user_namespace() -> pb.NamespaceOption:
    """A pod's namespaces in a user namespace of its own (the kubelet's hostUsers: false)."""
    host = USERNS_SIZE * (_USERNS_FIRST + next(_userns_ranges) % 4096)
    m = pb.IDMapping(container_id=0, host_id=host, length=USERNS_SIZE)
    return pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD,
                              userns_options=pb.UserNamespace(mode=pb.POD, uids=[m],
                                                              gids=[m]))


def pod_config(runtime: str, name: str, log_root: str, userns: bool = False
               ) -> pb.PodSandboxConfig:
    uid = str(uuid.uuid4())
    log_dir = os.path.join(log_root, f"bench_{name}_{uid}")
    ns = (user_namespace() if userns else
          pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD))
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="bench", attempt=0),
        hostname=name,
        log_directory=log_dir,
        dns_config=pb.DNSConfig(servers=["10.96.0.10"], searches=["bench.svc.cluster.local"],
                                options=["ndots:5"]),
        labels={"app": "bench", "io.kubernetes.pod.name": name},
        annotations={"bench/runtime": runtime},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent(runtime, uid),
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns),
        ),
    )


def container_config(image: str, name: str = "app",
                     namespaces: pb.NamespaceOption | None = None) -> pb.ContainerConfig:
    """The workload container; `namespaces`: its pod's (a user namespace is the pod's)."""
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=0),
        image=pb.ImageSpec(image=image),
        command=CONTAINER_CMD[:1],
        args=CONTAINER_CMD[1:],
        log_path=f"{name}/0.log",
        labels={"io.kubernetes.container.name": name},
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(cpu_shares=2, oom_score_adj=1000),
            security_context=pb.LinuxContainerSecurityContext(
                namespace_options=namespaces or pb.NamespaceOption(
                    network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD)),
        ),
    )


@dataclass
class Pod:
    sandbox_id: str = ""
    container_id: str = ""
    config: pb.PodSandboxConfig | None = None
    steps: dict[str, float] = field(default_factory=dict)

    @property
    def ready(self) -> float:
        return sum(self.steps.get(s, 0.0) for s in READY_STEPS)


READY_STEPS = ("RunPodSandbox", "CreateContainer", "StartContainer")
TEARDOWN_STEPS = ("StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox")
ALL_STEPS = READY_STEPS + TEARDOWN_STEPS
CONTAINER_STEPS = ("CreateContainer", "StartContainer", "StopContainer", "RemoveContainer")


def make_ready(rt: pbg.RuntimeServiceStub, runtime: str, name: str, image: str,
               log_root: str, userns: bool = False) -> Pod:
    """RunPodSandbox + CreateContainer + StartContainer, each timed; with `userns`, the
    pod in a user namespace of its own."""
    config = pod_config(runtime, name, log_root, userns)
    os.makedirs(config.log_directory, exist_ok=True)  # the kubelet creates it
    pod = Pod(config=config)
    reply, pod.steps["RunPodSandbox"] = timed(
        "RunPodSandbox", rt.RunPodSandbox, pb.RunPodSandboxRequest(config=config))
    pod.sandbox_id = reply.pod_sandbox_id
    try:
        reply, pod.steps["CreateContainer"] = timed(
            "CreateContainer", rt.CreateContainer,
            pb.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id,
                                      config=container_config(
                                          image, namespaces=config.linux.security_context
                                          .namespace_options if userns else None),
                                      sandbox_config=config))
        pod.container_id = reply.container_id
        _, pod.steps["StartContainer"] = timed(
            "StartContainer", rt.StartContainer,
            pb.StartContainerRequest(container_id=pod.container_id))
    except Exception:
        remove_quietly(rt, pod)
        raise
    return pod


SIGTERM_BIT = 1 << (15 - 1)  # in /proc/<pid>/status SigCgt


def _catches_sigterm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & SIGTERM_BIT)
    except (OSError, ValueError):
        return True  # gone or unreadable: nothing to wait for
    return False


def wait_for_trap(rt: pbg.RuntimeServiceStub, container_id: str, seconds: float = 5.0) -> None:
    """Untimed: wait until the workload's shell has set its TERM trap. A container's init
    ignores a signal it has no handler for, so a Stop that arrived earlier (under load)
    would wait out the whole timeout on any runtime and time the race, not the runtime."""
    try:
        info = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id,
                                                            verbose=True), timeout=10).info
        pid = int(json.loads(info.get("info", "{}")).get("pid", 0))
    except (grpc.RpcError, ValueError):
        pid = 0  # the Stop that follows reports the runtime's trouble
    deadline = time.monotonic() + seconds
    while pid > 0 and not _catches_sigterm(pid) and time.monotonic() < deadline:
        time.sleep(0.005)


def teardown(rt: pbg.RuntimeServiceStub, pod: Pod) -> None:
    """The kubelet's order, each step timed into pod.steps."""
    wait_for_trap(rt, pod.container_id)
    _, pod.steps["StopContainer"] = timed(
        "StopContainer", rt.StopContainer,
        pb.StopContainerRequest(container_id=pod.container_id, timeout=10))
    _, pod.steps["RemoveContainer"] = timed(
        "RemoveContainer", rt.RemoveContainer,
        pb.RemoveContainerRequest(container_id=pod.container_id))
    _, pod.steps["StopPodSandbox"] = timed(
        "StopPodSandbox", rt.StopPodSandbox,
        pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id))
    _, pod.steps["RemovePodSandbox"] = timed(
        "RemovePodSandbox", rt.RemovePodSandbox,
        pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id))


def remove_quietly(rt: pbg.RuntimeServiceStub, pod: Pod) -> None:
    if not pod.sandbox_id:
        return
    for fn, req in ((rt.StopPodSandbox, pb.StopPodSandboxRequest),
                    (rt.RemovePodSandbox, pb.RemovePodSandboxRequest)):
        try:
            fn(req(pod_sandbox_id=pod.sandbox_id), timeout=RPC_TIMEOUT)
        except grpc.RpcError:
            pass


def ensure_image(img: pbg.ImageServiceStub, image: str) -> float:
    _, secs = timed("PullImage", img.PullImage,
                    pb.PullImageRequest(image=pb.ImageSpec(image=image)))
    return secs
