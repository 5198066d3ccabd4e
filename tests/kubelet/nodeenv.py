"""A node under test for the kubelet layer (crishim and the kubelet driving it), and the
manifests the tests give it."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.conftest import e2e_missing
from tests.e2e.daemon import Daemon
from tests.e2e.registry import Registry
from tests.kubelet.node import Kubelet, Pod, missing_reason


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
