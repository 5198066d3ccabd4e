"""The kubelet layer: crishim driven by stock kubelets (1.32 and 1.36), as on a node.

Each test module runs once per kubelet version: a crishim on its own CNI network, the
kubelet pointed at it, images from the loopback registry. These tests skip only where
../shared/bin has no kubelet and CI is unset; in CI a missing kubelet fails them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Generator, Iterator

import pytest

from tests.e2e.cni import module_network
from tests.e2e.conftest import busybox_ref, registry  # noqa: F401  (fixtures)
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import Registry
from tests.kubelet.node import KUBELETS, cgroup_driver, kubelet
from tests.kubelet.nodeenv import Node
from tests.kubelet.nodeenv import remove_kubelet_dir as _remove_kubelet_dir
from tests.kubelet.nodeenv import skip_reason as _skip_reason


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    node_ = getattr(item, "funcargs", {}).get("node")
    if report.failed and isinstance(node_, Node):
        report.sections.append(("kubelet log (tail)", node_.kubelet.tail(80)))
        report.sections.append(("crishim log (tail)", node_.crishim.logs()[-6000:]))
    return report
