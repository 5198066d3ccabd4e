"""hack/bench against fake CRI stubs: an UNIMPLEMENTED side gets a note, not a crash,
and the other side's column still fills."""

from __future__ import annotations

import tempfile
from typing import Any

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from hack.benchlib import scenarios
from hack.benchlib.images import BenchImages
from hack.benchlib.report import Results, render_markdown


class Unimplemented(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return "not implemented by crishim yet"


class FakeStub:
    """Answers every lifecycle RPC, or raises UNIMPLEMENTED for all of them."""

    def __init__(self, implemented: bool) -> None:
        self.implemented = implemented
        self.calls: list[str] = []

    def __getattr__(self, rpc: str) -> Any:
        def call(req: Any, timeout: float | None = None) -> Any:
            self.calls.append(rpc)
            if not self.implemented:
                raise Unimplemented()
            if rpc == "RunPodSandbox":
                return pb.RunPodSandboxResponse(pod_sandbox_id="pod1")
            if rpc == "CreateContainer":
                return pb.CreateContainerResponse(container_id="ctr1")
            if rpc == "ContainerStatus":
                return pb.ContainerStatusResponse()  # no verbose pid: nothing to wait for
            return None

        return call


class FakeRuntime:
    def __init__(self, name: str, implemented: bool) -> None:
        self.name = name
        self.rt = FakeStub(implemented)
        self.img = self.rt
        self.log_dir = tempfile.mkdtemp(prefix="bench-unit-")


def test_unimplemented_side_is_reported_and_other_side_fills() -> None:
    crishim = scenarios.Side(FakeRuntime("crishim", implemented=False))  # type: ignore[arg-type]
    containerd = scenarios.Side(FakeRuntime("containerd", implemented=True))  # type: ignore[arg-type]
    res = Results()
    scenarios.lifecycle([crishim, containerd], None, BenchImages("h", busybox="h/bb"), n=3,
                        warmup=0, res=res, log=lambda _m: None)
    row = res.row("pod ready p50 (Run+Create+Start)")
    assert row is not None
    assert row.values["crishim"] is None
    assert row.notes["crishim"] == "unsupported (UNIMPLEMENTED RunPodSandbox)"
    assert row.values["containerd"] is not None
    # The unsupported side is asked once, not on every iteration.
    assert crishim.runtime.rt.calls == ["RunPodSandbox"]  # type: ignore[union-attr]
    assert containerd.runtime.rt.calls.count("RemovePodSandbox") == 3  # type: ignore[union-attr]
    assert "unsupported (UNIMPLEMENTED RunPodSandbox)" in render_markdown(res)
