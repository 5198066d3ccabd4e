"""Tracing through the real daemon: a pod start under a client's W3C trace context
(as a kubelet with KubeletTracing sends it) arrives at an OTLP receiver as crishim's
spans under the client's, down to the CNI plugins, the OCI runtime and the pull's
layers, and an Exec's streaming session under its call; on crishim's own gRPC server and
on grpcio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.streaming.client import exec_spdy
from tests.e2e.cni import module_network
from tests.e2e.daemon import Daemon, running_daemon
from tests.e2e.faults import networked_daemon
from tests.e2e.nriplugins import NRI_BIN
from tests.fakes.otlp import Receiver, Span, tree

pytestmark = pytest.mark.e2e

RPC = "runtime.v1.RuntimeService/"
IMG = "runtime.v1.ImageService/"


def tracing_config(rx: Receiver, extra: str = "") -> str:
    return (f'{extra}[tracing]\nendpoint = "{rx.grpc_endpoint}"\n'
            "sampling_rate_per_million = 1000000\n")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as rx:
        yield rx


class Caller:
    """A client in one trace: each call from a span of its own, as a kubelet's are."""

    def __init__(self) -> None:
        self.trace = os.urandom(16).hex()
        self.parents: dict[str, str] = {}

    def meta(self, call: str) -> list[tuple[str, str]]:
        parent = os.urandom(8).hex()
        self.parents[call] = parent
        return [("traceparent", f"00-{self.trace}-{parent}-01"), ("tracestate", "e2e=1")]


def spans_of(rx: Receiver, trace: str, names: set[str]) -> list[Span]:
    """The trace's spans, once every name in `names` has come."""
    return [s for s in rx.wait(lambda got: names <= {s.name for s in got
                                                      if s.trace_id == trace})
            if s.trace_id == trace]


def children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_id == parent.span_id]


def below(spans: list[Span], top: Span) -> list[Span]:
    out, todo = [], [top]
    while todo:
        for c in children(spans, todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def nri_plugins(d: Daemon) -> list[str]:
    info = json.loads(d.runtime().Status(pb.StatusRequest(verbose=True),
                                         timeout=10).info["nri"])
    return [p["name"] for p in info["plugins"]]


def test_a_pod_start_is_traced_under_the_caller(receiver: Receiver, busybox_ref: str) -> None:
    if not os.path.isdir(NRI_BIN):
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the NRI plugins, but {NRI_BIN} is missing")
        pytest.skip(f"NRI plugins not found at {NRI_BIN} (shared/bin beside the repository)")
    # A pre-installed plugin that subscribes to every event.
    plugins = tempfile.mkdtemp(prefix="crishim-trace-nri-")
    os.makedirs(os.path.join(plugins, "conf.d"))
    os.symlink(os.path.join(NRI_BIN, "nri-template"), os.path.join(plugins, "05-template"))
    nri = ('[nri]\nsocket_path = "{tmpdir}/nri/nri.sock"\n'
           f'plugin_path = "{plugins}"\nplugin_config_path = "{plugins}/conf.d"\n')
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, plugins, ignore_errors=True)
        nd = stack.enter_context(networked_daemon("crishim-trace", *module_network("tracing"),
                                                  tracing_config(receiver, nri)))
        d, c = nd.d, Caller()
        deadline = time.monotonic() + 30
        while not nri_plugins(d):
            assert time.monotonic() < deadline, "the NRI plugin did not register"
            time.sleep(0.1)
        rt, images = d.runtime(), d.images()
        images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=busybox_ref)),
                         timeout=120, metadata=c.meta("PullImage"))
        pod_cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="traced", namespace="e2e", uid="uid-traced"),
            log_directory=os.path.join(nd.tmpdir, "logs"),
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption())))
        pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_cfg), timeout=60,
                                  metadata=c.meta("RunPodSandbox")).pod_sandbox_id
        cid = rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, sandbox_config=pod_cfg, config=pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image=busybox_ref),
                command=["sleep", "60"], log_path="app.log")),
            timeout=60, metadata=c.meta("CreateContainer")).container_id
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30,
                          metadata=c.meta("StartContainer"))
        assert rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["true"], timeout=10),
                           timeout=20, metadata=c.meta("ExecSync")).exit_code == 0
        # A streaming session continues the trace of the Exec call that gave its URL.
        url = rt.Exec(pb.ExecRequest(container_id=cid, cmd=["echo", "hi"], stdout=True),
                      timeout=10, metadata=c.meta("Exec")).url
        assert asyncio.run(asyncio.wait_for(exec_spdy(url), 30)).stdout == b"hi\n"
        # A read the native server answers from memory is a span too when traced.
        rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10,
                          metadata=c.meta("ListPodSandbox"))
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60,
                          metadata=c.meta("StopPodSandbox"))
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60,
                            metadata=c.meta("RemovePodSandbox"))
        calls = {IMG + "PullImage"} | {RPC + n for n in (
            "RunPodSandbox", "CreateContainer", "StartContainer", "ExecSync", "Exec",
            "ListPodSandbox", "StopPodSandbox", "RemovePodSandbox")}
        spans = spans_of(receiver, c.trace, calls | {"streaming exec"})
        logs = d.logs()

    rpc = {s.name.rsplit("/", 1)[1]: s for s in spans if s.name in calls}
    print("\n" + "\n".join(tree(spans, rpc[n.rsplit("/", 1)[1]]) for n in sorted(calls)))
    for name, span in rpc.items():
        # Each call's span is the child of the client span that made it.
        assert span.parent_id == c.parents[name], name
        assert span.service == "crishim" and span.attributes["rpc.grpc.status_code"] == 0
    assert rpc["RunPodSandbox"].attributes["cri.pod_sandbox_id"] == pod_id
    assert rpc["RunPodSandbox"].attributes["cri.name"] == "traced"
    assert rpc["CreateContainer"].attributes["cri.container_id"] == cid
    assert rpc["CreateContainer"].attributes["cri.image"] == busybox_ref
    assert rpc["CreateContainer"].attributes["cri.pod_name"] == "traced"
    assert rpc["PullImage"].attributes["cri.image"] == busybox_ref

    def names(top: str) -> list[str]:
        return [s.name for s in below(spans, rpc[top])]

    # The pull: resolve, manifest, each layer's fetch and unpack, the record.
    pull = names("PullImage")
    for step in ("image pull", "image resolve", "image manifest", "image layer",
                 "image layer fetch", "image layer unpack", "image layer commit",
                 "image record", "db put"):
        assert step in pull, (step, pull)
    # Each CNI plugin of the chain (IPAM runs inside bridge), the pause container's OCI
    # runtime steps, the pod's record.
    run = names("RunPodSandbox")
    assert {"cni ADD bridge", "cni ADD portmap", "runc create", "runc start",
            "db put"} <= set(run), run
    # The container's monitor and runtime (conmon runs `runc create`).
    create, start = names("CreateContainer"), names("StartContainer")
    assert "conmon runc create" in create + start and "runc start" in start, (create, start)
    assert "db put" in create
    # A container's exit is handled outside the call that started it.
    assert not [n for n in names("StartContainer") if "Stop" in n]
    # Each NRI plugin call, by event and plugin.
    assert any(n.startswith("nri RunPodSandbox ") for n in run), run
    assert any(n.startswith("nri CreateContainer ") for n in create), create
    assert any(n.endswith(" exec") for n in names("ExecSync"))
    # The call hands out a URL; the session, and the process it runs, come after it.
    (session,) = children(spans, rpc["Exec"])
    assert session.name == "streaming exec" and session.attributes["cri.container_id"] == cid
    assert [s.name for s in children(spans, session)] == ["runc exec"]
    stop = names("StopPodSandbox")
    assert "cni DEL bridge" in stop and any(n.endswith(" kill") for n in stop), stop
    assert any(n.endswith(" delete") for n in names("RemovePodSandbox"))
    # The daemon's log lines made inside a call name its trace and span.
    span_ids = {s.span_id for s in spans}
    logged = re.findall(rf"trace_id={c.trace} span_id=([0-9a-f]{{16}})", logs)
    assert logged and set(logged) <= span_ids


def test_grpcio_server_continues_the_callers_trace(receiver: Receiver,
                                                   busybox_ref: str) -> None:
    with running_daemon(tracing_config(receiver, 'grpc_server = "grpcio"\n')) as d:
        c = Caller()
        d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=busybox_ref)),
                             timeout=120, metadata=c.meta("PullImage"))
        # An unsampled caller is followed: nothing of its trace is recorded.
        quiet = os.urandom(16).hex()
        d.images().ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=busybox_ref)),
                               metadata=[("traceparent", f"00-{quiet}-{'1' * 16}-00")])
        spans = spans_of(receiver, c.trace, {IMG + "PullImage", "image layer fetch"})
        d.stop()  # sends what is left
    (pull,) = [s for s in spans if s.name == IMG + "PullImage"]
    assert pull.parent_id == c.parents["PullImage"]
    assert "image layer fetch" in [s.name for s in below(spans, pull)]
    assert not [s for s in receiver.spans if s.trace_id == quiet]


def test_daemon_start_recovery_is_a_trace(receiver: Receiver) -> None:
    with running_daemon(tracing_config(receiver, 'grpc_server = "native"\n')) as d:
        d.stop()
        d.start()
    spans = receiver.wait(lambda got: sum(s.name == "crishim start" for s in got) >= 2)
    starts = [s for s in spans if s.name == "crishim start"]
    for start in starts:
        assert start.parent_id == ""
        assert {"recover sandboxes", "recover containers", "recover images"} <= {
            s.name for s in children(spans, start)}
