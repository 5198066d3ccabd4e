"""CheckpointPod's one cut and RestorePod's all-or-nothing, with a fake runtime and a fake
daemon: every container paused before the first dump and resumed before the call returns,
the output directory whole or gone; a restore that fails half-way removes what it made."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import podckpt
from crishim.cri import podrestore
from crishim.errors import AlreadyExists, FailedPrecondition
from tests.fakes.checkpoints import CheckpointRuntime, container_record


class _Shared(CheckpointRuntime):
    """One runtime per container, writing into one shared log of calls."""

    def __init__(self, log: list[str], name: str, fail: str = "") -> None:
        super().__init__(fail)
        self.log = log
        self.name = name

    async def pause(self, cid: str) -> None:
        await super().pause(cid)
        self.log.append(f"pause {self.name}")

    async def resume(self, cid: str) -> None:
        await super().resume(cid)
        self.log.append(f"resume {self.name}")

    async def checkpoint(self, cid: str, image_path: str, work_path: str,
                         timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.log.append(f"dump {self.name}")
        await super().checkpoint(cid, image_path, work_path, timeout)


def _lock(cid: str) -> asyncio.Lock:
    return asyncio.Lock()


def _pod(tmp: Path, fail: str = "") -> tuple[Any, list[Any], list[str]]:
    log: list[str] = []
    recs = []
    for i, name in enumerate(("a", "b")):
        rec = container_record(tmp / name)
        rec.id = str(i) * 64
        rec.config.metadata.name = name
        recs.append((rec, _Shared(log, name, fail if name == "b" else "")))
    sb = SimpleNamespace(id="p" * 64, runtime_handler="runc", config=pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="ns", uid="u")))
    return sb, recs, log


async def test_all_paused_before_any_dump_and_all_resumed(tmp_path: Path) -> None:
    sb, recs, log = _pod(tmp_path)
    parts = tmp_path / "parts"
    parts.mkdir()
    out = tmp_path / "out"
    await podckpt.checkpoint_pod(sb, recs, _lock, str(parts), str(out))
    assert log == ["pause a", "pause b", "dump a", "dump b", "resume a", "resume b"]
    assert sorted(os.listdir(out)) == sorted([f"{'0' * 64}.tar", f"{'1' * 64}.tar",
                                              "pod.dump"])
    assert os.stat(out).st_mode & 0o777 == 0o700 and os.listdir(parts) == []
    archives = podckpt.read_pod_dump(str(out))
    assert archives == {"a": str(out / f"{'0' * 64}.tar"), "b": str(out / f"{'1' * 64}.tar")}
    dump = json.loads((out / "pod.dump").read_text())
    assert (dump["name"], dump["namespace"], dump["uid"]) == ("web", "ns", "u")


async def test_a_failed_dump_resumes_all_and_leaves_nothing(tmp_path: Path) -> None:
    sb, recs, log = _pod(tmp_path, fail="criu")
    parts = tmp_path / "parts"
    parts.mkdir()
    out = tmp_path / "out"
    with pytest.raises(FailedPrecondition):
        await podckpt.checkpoint_pod(sb, recs, _lock, str(parts), str(out))
    assert log == ["pause a", "pause b", "dump a", "dump b", "resume a", "resume b"]
    assert not out.exists() and os.listdir(parts) == []
    assert not any(rt.paused for _, rt in recs)
    # Never into an existing path, never where the directory is missing.
    out.mkdir()
    with pytest.raises(AlreadyExists):
        await podckpt.checkpoint_pod(sb, recs, _lock, str(parts), str(out))
    with pytest.raises(FailedPrecondition, match="does not exist"):
        await podckpt.checkpoint_pod(sb, recs, _lock, str(parts), str(tmp_path / "no" / "out"))


class _Daemon:
    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.log: list[str] = []
        self.sandboxes = self
        self.containers = self

    async def run_sandbox(self, config: pb.PodSandboxConfig, handler: str) -> str:
        self.log.append("run")
        return "sid"

    async def create_container(self, sid: str, config: pb.ContainerConfig,
                               sandbox: pb.PodSandboxConfig) -> Any:
        if len([x for x in self.log if x.startswith("create")]) == self.fail_at:
            raise FailedPrecondition("no")
        self.log.append(f"create {config.metadata.name} {config.image.image}")
        return SimpleNamespace(id=f"id-{config.metadata.name}")

    async def remove_container(self, cid: str) -> None:
        self.log.append(f"remove {cid}")

    async def stop_sandbox(self, sid: str) -> None:
        self.log.append("stop")

    async def remove_sandbox(self, sid: str) -> None:
        self.log.append("remove sandbox")


def _configs() -> list[pb.ContainerConfig]:
    return [pb.ContainerConfig(metadata=pb.ContainerMetadata(name=n),
                               image=pb.ImageSpec(image=f"/ck/{n}.tar")) for n in ("a", "b")]


async def test_a_restore_makes_the_sandbox_and_created_containers() -> None:
    d = _Daemon(fail_at=-1)
    resp = await podrestore.restore_pod(d, pb.RestorePodRequest(), _configs())  # type: ignore[arg-type]
    assert resp.pod_sandbox_id == "sid"
    assert [(c.name, c.container_id) for c in resp.restored_containers] == [
        ("a", "id-a"), ("b", "id-b")]
    assert d.log == ["run", "create a /ck/a.tar", "create b /ck/b.tar"]


async def test_a_failed_restore_removes_everything_it_made() -> None:
    d = _Daemon(fail_at=1)
    with pytest.raises(FailedPrecondition):
        await podrestore.restore_pod(d, pb.RestorePodRequest(), _configs())  # type: ignore[arg-type]
    assert d.log == ["run", "create a /ck/a.tar", "remove id-a", "stop", "remove sandbox"]
