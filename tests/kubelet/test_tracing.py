"""Tracing under a stock kubelet 1.36 with its own tracing on (KubeletTracing): a static
pod's start is one trace in which crishim's spans are the children of the kubelet's CRI
client spans, with the CNI, OCI runtime and pull steps below them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cni import module_network
from tests.e2e.conftest import busybox_ref, registry  # noqa: F401  (fixtures)
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import Registry
from tests.fakes.otlp import Receiver, Span, tree
from tests.kubelet.nodeenv import Node, ctr, kubelet_node, pod, require_kubelet

VERSION = "1.36"
RPC = "runtime.v1.RuntimeService/"


@pytest.fixture(scope="module")
def traced_node(registry: Registry, busybox_ref: str) -> Iterator[tuple[Node, Receiver]]:  # noqa: F811
    require_kubelet(VERSION, "the kubelet tracing test")
    with Receiver() as rx, networked_daemon(
            "crishim-kltrace", *module_network("kubelet-tracing"),
            f'[tracing]\nendpoint = "{rx.grpc_endpoint}"\nsampling_rate_per_million = 1\n',
            image=busybox_ref) as nd, \
            kubelet_node(VERSION, nd, registry, busybox_ref, f"tracing-{VERSION}",
                         # The kubelet samples every trace and sends its context on each
                         # CRI call; crishim's own rate (1 per million) then plays no
                         # part: the caller decides.
                         featureGates={"KubeletTracing": True},
                         tracing={"endpoint": rx.grpc_endpoint,
                                  "samplingRatePerMillion": 1000000}) as node:
        yield node, rx


def test_a_static_pod_start_holds_crishims_spans_under_the_kubelets(
        traced_node: tuple[Node, Receiver]) -> None:
    node, rx = traced_node
    k = node.kubelet
    k.write_manifest("traced", pod("traced", [ctr(node, "app", "sleep 3600")]))
    k.wait_ready("traced", 90)

    def run_pod_spans(spans: list[Span]) -> list[Span]:
        return [s for s in spans if s.service == "crishim" and s.name == RPC + "RunPodSandbox"
                and str(s.attributes.get("cri.name")).startswith("traced")]  # traced-<node>

    def complete(spans: list[Span]) -> bool:
        ids = {s.span_id for s in spans}
        return any(s.parent_id in ids for s in run_pod_spans(spans)) and any(
            s.service == "crishim" and s.name == RPC + "StartContainer" for s in spans)

    spans = rx.wait(complete, timeout=60)
    by_id = {s.span_id: s for s in spans}
    (run,) = [s for s in run_pod_spans(spans) if s.parent_id in by_id]
    caller = by_id[run.parent_id]
    # The parent is the kubelet's own CRI client span, in the kubelet's trace.
    assert caller.service == "kubelet" and caller.trace_id == run.trace_id, caller
    assert caller.name.endswith("RunPodSandbox"), caller
    below = [s.name for s in spans if s.parent_id == run.span_id]
    assert "cni ADD bridge" in below and "runc create" in below, below
    # The container's start under the kubelet's StartContainer call.
    starts = [s for s in spans if s.service == "crishim" and s.name == RPC + "StartContainer"
              and s.trace_id in {r.trace_id for r in spans if r.service == "kubelet"}]
    assert starts and all(by_id[s.parent_id].service == "kubelet" for s in starts
                          if s.parent_id in by_id)
    top = caller
    while top.parent_id in by_id:
        top = by_id[top.parent_id]
    print("\n" + tree(spans, top))
    k.remove_manifest("traced")
