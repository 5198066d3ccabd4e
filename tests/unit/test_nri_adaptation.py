"""The runtime side of NRI (crishim/nri/adaptation.py, plugin.py) against plugins played
in-process through a real unix socket (the plugin side built from crishim's own ttRPC and
mux); the real Go plugins run in tests/e2e/test_nri.py."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from google.protobuf.message import Message

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection
from crishim.config import NRIConfig
from crishim.errors import FailedPrecondition
from crishim.nri import discovery, mux, ttrpc
from crishim.nri.adaptation import NRI
from crishim.oci.resources import ResourceMapper
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"


def bit(*events: int) -> int:
    return sum(1 << (e - 1) for e in events)


class Host:
    def __init__(self) -> None:
        self.updated: list[str] = []
        self.evicted: list[tuple[str, str]] = []
        self.fail: set[str] = set()
        # `<runtime> features` output (b"": assume everything) and how often it was asked.
        self.features = b""
        self.feature_probes = 0
        # The CRI form of each update carried out, by container.
        self.resources: dict[str, pb.LinuxContainerResources] = {}

    def pods(self) -> list[Sandbox]:
        return [pod("p1")]

    def containers(self) -> list[Container]:
        return []

    def pod_of(self, ctr: Container) -> Sandbox | None:
        return None

    @property
    def resource_mapper(self) -> ResourceMapper:
        return ResourceMapper()

    async def resolve_cdi(self, names: Sequence[str]) -> list[Injection]:
        return []

    async def runtime_features(self, ctr: Container) -> bytes:
        self.feature_probes += 1
        return self.features

    async def update_container(self, cid: str, resources: pb.LinuxContainerResources) -> None:
        if cid in self.fail:
            raise FailedPrecondition(f"container {cid} is gone")
        self.updated.append(cid)
        self.resources[cid] = resources

    async def evict_container(self, cid: str, reason: str) -> None:
        self.evicted.append((cid, reason))


def pod(pid: str) -> Sandbox:
    return Sandbox(id=pid, name=f"{pid}_ns_uid_0", runtime_handler="runc", created_at=0,
                   config=pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
                       name=pid, namespace="ns", uid="uid")))


Handler = Callable[[Message], Awaitable[Message]]


class FakePlugin:
    """The plugin's end: serves Plugin, calls Runtime."""

    def __init__(self, name: str, idx: str, events: int,
                 handlers: dict[str, tuple[type[Message], Handler]] | None = None) -> None:
        self.name, self.idx, self.events = name, idx, events
        self.calls: list[str] = []
        self.configured = asyncio.Event()
        self.config = ""
        self.synced: list[nri.SynchronizeRequest] = []
        self.handlers = handlers or {}
        self.client: ttrpc.Client | None = None
        self.tasks: list[asyncio.Task[Any]] = []

    async def connect(self, sock: str, register: bool = True) -> None:
        r, w = await asyncio.open_unix_connection(sock)
        self.writer = w
        m = mux.Mux(r, w)
        pconn, rconn = m.open(mux.PLUGIN_SERVICE_CONN), m.open(mux.RUNTIME_SERVICE_CONN)

        async def configure(msg: Message) -> Message:
            assert isinstance(msg, nri.ConfigureRequest)
            self.config = msg.config
            self.configured.set()
            return nri.ConfigureResponse(events=self.events)

        async def synchronize(msg: Message) -> Message:
            assert isinstance(msg, nri.SynchronizeRequest)
            self.synced.append(msg)
            return nri.SynchronizeResponse()

        def recorded(method: str, h: Handler) -> Handler:
            async def call(msg: Message) -> Message:
                self.calls.append(method)
                return await h(msg)
            return call

        methods = {"Configure": ttrpc.Method(nri.ConfigureRequest, configure),
                   "Synchronize": ttrpc.Method(nri.SynchronizeRequest, synchronize)}
        for method, (req, h) in self.handlers.items():
            methods[method] = ttrpc.Method(req, recorded(method, h))
        server = ttrpc.Server({PLUGIN: methods})
        self.client = ttrpc.Client(rconn, rconn.write)
        self.tasks = [asyncio.create_task(c) for c in
                      (m.run(), server.serve(pconn, pconn.write), self.client.run())]
        if register:
            await self.client.call(RUNTIME, "RegisterPlugin", nri.RegisterPluginRequest(
                plugin_name=self.name, plugin_idx=self.idx), nri.Empty, 5)

    def close(self) -> None:
        self.writer.close()
        for t in self.tasks:
            t.cancel()


def reply(msg: Message) -> Handler:
    async def h(_: Message) -> Message:
        return msg
    return h


async def hang(_: Message) -> Message:
    await asyncio.sleep(3600)
    return nri.Empty()


async def refuse(_: Message) -> Message:
    raise ttrpc.TTRPCError(ttrpc.UNKNOWN, "not on my node")


# Long enough that a loaded machine never makes a well-behaved plugin late; the tests of
# what happens past them wait for the event, not for the time.
REGISTRATION_S = REQUEST_S = 1.0


@pytest.fixture
async def runtime(tmp_path: Any) -> AsyncIterator[tuple[NRI, Host, str]]:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "10-first.conf").write_text("indexed")
    (conf / "first.conf").write_text("plain")
    (conf / "second.conf").write_text("plain-second")
    cfg = NRIConfig(socket_path=str(tmp_path / "nri" / "nri.sock"),
                    plugin_path=str(tmp_path / "plugins"), plugin_config_path=str(conf),
                    plugin_registration_timeout=REGISTRATION_S, plugin_request_timeout=REQUEST_S)
    host = Host()
    n = NRI(cfg, "crishim", "test", host)
    await n.start()
    try:
        yield n, host, cfg.socket_path
    finally:
        await n.stop()


async def until(cond: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_socket_is_root_only_and_inactive_without_plugins(
        runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    assert not n.active and n.describe() == []
    assert os.stat(sock).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(sock)).st_mode & 0o777 == 0o700


async def test_register_configure_synchronize(runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    first = FakePlugin("first", "10", bit(nri.RUN_POD_SANDBOX))
    second = FakePlugin("second", "05", 0)  # 0: every event
    await first.connect(sock)
    await second.connect(sock)
    await until(lambda: len(n.plugins()) == 2)
    # NN-name.conf first, then name.conf.
    assert (first.config, second.config) == ("indexed", "plain-second")
    assert [p.name for p in n.plugins()] == ["05-second", "10-first"]
    assert [p.id for p in first.synced[0].pods] == ["p1"]
    assert n.describe()[1]["events"] == ["RUN_POD_SANDBOX"]
    assert n.describe()[0]["events"][-1] == "VALIDATE_CONTAINER_ADJUSTMENT"
    first.close()
    second.close()
    await until(lambda: not n.active)


async def test_events_in_index_order_and_only_when_subscribed(
        runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    order: list[str] = []

    def note(name: str) -> Handler:
        async def h(_: Message) -> Message:
            order.append(name)
            return nri.RunPodSandboxResponse()
        return h

    late = FakePlugin("late", "50", bit(nri.RUN_POD_SANDBOX),
                      {"RunPodSandbox": (nri.RunPodSandboxRequest, note("late"))})
    early = FakePlugin("early", "20", bit(nri.RUN_POD_SANDBOX),
                       {"RunPodSandbox": (nri.RunPodSandboxRequest, note("early"))})
    deaf = FakePlugin("deaf", "30", bit(nri.STOP_POD_SANDBOX),
                      {"RunPodSandbox": (nri.RunPodSandboxRequest, note("deaf"))})
    for p in (late, early, deaf):
        await p.connect(sock)
    await until(lambda: len(n.plugins()) == 3)
    await n.run_pod_sandbox(pod("p2"))
    assert order == ["early", "late"]
    for p in (late, early, deaf):
        p.close()


async def test_hanging_plugin_dropped_within_request_timeout(
        runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    p = FakePlugin("sleepy", "10", bit(nri.RUN_POD_SANDBOX),
                   {"RunPodSandbox": (nri.RunPodSandboxRequest, hang)})
    await p.connect(sock)
    await until(lambda: n.active)
    t0 = time.monotonic()
    # Not failed: the plugin is dropped once the request timeout has passed.
    await asyncio.wait_for(n.run_pod_sandbox(pod("p2")), 30)
    assert time.monotonic() - t0 >= REQUEST_S
    assert not n.active
    p.close()


async def test_refusal_fails_run_naming_the_plugin(runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    p = FakePlugin("strict", "10", bit(nri.RUN_POD_SANDBOX, nri.STOP_POD_SANDBOX),
                   {"RunPodSandbox": (nri.RunPodSandboxRequest, refuse),
                    "StopPodSandbox": (nri.StopPodSandboxRequest, refuse)})
    await p.connect(sock)
    await until(lambda: n.active)
    with pytest.raises(FailedPrecondition, match=r"10-strict.*not on my node"):
        await n.run_pod_sandbox(pod("p2"))
    # Stop is only logged, as containerd's CRI plugin logs it; the plugin stays.
    await n.stop_pod_sandbox(pod("p2"))
    assert n.active
    p.close()


async def test_refused_start_fails(runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    p = FakePlugin("gate", "10", bit(nri.START_CONTAINER),
                   {"StartContainer": (nri.StartContainerRequest, refuse)})
    await p.connect(sock)
    await until(lambda: n.active)
    with pytest.raises(FailedPrecondition, match="10-gate failed StartContainer"):
        await n.start_container(pod("p2"), container("c2", "p2"))
    p.close()


async def test_bad_registrations_are_dropped(runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    bad = FakePlugin("bad name!", "10", 0)
    with pytest.raises(ttrpc.TTRPCError) as err:
        await bad.connect(sock)
    assert err.value.code == ttrpc.INVALID_ARGUMENT
    silent = FakePlugin("silent", "10", 0)
    await silent.connect(sock, register=False)
    # Closed once the registration timeout has passed.
    await until(lambda: silent.client is not None and silent.client.closed)
    assert not n.active
    bad.close()
    silent.close()


async def test_unsolicited_updates_return_the_failed_and_evictions_stop(
        runtime: tuple[NRI, Host, str]) -> None:
    n, host, sock = runtime
    host.fail.add("gone")
    p = FakePlugin("updater", "10", bit(nri.RUN_POD_SANDBOX))
    await p.connect(sock)
    await until(lambda: n.active)
    assert p.client is not None
    ups = [nri.ContainerUpdate(container_id="c1"), nri.ContainerUpdate(container_id="gone"),
           nri.ContainerUpdate(container_id="gone", ignore_failure=True)]
    rpl = await p.client.call(RUNTIME, "UpdateContainers",
                              nri.UpdateContainersRequest(update=ups, evict=[
                                  nri.ContainerEviction(container_id="c9", reason="OOM")]),
                              nri.UpdateContainersResponse, 2)
    assert host.updated == ["c1"]
    assert host.evicted == [("c9", "OOM")]
    assert [(u.container_id, u.ignore_failure) for u in rpl.failed] == [("gone", False)]
    p.close()


async def test_old_plugin_gets_state_change(runtime: tuple[NRI, Host, str]) -> None:
    """A plugin without the dedicated RPC (UNIMPLEMENTED) is sent StateChange."""
    n, _, sock = runtime
    seen: list[int] = []

    async def state(msg: Message) -> Message:
        assert isinstance(msg, nri.StateChangeEvent)
        seen.append(msg.event)
        return nri.Empty()

    p = FakePlugin("old", "10", bit(nri.REMOVE_POD_SANDBOX),
                   {"StateChange": (nri.StateChangeEvent, state)})
    await p.connect(sock)
    await until(lambda: n.active)
    await n.remove_pod_sandbox(pod("p2"))
    assert seen == [nri.REMOVE_POD_SANDBOX]
    p.close()


def test_discover_names(tmp_path: Any) -> None:
    for name, mode in (("10-good", 0o755), ("20-notexec", 0o644), ("05-first", 0o700)):
        f = tmp_path / name
        f.write_text("#!/bin/sh\n")
        f.chmod(mode)
    (tmp_path / "30-dir").mkdir()
    assert discovery.discover(str(tmp_path)) == [("05", "first"), ("10", "good")]
    assert discovery.discover(str(tmp_path / "missing")) == []
    bad = tmp_path / "plugin"
    bad.write_text("")
    bad.chmod(0o755)
    with pytest.raises(ValueError, match="NN-name expected"):
        discovery.discover(str(tmp_path))


def container(cid: str, pod_id: str) -> Container:
    return Container(id=cid, pod_id=pod_id, name=f"{cid}_x", runtime_handler="runc",
                     config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name=cid)),
                     created_at=0, image_name="img", image_id="sha256:1", image_ref="img",
                     bundle="/nonexistent", rootfs="/nonexistent", persist_dir="/nonexistent")


async def test_post_events_do_not_hold_the_call_but_keep_their_order(
        runtime: tuple[NRI, Host, str]) -> None:
    """PostStartContainer is not waited for by StartContainer's caller; the plugin still
    gets it before the StopContainer that follows."""
    n, _, sock = runtime
    order: list[str] = []
    release = asyncio.Event()

    def slow(name: str, rpl: Message) -> Handler:
        async def h(_: Message) -> Message:
            await release.wait()  # set once post_start_container has returned
            order.append(name)
            return rpl
        return h

    p = FakePlugin("slow", "10", bit(nri.POST_START_CONTAINER, nri.STOP_CONTAINER), {
        "PostStartContainer": (nri.PostStartContainerRequest,
                               slow("PostStart", nri.PostStartContainerResponse())),
        "StopContainer": (nri.StopContainerRequest,
                          slow("Stop", nri.StopContainerResponse()))})
    await p.connect(sock)
    await until(lambda: n.active)
    sb, ctr = pod("p3"), container("c3", "p3")
    # Held for the plugin's answer, it would come back only when the request timed out,
    # with the plugin dropped.
    await n.post_start_container(sb, ctr)
    assert order == [] and n.active
    release.set()
    await n.stop_container(sb, ctr)
    assert order == ["PostStart", "Stop"]
    p.close()


async def test_create_adjusts_the_spec_and_the_default_validator_checks_it(
        tmp_path: Any) -> None:
    """The plugins' adjustments reach the spec; with [nri.default_validator] on, a
    container that a required plugin did not see is refused, naming the plugin."""
    from crishim.config import DefaultValidatorConfig
    cfg = NRIConfig(socket_path=str(tmp_path / "nri.sock"), plugin_path=str(tmp_path / "p"),
                    plugin_config_path=str(tmp_path / "c"), plugin_request_timeout=1.0,
                    default_validator=DefaultValidatorConfig(enable=True))
    n = NRI(cfg, "crishim", "test", Host())
    await n.start()
    try:
        adj = nri.ContainerAdjustment(env=[nri.KeyValue(key="FROM_PLUGIN", value="1")])
        p = FakePlugin("adder", "10", bit(nri.CREATE_CONTAINER), {
            "CreateContainer": (nri.CreateContainerRequest,
                                reply(nri.CreateContainerResponse(adjust=adj)))})
        await p.connect(cfg.socket_path)
        await until(lambda: len(n.plugins()) == 1)
        spec: dict[str, Any] = {"process": {"env": ["PATH=/bin"]}, "linux": {}}
        await n.create_container(pod("p4"), container("c4", "p4"), spec)
        assert spec["process"]["env"] == ["PATH=/bin", "FROM_PLUGIN=1"]
        n.cfg.default_validator.required_plugins = ["needed"]
        with pytest.raises(FailedPrecondition, match="required plugin 'needed' not present"):
            await n.create_container(pod("p4"), container("c5", "p4"), {"linux": {}})
        p.close()
    finally:
        await n.stop()


# runc 1.1.5's `runc features`, abridged: runtime-spec 1.0.2, no netDevices/memoryPolicy.
RUNC_115 = json.dumps({"ociVersionMin": "1.0.0", "ociVersionMax": "1.0.2-dev",
                       "linux": {"namespaces": ["mount", "pid"],
                                 "intelRdt": {"enabled": True}}}).encode()


async def test_an_adjustment_the_runtime_would_ignore_is_refused(
        runtime: tuple[NRI, Host, str]) -> None:
    """On runc 1.1 (its `features`, asked once per handler), a plugin's scheduling
    policy fails CreateContainer instead of being dropped by runc; what runc applies
    still goes through."""
    n, host, sock = runtime
    host.features = RUNC_115
    adjustments = [
        nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            scheduler=nri.LinuxScheduler(policy=nri.SCHED_BATCH))),
        nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
            io_priority=nri.LinuxIOPriority(priority=4, **{"class": nri.IOPRIO_CLASS_BE}))),
        nri.ContainerAdjustment(env=[nri.KeyValue(key="OK", value="1")])]

    async def create(msg: Message) -> Message:
        return nri.CreateContainerResponse(adjust=adjustments.pop(0))

    p = FakePlugin("sched", "10", bit(nri.CREATE_CONTAINER),
                   {"CreateContainer": (nri.CreateContainerRequest, create)})
    await p.connect(sock)
    await until(lambda: n.active)
    for cid, what in (("c6", "a scheduling policy"), ("c7", "an I/O priority")):
        with pytest.raises(FailedPrecondition, match=f"set {what}, which this node's OCI "
                           "runtime does not apply"):
            await n.create_container(pod("p6"), container(cid, "p6"),
                                     {"process": {}, "linux": {}})
    spec: dict[str, Any] = {"process": {"env": []}, "linux": {}}
    await n.create_container(pod("p6"), container("c8", "p6"), spec)
    assert spec["process"]["env"] == ["OK=1"]
    assert host.feature_probes == 1
    p.close()


async def test_a_runtime_that_applies_it_gets_the_scheduling_policy(
        runtime: tuple[NRI, Host, str]) -> None:
    n, host, sock = runtime
    host.features = json.dumps({"ociVersionMax": "1.2.0"}).encode()
    adj = nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        scheduler=nri.LinuxScheduler(policy=nri.SCHED_BATCH, nice=5)))
    p = FakePlugin("sched", "10", bit(nri.CREATE_CONTAINER), {
        "CreateContainer": (nri.CreateContainerRequest,
                            reply(nri.CreateContainerResponse(adjust=adj)))})
    await p.connect(sock)
    await until(lambda: n.active)
    spec: dict[str, Any] = {"process": {}, "linux": {}}
    await n.create_container(pod("p9"), container("c9", "p9"), spec)
    assert spec["process"]["scheduler"] == {"policy": "SCHED_BATCH", "nice": 5}
    p.close()


async def test_update_reply_changes_the_resources_the_container_gets(
        runtime: tuple[NRI, Host, str]) -> None:
    """UpdateContainer: a plugin's change to the container being updated is what it
    gets (the rest of the request stays); its update of another container goes through
    that container's own update path."""
    n, host, sock = runtime
    seen: list[nri.LinuxResources] = []

    async def update(msg: Message) -> Message:
        assert isinstance(msg, nri.UpdateContainerRequest)
        seen.append(msg.linux_resources)
        own = nri.ContainerUpdate(container_id=msg.container.id)
        own.linux.resources.cpu.shares.value = 777
        other = nri.ContainerUpdate(container_id="neighbour")
        other.linux.resources.memory.limit.value = 1 << 30
        return nri.UpdateContainerResponse(update=[own, other])

    p = FakePlugin("tuner", "10", bit(nri.UPDATE_CONTAINER),
                   {"UpdateContainer": (nri.UpdateContainerRequest, update)})
    await p.connect(sock)
    await until(lambda: n.active)
    asked = {"cpu": {"shares": 512, "quota": 50000, "period": 100000},
             "memory": {"limit": 64 << 20, "swap": 128 << 20}}
    cri_asked = pb.LinuxContainerResources(cpu_shares=512, cpu_quota=50000, cpu_period=100000,
                                           memory_limit_in_bytes=64 << 20)
    reported, got = await n.update_container(pod("p10"), container("c10", "p10"), cri_asked,
                                             asked)
    assert seen[0].cpu.shares.value == 512 and seen[0].memory.limit.value == 64 << 20
    # ContainerStatus reports what the plugin set, not what the CRI asked for.
    assert (reported.cpu_shares, reported.cpu_quota, reported.memory_limit_in_bytes) == (
        777, 50000, 64 << 20)
    assert cri_asked.cpu_shares == 512
    assert got == {"cpu": {"shares": 777, "quota": 50000, "period": 100000},
                   "memory": {"limit": 64 << 20, "swap": 128 << 20}}
    assert asked["cpu"]["shares"] == 512  # the caller's request is not changed in place
    assert host.updated == ["neighbour"]
    assert host.resources["neighbour"].memory_limit_in_bytes == 1 << 30
    p.close()


async def test_update_without_a_change_for_the_container_is_the_request(
        runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime
    p = FakePlugin("quiet", "10", bit(nri.UPDATE_CONTAINER), {
        "UpdateContainer": (nri.UpdateContainerRequest,
                            reply(nri.UpdateContainerResponse()))})
    await p.connect(sock)
    await until(lambda: n.active)
    asked = {"memory": {"limit": 64 << 20}}
    cri_asked = pb.LinuxContainerResources(memory_limit_in_bytes=64 << 20)
    assert await n.update_container(pod("p11"), container("c11", "p11"), cri_asked,
                                    asked) == (cri_asked, asked)
    p.close()


async def test_two_plugins_changing_the_same_resource_of_the_container_conflict(
        runtime: tuple[NRI, Host, str]) -> None:
    n, _, sock = runtime

    def shares(value: int) -> Handler:
        async def h(msg: Message) -> Message:
            assert isinstance(msg, nri.UpdateContainerRequest)
            own = nri.ContainerUpdate(container_id=msg.container.id)
            own.linux.resources.cpu.shares.value = value
            return nri.UpdateContainerResponse(update=[own])
        return h

    plugins = [FakePlugin(name, idx, bit(nri.UPDATE_CONTAINER), {
        "UpdateContainer": (nri.UpdateContainerRequest, shares(v))})
        for name, idx, v in (("one", "10", 100), ("two", "20", 200))]
    for p in plugins:
        await p.connect(sock)
    await until(lambda: len(n.plugins()) == 2)
    with pytest.raises(FailedPrecondition,
                       match="'20-two' and '10-one' both tried to set CPUShares"):
        await n.update_container(pod("p12"), container("c12", "p12"),
                                 pb.LinuxContainerResources(cpu_shares=2),
                                 {"cpu": {"shares": 2}})
    for p in plugins:
        p.close()


async def test_later_events_show_the_adjusted_spec_and_the_current_status(
        runtime: tuple[NRI, Host, str]) -> None:
    """The container's view is converted once per spec and its status is fresh in each
    event: StartContainer and PostStartContainer carry the plugins' adjustment and the
    state the container is in."""
    n, _, sock = runtime
    seen: list[nri.Container] = []

    def keep(rpl: Message) -> Handler:
        async def h(msg: Message) -> Message:
            seen.append(msg.container)  # type: ignore[attr-defined]
            return rpl
        return h

    adj = nri.ContainerAdjustment(env=[nri.KeyValue(key="ADDED", value="1")])
    p = FakePlugin("viewer", "10", bit(nri.CREATE_CONTAINER, nri.START_CONTAINER,
                                       nri.POST_START_CONTAINER), {
        "CreateContainer": (nri.CreateContainerRequest,
                            reply(nri.CreateContainerResponse(adjust=adj))),
        "StartContainer": (nri.StartContainerRequest, keep(nri.StartContainerResponse())),
        "PostStartContainer": (nri.PostStartContainerRequest,
                               keep(nri.PostStartContainerResponse()))})
    await p.connect(sock)
    await until(lambda: n.active)
    sb, ctr = pod("p9"), container("c9", "p9")
    ctr.state = pb.CONTAINER_CREATED
    await n.create_container(sb, ctr, {"process": {"env": ["PATH=/bin"]}, "linux": {}})
    await n.start_container(sb, ctr)
    ctr.state, ctr.pid = pb.CONTAINER_RUNNING, 4242
    await n.post_start_container(sb, ctr)
    await until(lambda: len(seen) == 2)
    assert [c.env for c in seen] == [["PATH=/bin", "ADDED=1"]] * 2
    assert [(c.state, c.pid) for c in seen] == [(nri.CONTAINER_CREATED, 0),
                                               (nri.CONTAINER_RUNNING, 4242)]
    p.close()


async def test_validators_are_asked_together_and_a_refusal_fails_the_create(
        runtime: tuple[NRI, Host, str]) -> None:
    """As containerd asks them: side by side (each answers only once both were asked;
    asked in turn, the first would time out), and a rejection fails CreateContainer naming
    the validator."""
    n, _, sock = runtime
    asked: list[str] = []
    both = asyncio.Event()

    def validator(reject: bool) -> Handler:
        async def h(_: Message) -> Message:
            asked.append("x")
            if len(asked) == 2:
                both.set()
            await both.wait()
            return nri.ValidateContainerAdjustmentResponse(reject=reject, reason="no")
        return h

    plugins = [FakePlugin(name, idx, bit(nri.VALIDATE_CONTAINER_ADJUSTMENT), {
        "ValidateContainerAdjustment": (nri.ValidateContainerAdjustmentRequest,
                                        validator(name == "strict"))})
        for name, idx in (("lenient", "10"), ("strict", "20"))]
    for p in plugins:
        await p.connect(sock)
    await until(lambda: len(n.plugins()) == 2)
    with pytest.raises(FailedPrecondition, match="20-strict rejected"):
        await n.create_container(pod("p8"), container("c8", "p8"), {"linux": {}})
    assert [p.calls for p in plugins] == [["ValidateContainerAdjustment"]] * 2
    assert len(n.plugins()) == 2  # neither timed out waiting for the other
    for p in plugins:
        p.close()


async def test_status_reports_the_resources_a_plugin_applied(
        runtime: tuple[NRI, Host, str]) -> None:
    """After a plugin changes a container's resources at CreateContainer, its status
    (and what an update merges with) shows the applied values, as containerd's does;
    what the plugin left alone stays as requested."""
    n, _, sock = runtime
    adj = nri.ContainerAdjustment(linux=nri.LinuxContainerAdjustment(
        resources=nri.LinuxResources(
            memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=256 << 20)),
            cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=512), cpus="0")),
        oom_score_adj=nri.OptionalInt(value=-10)))
    p = FakePlugin("sizer", "10", bit(nri.CREATE_CONTAINER), {
        "CreateContainer": (nri.CreateContainerRequest,
                            reply(nri.CreateContainerResponse(adjust=adj)))})
    await p.connect(sock)
    await until(lambda: n.active)
    ctr = container("c7", "p7")
    ctr.config.linux.resources.CopyFrom(pb.LinuxContainerResources(
        memory_limit_in_bytes=128 << 20, cpu_shares=2, cpu_period=100000,
        oom_score_adj=1000))
    spec: dict[str, Any] = {"process": {}, "linux": {}}
    await n.create_container(pod("p7"), ctr, spec)
    assert spec["linux"]["resources"]["memory"]["limit"] == 256 << 20
    res = ctr.status_proto().resources.linux
    assert (res.memory_limit_in_bytes, res.cpu_shares, res.cpuset_cpus, res.oom_score_adj,
            res.cpu_period) == (256 << 20, 512, "0", -10, 100000)
    p.close()
