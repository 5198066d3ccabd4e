"""crishim/observe/tracing.py: off costs nothing and loads nothing; on, a call's W3C
trace context is its span's parent and its sampling decision is followed, spans nest
across awaits and threads, errors are recorded, log lines carry the ids, and both OTLP
transports deliver."""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import threading
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crishim import log
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import TracingConfig
from crishim.cri.base import ServicerBase
from crishim.errors import NotFound
from crishim.observe import tracing
from tests.fakes.otlp import Receiver

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


def traceparent(sampled: bool, trace: str = TRACE) -> str:
    return f"00-{trace}-{PARENT}-{'01' if sampled else '00'}"


def finished(exporter: InMemorySpanExporter) -> list[Any]:
    assert tracing.flush()
    return list(exporter.get_finished_spans())


def test_off_hands_out_one_no_op_and_reads_nothing() -> None:
    assert not tracing.enabled()
    assert tracing.span("x", a=1) is tracing.NOOP

    def never(*_: Any) -> Any:
        raise AssertionError("read while tracing is off")

    scope = tracing.server_span("svc/M", None, never, None)  # type: ignore[arg-type]
    assert scope is tracing.NOOP and not scope.recording
    with scope as s:
        s.set(a=1)
        s.fail("no")


def test_off_the_sdk_is_not_even_imported() -> None:
    code = ("import sys, asyncio; from crishim import server; "
            "from crishim.config import TracingConfig; from crishim.observe import tracing; "
            "tracing.setup(TracingConfig());\n"
            "with tracing.span('x'): pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_a_sampled_caller_is_the_parent(spans: InMemorySpanExporter) -> None:
    meta = [("traceparent", traceparent(True)), ("tracestate", "k=v"), ("other", "x")]
    with tracing.server_span("svc/M", _Context(meta), lambda r: {"cri.pod_sandbox_id": r},
                             "p1") as scope:
        assert scope.recording
        with tracing.span("child", n=1):
            pass
    child, call = finished(spans)
    assert f"{call.context.trace_id:032x}" == TRACE
    assert f"{call.parent.span_id:016x}" == PARENT and call.parent.is_remote
    assert call.attributes["cri.pod_sandbox_id"] == "p1"
    assert call.context.trace_state.get("k") == "v"
    assert child.parent.span_id == call.context.span_id


def test_an_unsampled_caller_is_followed_even_at_every_trace(
        spans: InMemorySpanExporter) -> None:
    meta = [("traceparent", traceparent(False))]
    with tracing.server_span("svc/M", _Context(meta), lambda r: {}, None), \
            tracing.span("child"):
        pass
    assert finished(spans) == []


def test_roots_are_sampled_at_the_configured_rate() -> None:
    exporter = InMemorySpanExporter()
    # One per million: a few hundred root traces, all but certainly none kept; the
    # caller's sampled context is kept all the same.
    tracing.setup(TracingConfig(sampling_rate_per_million=1), exporter)
    try:
        for _ in range(300):
            with tracing.server_span("svc/M", _Context([]), lambda r: {}, None):
                pass
        assert finished(exporter) == []
        with tracing.server_span("svc/M", _Context([("traceparent", traceparent(True))]),
                                 lambda r: {}, None):
            pass
        assert [s.name for s in finished(exporter)] == ["svc/M"]
    finally:
        tracing.shutdown()


async def test_spans_nest_across_awaits_tasks_and_threads(
        spans: InMemorySpanExporter) -> None:
    def in_thread() -> None:
        with tracing.span("thread"):
            pass

    async def step(name: str) -> None:
        with tracing.span(name):
            await asyncio.sleep(0)
            await asyncio.to_thread(in_thread)

    with tracing.span("root"):
        await asyncio.gather(step("a"), step("b"))
    by_name: dict[str, list[Any]] = {}
    for s in finished(spans):
        by_name.setdefault(s.name, []).append(s)
    root = by_name["root"][0]
    assert {s.parent.span_id for s in by_name["a"] + by_name["b"]} == {root.context.span_id}
    steps = {s.context.span_id for s in by_name["a"] + by_name["b"]}
    assert len(by_name["thread"]) == 2 and {s.parent.span_id for s in by_name["thread"]} == steps


def test_an_error_is_recorded_on_its_span(spans: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError), tracing.span("step"):
        raise ValueError("bad layer")
    (s,) = finished(spans)
    assert s.status.status_code.name == "ERROR" and "bad layer" in s.status.description
    assert [e.name for e in s.events] == ["exception"]


class _Context:
    def __init__(self, meta: list[tuple[str, str]]) -> None:
        self.meta = meta
        self.code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.meta

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code = code
        raise grpc.aio.AbortError()


class _Runtime(ServicerBase):
    SERVICE = "RuntimeService"

    async def RunPodSandbox(self, request: pb.RunPodSandboxRequest,
                            context: Any) -> pb.RunPodSandboxResponse:
        if request.config.metadata.name == "missing":
            raise NotFound("image not found")
        with tracing.span("cni ADD bridge"):
            pass
        return pb.RunPodSandboxResponse(pod_sandbox_id="pod123")


def _run_request(name: str) -> pb.RunPodSandboxRequest:
    return pb.RunPodSandboxRequest(runtime_handler="runc", config=pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="ns")))


async def test_every_cri_call_is_a_span_with_its_objects_and_status(
        spans: InMemorySpanExporter) -> None:
    svc = _Runtime()
    await svc.RunPodSandbox(_run_request("web"),  # type: ignore[call-arg]
                            _Context([("traceparent", traceparent(True))]))
    ctx = _Context([("traceparent", traceparent(True))])
    with pytest.raises(grpc.aio.AbortError):
        await svc.RunPodSandbox(_run_request("missing"), ctx)  # type: ignore[call-arg]
    assert ctx.code == grpc.StatusCode.NOT_FOUND
    cni, ok, failed = finished(spans)
    assert ok.name == failed.name == "runtime.v1.RuntimeService/RunPodSandbox"
    assert cni.parent.span_id == ok.context.span_id
    assert f"{ok.parent.span_id:016x}" == PARENT
    assert dict(ok.attributes) == {"cri.runtime_handler": "runc", "cri.name": "web",
                                   "cri.namespace": "ns", "cri.pod_sandbox_id": "pod123",
                                   "rpc.grpc.status_code": 0}
    assert ok.status.status_code.name == "UNSET"
    assert failed.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert failed.status.status_code.name == "ERROR"
    assert failed.status.description == "image not found"


def test_log_lines_carry_the_active_span(spans: InMemorySpanExporter) -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(log._KVFormatter())
    logger = logging.getLogger("crishim.test_tracing")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        lg = log.get_logger("crishim.test_tracing")
        lg.info("outside")
        with tracing.server_span("svc/M", _Context([("traceparent", traceparent(True))]),
                                 lambda r: {}, None):
            lg.info("inside")
    finally:
        logger.removeHandler(handler)
    outside, inside = buf.getvalue().splitlines()
    (call,) = finished(spans)
    assert "trace_id" not in outside
    assert inside.endswith(f"trace_id={TRACE} span_id={call.context.span_id:016x}")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_reach_an_otlp_receiver(protocol: str) -> None:
    with Receiver() as rx:
        endpoint = rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint
        tracing.setup(TracingConfig(endpoint=endpoint, protocol=protocol,
                                    sampling_rate_per_million=1_000_000,
                                    service_name="node-a"))
        try:
            with tracing.span("root"), tracing.span("child", layer="sha256:x"):
                pass
            assert tracing.flush()
        finally:
            tracing.shutdown()
        got = rx.wait(lambda s: len(s) == 2, timeout=30)
        assert rx.requests["grpc" if protocol == "grpc" else "http"] >= 1
    child, root = sorted(got, key=lambda s: s.name)
    assert child.parent_id == root.span_id and child.trace_id == root.trace_id
    assert child.attributes == {"layer": "sha256:x"} and root.service == "node-a"


async def test_a_callback_registered_untraced_is_no_part_of_the_call(
        spans: InMemorySpanExporter) -> None:
    done = asyncio.Event()

    def later() -> None:
        with tracing.span("exit"):
            done.set()

    with tracing.span("call"):
        tracing.untraced(asyncio.get_running_loop().call_soon, later)
    await done.wait()
    exit_span = next(s for s in finished(spans) if s.name == "exit")
    assert exit_span.parent is None


def test_the_queue_holds_max_queue_size_spans_and_drops_the_rest() -> None:
    """`[tracing] max_queue_size`: while the exporter is busy, spans beyond it are
    dropped, not queued without bound."""
    gate = threading.Event()

    class Slow(InMemorySpanExporter):
        def export(self, spans: Any) -> Any:
            gate.wait(10)
            return super().export(spans)

    exporter = Slow()
    tracing.setup(TracingConfig(sampling_rate_per_million=1_000_000, max_queue_size=3),
                  exporter)
    try:
        for i in range(20):
            with tracing.span(f"s{i}"):
                pass
        gate.set()
        got = finished(exporter)
    finally:
        tracing.shutdown()
    # At most one batch of 3 taken by the exporter and 3 queued behind it.
    assert 3 <= len(got) <= 6
