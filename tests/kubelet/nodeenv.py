"""A node under test for the kubelet layer (crishim and the kubelet driving it), and the
manifests the tests give it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.conftest import e2e_missing
from tests.e2e.daemon import Daemon
from tests.e2e.faults import NetDaemon
from tests.e2e.registry import Registry
from tests.kubelet.node import Kubelet, Pod, cgroup_driver, kubelet, missing_reason


@dataclass
class Node:
    """One node under test: crishim, the kubelet driving it, and the test images."""

    crishim: Daemon
    kubelet: Kubelet
    registry: Registry
    busybox: str
    tmpdir: str

    def rt(self) -> Any:
        """A RuntimeService client of this node's crishim."""
        return self.crishim.runtime()

    def sandboxes(self, pod: str, ready_only: bool = False) -> list[pb.PodSandbox]:
        """The sandboxes crishim has of the kubelet pod named `pod`."""
        items = self.rt().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
        return [s for s in items if s.metadata.name.startswith(pod + "-")
                and (not ready_only or s.state == pb.SANDBOX_READY)]

    def containers(self, pod: str) -> list[pb.Container]:
        """The containers crishim has in the sandboxes of pod `pod`."""
        ids = {s.id for s in self.sandboxes(pod)}
        items = self.rt().ListContainers(pb.ListContainersRequest(), timeout=10).containers
        return [c for c in items if c.pod_sandbox_id in ids]


def skip_reason(version: str) -> str:
    """Why a node with kubelet `version` cannot run here, "" when it can."""
    missing = e2e_missing()
    if missing:
        return "the kubelet layer needs " + ", ".join(missing)
    return missing_reason(version)


def require_kubelet(version: str, what: str, reason: str = "") -> None:
    """Skip a node fixture whose kubelet `version` cannot run here (or that lacks
    `reason`'s part); in CI fail it instead, naming `what`."""
    reason = skip_reason(version) or reason
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{what} cannot run in CI: {reason}")
        pytest.skip(reason)


@contextlib.contextmanager
def kubelet_node(version: str, nd: NetDaemon, registry: Registry, busybox: str, tag: str,
                 **config: Any) -> Iterator[Node]:
    """Kubelet `version` (its configuration `config`) driving the crishim of `nd` on the
    same cgroup driver; at the end the pods a test left are removed by the kubelet like
    any deleted pod, and the kubelet's directory goes."""
    workdir = tempfile.mkdtemp(prefix=f"crishim-kubelet-{tag}-")
    try:
        with kubelet(version, nd.d.endpoint, workdir,
                     cgroupDriver=cgroup_driver(nd.d.runtime()), **config) as k:
            yield Node(nd.d, k, registry, busybox, nd.tmpdir)
            for name in os.listdir(k.manifests):
                os.unlink(os.path.join(k.manifests, name))
    finally:
        remove_kubelet_dir(workdir)


def remove_kubelet_dir(workdir: str) -> None:
    """Unmount what the kubelet mounted under its root (volumes) before deleting it."""
    with open("/proc/self/mountinfo") as fh:
        mounts = [line.split()[4] for line in fh]
    for mp in sorted((m for m in mounts if m.startswith(workdir + "/")), reverse=True):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
    shutil.rmtree(workdir, ignore_errors=True)


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> Pod:
    """A static pod's manifest in namespace "default"; `spec` are more of its spec."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": containers, "terminationGracePeriodSeconds": 2, **spec}}


def ctr(node: Node, name: str, script: str, **extra: Any) -> dict[str, Any]:
    """A busybox container of a manifest running `sh -c script`."""
    return {"name": name, "image": node.busybox, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script], **extra}
