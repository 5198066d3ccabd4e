"""SandboxManager lifecycle, locking and start-up reconcile with fakes at the boundaries:
a fake OCI runtime (a script keeping runc-like state, its pause a real `sleep`), a fake
network manager and netns pins that are plain files. Id-prefix lookups of pods and
containers follow one rule."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.registry import CDIRegistry
from crishim.config import Config, RuntimeHandler
from crishim.container.manager import ContainerManager
from crishim.container.spec import HostInfo
from crishim.errors import NotFound
from crishim.events import EventBus
from crishim.image.manager import ImageManager
from crishim.network.types import NetworkResult, PodNetwork
from crishim.oci.exits import ExitWatcher
from crishim.oci.runc import RuntimeRegistry
from crishim.sandbox import manager as sandbox_manager
from crishim.sandbox.manager import SandboxManager
from crishim.sandbox.model import NOTREADY, READY
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.db import Database
from tests.unit.test_oci_runtime import fake_runtime

# runc's CLI as far as the sandbox manager uses it. State: <root>/<id>/{pid,status}.
FAKE = f"""#!{sys.executable}
import json, os, shutil, signal, subprocess, sys
args = sys.argv[1:]
root = log = ""
while args[0].startswith("--"):
    if args[0] == "--root":
        root = args[1]
    elif args[0] == "--log":
        log = args[1]
    args = args[2:] if args[0] in ("--root", "--log", "--log-format") else args[1:]
cmd, args = args[0], args[1:]
def fail(msg):
    with open(log, "a") as fh:
        fh.write(json.dumps({{"level": "error", "msg": msg}}) + "\\n")
    sys.exit(1)
def load(cid):
    d = os.path.join(root, cid)
    if not os.path.isdir(d):
        fail("container does not exist")
    with open(os.path.join(d, "state")) as fh:
        st = json.load(fh)
    try:
        with open(f"/proc/{{st['pid']}}/stat") as fh:
            alive = fh.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        alive = False
    if not alive:
        st["status"] = "stopped"
    return d, st
def save(d, st):
    with open(os.path.join(d, "state"), "w") as fh:
        json.dump(st, fh)
if cmd == "create":
    bundle, pid_file, cid = args[1], args[3], args[4]
    with open(os.path.join(bundle, "config.json")) as fh:
        annotations = json.load(fh).get("annotations", {{}})
    p = subprocess.Popen(["sleep", "3600"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    d = os.path.join(root, cid)
    os.makedirs(d)
    save(d, {{"id": cid, "pid": p.pid, "status": "created", "annotations": annotations}})
    with open(pid_file, "w") as fh:
        fh.write(str(p.pid))
elif cmd == "start":
    d, st = load(args[0])
    st["status"] = "running"
    save(d, st)
elif cmd == "state":
    print(json.dumps(load(args[0])[1]))
elif cmd == "kill":
    d, st = load(args[-2])
    if st["status"] == "stopped":
        fail("container not running")
    os.kill(st["pid"], int(args[-1]))
elif cmd == "delete":
    d, st = load(args[-1])
    if st["status"] != "stopped":
        if "--force" not in args:
            fail("cannot delete container that is not stopped")
        os.kill(st["pid"], signal.SIGKILL)
    shutil.rmtree(d)
elif cmd == "list":
    print(json.dumps([load(c)[1] for c in sorted(os.listdir(root))
                      if os.path.isdir(os.path.join(root, c))]))
else:
    fail("unknown command " + cmd)
"""


class FakeNetwork:
    """The CNI side: records calls, and checks that one pod's calls never overlap."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.busy: set[str] = set()
        self.fail_setup = False

    async def _step(self, what: str, pod_id: str) -> None:
        assert pod_id not in self.busy, f"{what} overlaps another call for {pod_id}"
        self.busy.add(pod_id)
        try:
            await asyncio.sleep(0.02)
            self.calls.append((what, pod_id))
        finally:
            self.busy.discard(pod_id)

    async def setup(self, pod_id: str, netns_path: str, pod: PodNetwork) -> NetworkResult:
        await self._step("setup", pod_id)
        if self.fail_setup:
            raise RuntimeError("CNI ADD failed")
        return NetworkResult(ips=["10.0.0.2"], interfaces=[], raw={"cniVersion": "1.0.0"})

    async def teardown(self, pod_id: str, netns_path: str | None) -> None:
        await self._step("teardown", pod_id)

    async def reconcile(self, live_pod_ids: set[str]) -> None:
        self.calls.append(("reconcile", ",".join(sorted(live_pod_ids))))


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def _pin(path: str, *, roots: Sequence[str]) -> None:
    _touch(path)


async def _unpin(path: str, *, roots: Sequence[str]) -> None:
    if _exists(path):
        os.unlink(path)


@pytest.fixture
async def env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SimpleNamespace]:
    tmp = str(tmp_path)
    monkeypatch.setattr(sandbox_manager, "create_netns", _pin)
    monkeypatch.setattr(sandbox_manager, "remove_netns", _unpin)
    runtime = fake_runtime(tmp, FAKE)
    os.makedirs(runtime.root)
    catatonit = os.path.join(tmp, "catatonit")
    _touch(catatonit)
    cfg = Config(root=os.path.join(tmp, "var"), state=os.path.join(tmp, "run"),
                 cgroup_driver="cgroupfs", catatonit_path=catatonit, default_runtime="fake",
                 runtimes={"fake": RuntimeHandler(runtime.binary, runtime.root)})
    db = Database(os.path.join(cfg.root, "crishim.db"))
    await db.open()
    net = FakeNetwork()
    e = SimpleNamespace(cfg=cfg, db=db, net=net, runtime=runtime, managers=[])

    async def manager() -> SandboxManager:
        pods, runtimes, events = SandboxRegistry(), RuntimeRegistry(cfg), EventBus()
        images = ImageManager(cfg, db)
        containers = ContainerManager(cfg, db, events, pods, images, runtimes,
                                      ExitWatcher(os.path.join(cfg.state, "exits")), HostInfo(),
                                      CDIRegistry(cfg.cdi_spec_dirs))
        mgr = SandboxManager(cfg, db, events, runtimes, net, images, pods, containers)
        await mgr.start()
        e.managers.append(mgr)
        return mgr

    e.manager = manager
    try:
        yield e
    finally:
        for mgr in e.managers:
            for sb in mgr.list():
                await mgr.remove(sb.id)
            await mgr.stop_manager()
        await db.close()


def _config(name: str = "web") -> pb.PodSandboxConfig:
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="ns", uid="uid-" + name),
        hostname=name, linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(ipc=pb.NODE))))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


async def test_run_stop_remove(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    sid = await mgr.run(_config(), "")
    sb = mgr.get(sid)
    assert sb.state == READY and sb.ips == ["10.0.0.2"] and _alive(sb.pid)
    assert _exists(sb.netns_path) and _exists(sb.sandbox_dir)
    assert (await env.db.load_all("sandbox"))[sid]["state"] == READY
    assert await env.db.intents("sandbox") == {}

    await mgr.stop(sid)
    assert sb.state == NOTREADY and sb.stopped and not _alive(sb.pid)
    assert await env.runtime.state(sid) is None  # deleted
    assert not _exists(sb.netns_path)
    await mgr.stop(sid)  # idempotent

    await mgr.remove(sid)
    assert mgr.find(sid) is None and await env.db.load_all("sandbox") == {}
    await mgr.after_reply.settle()  # the files go in the background, after the record
    assert not _exists(sb.sandbox_dir)
    assert [c[0] for c in env.net.calls if c[1] == sid] == ["setup", "teardown", "teardown"]
    await mgr.remove(sid)  # idempotent


async def test_stop_releases_the_mounts_and_remove_of_an_older_record_too(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = await env.manager()
    released: list[str] = []
    release = mgr._release_mounts

    async def counted(sb: Any) -> None:
        released.append(sb.id)
        await release(sb)

    monkeypatch.setattr(mgr, "_release_mounts", counted)
    one, two = await mgr.run(_config("one"), ""), await mgr.run(_config("two"), "")
    await mgr.stop(one)
    assert released == [one]
    assert (await env.db.load_all("sandbox"))[one]["mounts_released"] is True
    await mgr.remove(one)
    assert released == [one]  # nothing left to detach: one database delete

    # A pod stopped by a version that left its mounts for RemovePodSandbox.
    await mgr.stop(two)
    mgr.get(two).mounts_released = False
    await mgr.remove(two)
    assert released == [one, two, two] and mgr.list() == []


async def test_stop_waits_for_the_pod_lock(env: SimpleNamespace) -> None:
    """CreateContainer/StartContainer hold the pod lock: a stop cannot cut in."""
    mgr = await env.manager()
    sid = await mgr.run(_config(), "")
    pid = mgr.get(sid).pid
    async with mgr.pod_lock(sid):
        stop = asyncio.create_task(mgr.stop(sid))
        await asyncio.sleep(0.2)
        assert not stop.done() and _alive(pid) and mgr.get(sid).state == READY
    await asyncio.wait_for(stop, 10)
    assert not _alive(pid) and mgr.get(sid).state == NOTREADY


async def test_concurrent_stops_and_removes_settle(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    sid = await mgr.run(_config(), "")
    await asyncio.gather(mgr.stop(sid), mgr.remove(sid), mgr.stop(sid), mgr.remove(sid))
    assert mgr.list() == [] and await env.db.load_all("sandbox") == {}
    assert await env.runtime.list() == []


async def test_failed_run_leaves_nothing_and_frees_the_name(env: SimpleNamespace) -> None:
    mgr = await env.manager()
    env.net.fail_setup = True
    with pytest.raises(RuntimeError, match="CNI ADD failed"):
        await mgr.run(_config(), "")
    assert mgr.list() == [] and await env.runtime.list() == []
    assert await env.db.intents("sandbox") == {} and await env.db.load_all("sandbox") == {}
    assert os.listdir(os.path.join(env.cfg.root, "sandboxes")) == []
    env.net.fail_setup = False
    assert mgr.get(await mgr.run(_config(), "")).state == READY


async def test_start_marks_dead_pauses_and_deletes_orphans(env: SimpleNamespace) -> None:
    first = await env.manager()
    dead = await first.run(_config("dead"), "")
    live = await first.run(_config("live"), "")
    orphan = await first.run(_config("orphan"), "")
    await first.stop_manager()
    first.pods.clear()  # the daemon is gone; only records, runtime and files remain
    env.managers.remove(first)
    await env.db.delete("sandbox", orphan)  # a pause no record owns
    os.kill((await env.runtime.state(dead) or {})["pid"], 9)
    await asyncio.sleep(0.1)

    mgr = await env.manager()
    assert mgr.get(dead).state == NOTREADY and mgr.get(live).state == READY
    assert mgr.find(orphan) is None and await env.runtime.state(orphan) is None
    assert not _exists(os.path.join(env.cfg.root, "sandboxes", orphan))
    assert env.net.calls[-1] == ("reconcile", ",".join(sorted([dead, live])))


def _ids(*ids: str) -> dict[str, Any]:
    return {i: SimpleNamespace(id=i) for i in ids}


async def test_an_ambiguous_id_prefix_is_not_found_for_pods_and_containers(
        env: SimpleNamespace) -> None:
    pods = await env.manager()
    containers = pods.containers
    assert isinstance(containers, ContainerManager)
    pods.pods._sandboxes.update(_ids("ab12", "ab34"))
    containers.records._containers.update(_ids("cd12", "cd34"))
    for lookup, ambiguous, unique in ((pods, "ab", "ab3"), (containers, "cd", "cd1")):
        with pytest.raises(NotFound, match=r"prefix .* is ambiguous: 2 ids"):
            lookup.get(ambiguous)
        with pytest.raises(NotFound, match="ambiguous"):
            lookup.find(ambiguous)  # never "no such object" (a stop would be a no-op)
        assert lookup.get(unique).id.startswith(unique)
        assert lookup.find("zz") is None
        with pytest.raises(NotFound, match="not"):
            lookup.get("zz")
    # Idempotent stops and removes still refuse to guess.
    with pytest.raises(NotFound, match="ambiguous"):
        await pods.stop("ab")
    with pytest.raises(NotFound, match="ambiguous"):
        await containers.stop_container("cd", 0)
    pods.pods.clear()
    containers.records.clear()
