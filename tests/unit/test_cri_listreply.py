"""ListContainers / ListPodSandbox replies are serialized once per change, and a reply
after a change shows it: served by a real gRPC server, read by a real client."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from types import SimpleNamespace

import grpc
import pytest
from google.protobuf.message import DecodeError

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc as pbg
from crishim.config import Config
from crishim.container.manager import ContainerManager
from crishim.container.registry import ContainerRegistry
from crishim.cri.handlers import add_service, rpc_methods
from crishim.cri.listreply import MAX_KEPT, ListReplyCache
from crishim.cri.runtime import RuntimeService
from crishim.host.facts import HostFacts
from crishim.observe.events import EventBus
from crishim.oci.resources import ResourceMapper
from crishim.rpc.server import Server
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.container import CREATED, EXITED, RUNNING, Container
from crishim.store.db import Database
from crishim.store.sandbox import NOTREADY, READY, Sandbox
from tests.fakes.managers import container_manager, stores


def _ctr(cid: str, pod: str, created: int) -> Container:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c-" + cid),
                             image=pb.ImageSpec(image="busybox"), labels={"pod": pod})
    return Container(id=cid, pod_id=pod, name="n-" + cid, config=cfg, runtime_handler="runc",
                     created_at=created, image_name="busybox", image_id="sha256:aa",
                     image_ref="sha256:aa", bundle="/b", rootfs="/b/rootfs", persist_dir="/p",
                     state=CREATED)


def _pod(sid: str, created: int) -> Sandbox:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=sid, uid=sid),
                              labels={"app": sid})
    return Sandbox(id=sid, name=sid, config=cfg, runtime_handler="runc", created_at=created,
                   state=READY)


class Node(SimpleNamespace):
    pods: SandboxRegistry
    mgr: ContainerManager
    rt: pbg.RuntimeServiceStub
    servicer: RuntimeService
    channel: grpc.aio.Channel


@pytest.fixture(params=["native", "grpcio"])
async def node(tmp_path: object, request: pytest.FixtureRequest) -> AsyncIterator[Node]:
    """Served by crishim's own server (lists and statuses answered where their request
    is read) and by grpcio's (through their handlers)."""
    cfg, db = Config(root="/nonexistent", state="/nonexistent"), Database(":memory:")
    pods = SandboxRegistry()
    mgr = container_manager(cfg, db, store=stores(cfg, db, pods))
    sandboxes = SimpleNamespace(list_sandboxes=pods.list, list_version=pods.list_version,
                                find=pods.find, get=pods.get,
                                statuses_of_containers=mgr.pod_statuses)
    # What the list and status RPCs use of the daemon: its container and sandbox managers
    # and event bus (PodSandboxStatus asks whether anyone subscribes); the host facts,
    # resource mapper and runtimes are what the service logs once as it is made.
    daemon = SimpleNamespace(containers=mgr, events=EventBus(), sandboxes=sandboxes,
                             host=HostFacts(), resources=ResourceMapper(),
                             runtimes=RuntimeRegistry(cfg))
    servicer = RuntimeService(daemon)  # type: ignore[arg-type]
    sock = os.path.join(str(tmp_path), "cri.sock")
    server: grpc.aio.Server | Server
    if request.param == "native":
        async def not_answered(*args: object) -> None:
            raise AssertionError("a list was not answered where it was read")

        methods = rpc_methods("RuntimeService", servicer)
        for name in ("ListContainers", "ListPodSandbox"):
            path = "/runtime.v1.RuntimeService/" + name
            methods[path] = methods[path]._replace(handler=not_answered)
        server = Server(methods, 4 << 20)
        await server.start(sock)
    else:
        server = grpc.aio.server()
        add_service(server, "RuntimeService", servicer)
        server.add_insecure_port("unix:" + sock)
        await server.start()
    channel = grpc.aio.insecure_channel("unix:" + sock)
    try:
        yield Node(pods=pods, mgr=mgr, rt=pbg.RuntimeServiceStub(channel), servicer=servicer,
                   channel=channel)
    finally:
        await channel.close()
        await server.stop(1)


async def _containers(n: Node, **flt: object) -> list[tuple[str, int]]:
    req = pb.ListContainersRequest(filter=pb.ContainerFilter(**flt)) if flt else \
        pb.ListContainersRequest()  # type: ignore[arg-type]
    reply = await n.rt.ListContainers(req)
    return [(c.id, c.state) for c in reply.containers]


async def _pods(n: Node, **flt: object) -> list[tuple[str, int]]:
    req = pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(**flt)) if flt else \
        pb.ListPodSandboxRequest()  # type: ignore[arg-type]
    reply = await n.rt.ListPodSandbox(req)
    return [(s.id, s.state) for s in reply.items]


async def test_container_list_follows_adds_states_and_drops(node: Node) -> None:
    a, b = _ctr("aa", "p1", 1), _ctr("bb", "p2", 2)
    node.mgr.records.add(a)
    assert await _containers(node) == [("aa", CREATED)]
    node.mgr.records.add(b)
    assert await _containers(node) == [("aa", CREATED), ("bb", CREATED)]
    a.state = RUNNING  # as StartContainer sets it: no call tells the registry
    assert await _containers(node) == [("aa", RUNNING), ("bb", CREATED)]
    running = pb.ContainerStateValue(state=RUNNING)
    assert await _containers(node, state=running) == [("aa", RUNNING)]
    a.state = EXITED
    assert await _containers(node, state=running) == []
    assert await _containers(node, state=pb.ContainerStateValue(state=EXITED)) == \
        [("aa", EXITED)]
    assert await _containers(node, pod_sandbox_id="p2") == [("bb", CREATED)]
    node.mgr.records.drop(a)
    assert await _containers(node) == [("bb", CREATED)]
    node.mgr.records.clear()
    assert await _containers(node) == []


async def test_pod_list_follows_adds_states_and_drops(node: Node) -> None:
    p1, p2 = _pod("p1", 1), _pod("p2", 2)
    node.pods.add(p1)
    node.pods.add(p2)
    assert await _pods(node) == [("p1", READY), ("p2", READY)]
    p1.state = NOTREADY  # as StopPodSandbox sets it
    assert await _pods(node) == [("p1", NOTREADY), ("p2", READY)]
    ready = pb.PodSandboxStateValue(state=READY)
    assert await _pods(node, state=ready) == [("p2", READY)]
    assert await _pods(node, label_selector={"app": "p1"}) == [("p1", NOTREADY)]
    node.pods.drop(p2)
    assert await _pods(node) == [("p1", NOTREADY)]
    assert await _pods(node, state=ready) == []


def test_a_reply_is_kept_per_request_until_the_version_moves() -> None:
    cache = ListReplyCache()
    state = pb.PodSandboxFilter(state=pb.PodSandboxStateValue(state=READY))
    everything, ready = b"", pb.ListPodSandboxRequest(filter=state).SerializeToString()
    assert cache.get(everything, 1) is None
    cache.keep(everything, 1, b"all")
    cache.keep(ready, 1, b"ready")
    assert cache.get(everything, 1) == b"all" and cache.get(ready, 1) == b"ready"
    assert cache.get(everything, 2) is None  # a pod changed: joined again
    for n in range(MAX_KEPT):  # many kinds of request: the cache stays small
        cache.keep(b"%d" % n, 1, b"")
    assert len(cache._replies) <= MAX_KEPT


def test_list_version_moves_on_state_assignments_only() -> None:
    pods, ctrs = SandboxRegistry(), ContainerRegistry()
    p, c = _pod("p1", 1), _ctr("aa", "p1", 1)
    pods.add(p)
    ctrs.add(c)
    pv, cv = pods.list_version(), ctrs.list_version()
    p.ips, c.pid = ["10.0.0.2"], 42  # nothing a list shows
    assert (pods.list_version(), ctrs.list_version()) == (pv, cv)
    c.state = RUNNING
    assert ctrs.list_version() != cv and pods.list_version() == pv
    p.state = NOTREADY
    assert pods.list_version() != pv


async def test_a_pods_containers_by_full_id_or_prefix(node: Node) -> None:
    a, b, c = _ctr("aa", "pod-1", 1), _ctr("bb", "pod-2", 2), _ctr("cc", "pod-1", 3)
    for rec in (a, b, c):
        node.mgr.records.add(rec)
    assert [r.id for r in node.mgr.records.for_pod("pod-1")] == ["aa", "cc"]
    assert await _containers(node, pod_sandbox_id="pod-1") == [("aa", CREATED), ("cc", CREATED)]
    assert [i for i, _ in await _containers(node, pod_sandbox_id="pod-")] == ["aa", "bb", "cc"]
    node.mgr.records.drop(a)
    assert await _containers(node, pod_sandbox_id="pod-1") == [("cc", CREATED)]
    node.mgr.records.drop(c)
    assert node.mgr.records.for_pod("pod-1") == []
    assert await _containers(node, pod_sandbox_id="pod-1") == []


async def test_bad_requests_are_refused_however_they_are_answered(node: Node) -> None:
    """An answer must not reply to bytes that are not its request: it fails, and the
    handler then reports the error as it would without the answer."""
    answers = node.servicer.answers()
    assert answers, "no answer to check"
    for name, answer in answers.items():
        with pytest.raises(DecodeError):
            answer(b"\xff\xff\xff\xff")
        call = node.channel.unary_unary(f"/runtime.v1.RuntimeService/{name}")
        with pytest.raises(grpc.RpcError) as err:
            await call(b"\xff\xff\xff\xff")
        assert err.value.code() != grpc.StatusCode.OK


async def test_statuses_answered_from_memory_match_the_handlers(node: Node) -> None:
    node.pods.add(_pod("p1", 1))
    node.mgr.records.add(_ctr("aa", "p1", 2))
    st = await node.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id="p1"))
    assert (st.status.id, st.status.state) == ("p1", READY) and not st.info
    # No GetContainerEvents subscriber (no evented PLEG): no container statuses, and
    # timestamp 0 tells an evented kubelet to ask for them itself.
    assert not st.containers_statuses and st.timestamp == 0
    events = node.servicer.daemon.events.subscribe()
    try:
        st = await node.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id="p1"))
        assert [c.id for c in st.containers_statuses] == ["aa"] and st.timestamp > 0
    finally:
        node.servicer.daemon.events.unsubscribe(events)
    cs = await node.rt.ContainerStatus(pb.ContainerStatusRequest(container_id="a"))  # prefix
    assert (cs.status.id, cs.status.state) == ("aa", CREATED) and not cs.info
    raw = pb.ContainerStatusRequest(container_id="aa").SerializeToString()
    assert pb.ContainerStatusResponse.FromString(
        node.servicer.answer_container_status(raw) or b"") == cs
    # Left to the handlers: verbose requests (they read the bundle) and unknown ids.
    for answer, request in (
            (node.servicer.answer_container_status,
             pb.ContainerStatusRequest(container_id="aa", verbose=True)),
            (node.servicer.answer_pod_sandbox_status,
             pb.PodSandboxStatusRequest(pod_sandbox_id="p1", verbose=True)),
            (node.servicer.answer_pod_sandbox_status,
             pb.PodSandboxStatusRequest(pod_sandbox_id="nope"))):
        assert answer(request.SerializeToString()) is None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node.rt.ContainerStatus(pb.ContainerStatusRequest(container_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    verbose = await node.rt.ContainerStatus(
        pb.ContainerStatusRequest(container_id="aa", verbose=True))
    assert verbose.status == cs.status and "info" in verbose.info
