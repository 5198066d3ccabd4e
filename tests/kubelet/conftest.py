"""The kubelet layer: crishim driven by stock kubelets (1.32 and 1.36), as on a node.

Each test module runs once per kubelet version: a crishim on its own CNI network, the
kubelet pointed at it, images from the loopback registry. These tests skip only where
../shared/bin has no kubelet and CI is unset; in CI a missing kubelet fails them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.conftest import e2e_missing
from tests.e2e.cni import module_network
from tests.e2e.conftest import busybox_ref, registry  # noqa: F401  (fixtures)
from tests.e2e.daemon import Daemon
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import Registry
from tests.kubelet.node import KUBELETS, Kubelet, cgroup_driver, kubelet, missing_reason


@dataclass
class Node:
    """One node under test: crishim, the kubelet driving it, and the test images."""

    crishim: Daemon
    kubelet: Kubelet
    registry: Registry
    busybox: str
    tmpdir: str

    def rt(self) -> Any:
        return self.crishim.runtime()

    def sandboxes(self, pod: str, ready_only: bool = False) -> list[pb.PodSandbox]:
        items = self.rt().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
        return [s for s in items if s.metadata.name.startswith(pod + "-")
                and (not ready_only or s.state == pb.SANDBOX_READY)]

    def containers(self, pod: str) -> list[pb.Container]:
        ids = {s.id for s in self.sandboxes(pod)}
        items = self.rt().ListContainers(pb.ListContainersRequest(), timeout=10).containers
        return [c for c in items if c.pod_sandbox_id in ids]


def _skip_reason(version: str) -> str:
    missing = e2e_missing()
    if missing:
        return "the kubelet layer needs " + ", ".join(missing)
    return missing_reason(version)


@pytest.fixture(scope="module", params=sorted(KUBELETS), ids=lambda v: f"kubelet-{v}")
def node(request: pytest.FixtureRequest, registry: Registry,  # noqa: F811
         busybox_ref: str) -> Iterator[Node]:  # noqa: F811
    version: str = request.param
    reason = _skip_reason(version)
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"kubelet {version} cannot run in CI: {reason}")
        pytest.skip(reason)
    with networked_daemon("crishim-kl", *module_network(f"kubelet-{version}"),
                          image=busybox_ref) as nd:
        workdir = tempfile.mkdtemp(prefix=f"crishim-kubelet-{version}-")
        try:
            with kubelet(version, nd.d.endpoint, workdir,
                         cgroupDriver=cgroup_driver(nd.d.runtime()),
                         featureGates={"PodAndContainerStatsFromCRI": True}) as k:
                yield Node(nd.d, k, registry, busybox_ref, nd.tmpdir)
                # Whatever a test left: the kubelet removes it like any deleted pod.
                for name in os.listdir(k.manifests):
                    os.unlink(os.path.join(k.manifests, name))
        finally:
            _remove_kubelet_dir(workdir)


def _remove_kubelet_dir(workdir: str) -> None:
    """Unmount what the kubelet mounted under its root (volumes) before deleting it."""
    with open("/proc/self/mountinfo") as fh:
        mounts = [line.split()[4] for line in fh]
    for mp in sorted((m for m in mounts if m.startswith(workdir + "/")), reverse=True):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    node_ = getattr(item, "funcargs", {}).get("node")
    if report.failed and isinstance(node_, Node):
        report.sections.append(("kubelet log (tail)", node_.kubelet.tail(80)))
        report.sections.append(("crishim log (tail)", node_.crishim.logs()[-6000:]))
    return report
