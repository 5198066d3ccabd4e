"""The sandbox manager's boundaries faked: the CNI side (FakeNetwork) and an `env` fixture
building SandboxManagers over a fake runc and netns pins that are plain files."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config, RuntimeHandler
from crishim.host.facts import HostFacts, oom_score_adj_floor
from crishim.network.types import NetworkResult, PodNetwork
from crishim.sandbox import build as sandbox_build
from crishim.sandbox import teardown as sandbox_teardown
from crishim.sandbox.manager import SandboxManager
from crishim.store.db import Database
from tests.fakes.host import pin_netns, touch, unpin_netns
from tests.fakes.managers import sandbox_manager
from tests.fakes.runtime import STATEFUL_RUNC, fake_runtime


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


@pytest.fixture
async def env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SimpleNamespace]:
    """A SandboxManager factory (`env.manager()`) over STATEFUL_RUNC, FakeNetwork and
    netns pins that are plain files; the pods it made are removed at the end."""
    tmp = str(tmp_path)
    monkeypatch.setattr(sandbox_build, "create_netns", pin_netns)
    monkeypatch.setattr(sandbox_teardown, "remove_netns", unpin_netns)
    runtime = fake_runtime(tmp, STATEFUL_RUNC)
    os.makedirs(runtime.root)
    catatonit = os.path.join(tmp, "catatonit")
    touch(catatonit)
    cfg = Config(root=os.path.join(tmp, "var"), state=os.path.join(tmp, "run"),
                 cgroup_driver="cgroupfs", catatonit_path=catatonit, default_runtime="fake",
                 runtimes={"fake": RuntimeHandler(runtime.binary, runtime.root)})
    db = Database(os.path.join(cfg.root, "crishim.db"))
    await db.open()
    net = FakeNetwork()
    e = SimpleNamespace(cfg=cfg, db=db, net=net, runtime=runtime, managers=[])

    async def manager() -> SandboxManager:
        mgr = sandbox_manager(cfg, db, net,
                              HostFacts(oom_score_adj_floor=oom_score_adj_floor()))
        await mgr.start()
        e.managers.append(mgr)
        return mgr

    e.manager = manager
    try:
        yield e
    finally:
        for mgr in e.managers:
            for sb in mgr.list_sandboxes():
                await mgr.remove_sandbox(sb.id)
            await mgr.stop()
        await db.close()


def pod_config(name: str = "web") -> pb.PodSandboxConfig:
    """A pod named `name` in namespace "ns", on the host's IPC namespace."""
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="ns", uid="uid-" + name),
        hostname=name, linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(ipc=pb.NODE))))

