"""The kubelet layer: crishim driven by stock kubelets (1.32 and 1.36), as on a node.

Each test module runs once per kubelet version: a crishim on its own CNI network, the
kubelet pointed at it, images from the loopback registry. These tests skip only where
../shared/bin has no kubelet and CI is unset; in CI a missing kubelet fails them.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.e2e.cni import module_network
from tests.e2e.conftest import busybox_ref, registry  # noqa: F401  (fixtures)
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import Registry
from tests.kubelet.node import KUBELETS
from tests.kubelet.nodeenv import Node, kubelet_node, require_kubelet


@pytest.fixture(scope="module", params=sorted(KUBELETS), ids=lambda v: f"kubelet-{v}")
def node(request: pytest.FixtureRequest, registry: Registry,  # noqa: F811
         busybox_ref: str) -> Iterator[Node]:  # noqa: F811
    version: str = request.param
    require_kubelet(version, f"kubelet {version}")
    with networked_daemon("crishim-kl", *module_network(f"kubelet-{version}"),
                          image=busybox_ref) as nd, \
            kubelet_node(version, nd, registry, busybox_ref, version,
                         featureGates={"PodAndContainerStatsFromCRI": True}) as node_:
        yield node_


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    node_ = getattr(item, "funcargs", {}).get("node")
    if report.failed and isinstance(node_, Node):
        report.sections.append(("kubelet log (tail)", node_.kubelet.tail(80)))
        report.sections.append(("crishim log (tail)", node_.crishim.logs()[-6000:]))
    return report
