"""The container manager's boundaries faked: conmon (FakeConmon), the rootfs mount (a
plain directory) and an `env` fixture building ContainerManagers over a fake runc, with one
image (IMAGE) stored and one pod (POD) ready."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config, RuntimeHandler
from crishim.container.manager import KIND, ContainerManager
from crishim.image import rootfs
from crishim.image.manager import ImageManager
from crishim.image.store import Image
from crishim.nri.hooks import NO_NRI, NRIHooks
from crishim.observe.events import EventBus
from crishim.runtime import conmon
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.db import Database
from crishim.store.sandbox import READY, Sandbox
from tests.fakes.managers import container_manager, runtime_side, stores
from tests.fakes.runtime import STATEFUL_RUNC, fake_runtime

# The one image in the store.
IMAGE = Image(id="sha256:" + "ab" * 32, repo_tags=["docker.io/library/busybox:latest"],
              repo_digests=[], size=0, config={"config": {"Cmd": ["sleep", "3600"]}},
              layer_dirs=[])
# The one pod, READY.
POD = "pod0" * 16


class FakeConmon:
    """conmon's part of a create: run the container's process (in the FAKE runtime's
    state, "created" until `start`), stay its parent, and write the exit file (128+N for
    a signal N, as conmon does) when it ends. `alive` answers conmon_alive."""

    def __init__(self) -> None:
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.alive: set[str] = set()  # persist dirs of monitors still running
        self.monitors: dict[str, asyncio.Task[None]] = {}
        self.gate = asyncio.Event()  # cleared: creates wait
        self.gate.set()
        self.at_gate = asyncio.Event()  # set once a create waits at the closed gate

    async def create(self, req: conmon.MonitorRequest) -> conmon.Created:
        if not self.gate.is_set():
            self.at_gate.set()
        await self.gate.wait()
        annotations = _read_json(os.path.join(req.bundle, "config.json"))["annotations"]
        proc = await asyncio.create_subprocess_exec(
            "sleep", "3600", start_new_session=True, stdin=asyncio.subprocess.DEVNULL)
        state = os.path.join(req.runtime.root, req.container_id)
        os.makedirs(state)
        _write(os.path.join(state, "state"), json.dumps({
            "id": req.container_id, "pid": proc.pid, "status": "created",
            "annotations": annotations}))
        os.makedirs(req.exit_dir, exist_ok=True)
        self.procs[req.container_id] = proc
        self.alive.add(req.persist_dir)
        self.monitors[req.container_id] = asyncio.create_task(self._monitor(req, proc))
        return conmon.Created(pid=proc.pid, conmon_pid=0)

    async def _monitor(self, req: conmon.MonitorRequest, proc: asyncio.subprocess.Process,
                       ) -> None:
        code = await proc.wait()
        _write(os.path.join(req.exit_dir, req.container_id),
               str(128 - code if code < 0 else code))
        self.alive.discard(req.persist_dir)

    async def exited(self, cid: str) -> None:
        """Until the container's process ended and its exit file is written."""
        await asyncio.wait_for(self.monitors[cid], 5)


def _read_json(path: str) -> Any:
    with open(path) as fh:
        return json.load(fh)


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


async def plain_rootfs(layer_dirs: list[str], bundle: str,
                       idmapped: rootfs.IdmappedLayers | None = None) -> str:
    """mount_rootfs faked: the rootfs is a plain directory in the bundle."""
    path = os.path.join(bundle, "rootfs")
    os.makedirs(path)
    return path



@pytest.fixture
async def env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SimpleNamespace]:
    """A ContainerManager factory (`env.manager()`) over STATEFUL_RUNC, FakeConmon and a
    plain-dir rootfs, with IMAGE stored and the pod POD ready; its containers are removed
    at the end."""
    tmp = str(tmp_path)
    fake = FakeConmon()
    monkeypatch.setattr(conmon, "create", fake.create)
    monkeypatch.setattr(conmon, "conmon_alive", lambda persist: persist in fake.alive)
    monkeypatch.setattr(conmon, "kill_conmon", lambda persist: None)
    monkeypatch.setattr(rootfs, "mount_rootfs", plain_rootfs)
    monkeypatch.setattr(rootfs, "unmount_all", lambda *args: None)
    monkeypatch.setattr(rootfs, "unmount", lambda target: None)
    runtime = fake_runtime(tmp, STATEFUL_RUNC)
    os.makedirs(runtime.root)
    cfg = Config(root=os.path.join(tmp, "var"), state=os.path.join(tmp, "run"),
                 cgroup_driver="cgroupfs", default_runtime="fake",
                 runtimes={"fake": RuntimeHandler(runtime.binary, runtime.root)})
    db = Database(os.path.join(cfg.root, "crishim.db"))
    await db.open()
    images = ImageManager(cfg, db)
    await images.meta.save([IMAGE])
    await images.start()
    pods, events = SandboxRegistry(), EventBus()
    pods.add(Sandbox(id=POD, name="web_ns_uid_0", runtime_handler="fake", created_at=1,
                     state=READY, config=pb.PodSandboxConfig(
                         metadata=pb.PodSandboxMetadata(name="web", namespace="ns",
                                                        uid="uid"))))
    e = SimpleNamespace(cfg=cfg, db=db, runtime=runtime, fake=fake, events=events,
                        managers=[], exit_files=[])

    async def manager(runtimes: RuntimeRegistry | None = None,
                      nri: NRIHooks = NO_NRI) -> ContainerManager:
        exit_files = ExitFileWatcher(os.path.join(cfg.state, "exits"))
        await exit_files.start()
        mgr = container_manager(
            cfg, db, store=stores(cfg, db, pods, events, images),
            runtime=runtime_side(cfg, runtimes, exit_files, nri))
        await mgr.start()
        e.managers.append(mgr)
        e.exit_files.append(exit_files)
        return mgr

    e.manager = manager
    try:
        yield e
    finally:
        fake.gate.set()  # a start a failed test left waiting
        for mgr in e.managers:
            for c in mgr.list_containers():
                await mgr.remove_container(c.id)
            await mgr.stop()
        for exit_files in e.exit_files:
            await exit_files.stop()
        for proc in fake.procs.values():
            if proc.returncode is None:
                proc.kill()
        await asyncio.gather(*fake.monitors.values(), return_exceptions=True)
        await images.stop()
        await db.close()


def container_config(name: str = "app") -> pb.ContainerConfig:
    """A container named `name` of IMAGE."""
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                              image=pb.ImageSpec(image=IMAGE.id))


async def stored_state(env: SimpleNamespace, cid: str) -> int | None:
    """The state the database holds for container `cid`, None without a record."""
    data = (await env.db.load_all(KIND)).get(cid)
    return None if data is None else int(data["state"])
