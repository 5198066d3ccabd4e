"""Checkpoint RPCs on a node where CRIU cannot run: the request checked first, then what
it names, then CRIU, probed once (`criu check`, or no criu on PATH) and its reason the
FAILED_PRECONDITION every call answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import podckpt
from crishim.cri.checkpoint import CheckpointRPCs
from crishim.errors import (
    CrishimError,
    FailedPrecondition,
    InvalidArgument,
    Kind,
    NotFound,
)
from crishim.runtime.criu import CriuProbe


def _fake_criu(tmp: Path, body: str) -> str:
    """A `criu` script; every run appends a line to `runs` beside it."""
    exe = tmp / "criu"
    exe.write_text(f"#!/bin/sh\necho run >> {tmp / 'runs'}\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def _runs(tmp: Path) -> int:
    runs = tmp / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


async def test_a_failing_check_is_the_reason_and_is_run_once(tmp_path: Path) -> None:
    exe = _fake_criu(tmp_path, "echo 'Error (criu/vdso.c:340): vdso: bad layout' >&2\n"
                               "echo 'Looks bad.'\nexit 1")
    probe = CriuProbe(exe)
    reasons = await asyncio.gather(*(probe.unusable() for _ in range(5)))
    assert len(set(reasons)) == 1
    assert reasons[0].startswith(f"{exe} check failed (exit 1): ")
    assert "vdso: bad layout" in reasons[0] and "Looks bad." in reasons[0]
    assert await probe.unusable() == reasons[0]
    assert _runs(tmp_path) == 1  # concurrent first callers and later ones share one run


async def test_a_passing_check_is_no_reason(tmp_path: Path) -> None:
    assert await CriuProbe(_fake_criu(tmp_path, "echo 'Looks good.'")).unusable() == ""


async def test_no_criu_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = await CriuProbe().unusable()
    assert reason == "criu not found in PATH (checkpoints need CRIU)"


class _Containers:
    def __init__(self, recs: dict[str, str]) -> None:
        self.recs = recs  # container id → pod id
        self.checkpoints: list[tuple[str, str, float]] = []
        self.checkpoint_dir = "/parts"
        self.records = SimpleNamespace(lock=lambda cid: None)

    async def checkpoint_container(self, cid: str, location: str, limit_s: float) -> None:
        self.checkpoints.append((cid, location, limit_s))

    def runtime_for(self, rec: Any) -> str:
        return f"runtime of {rec.id}"

    def get(self, cid: str) -> Any:
        if cid not in self.recs:
            raise NotFound(f"container {cid} not found")
        return SimpleNamespace(id=cid, pod_id=self.recs[cid])


class _Pods:
    def get(self, sid: str) -> Any:
        if sid not in ("pod1", "pod2"):
            raise NotFound(f"pod sandbox {sid} not found")
        return SimpleNamespace(id=sid)


class _Runtimes:
    def resolve_name(self, handler: str) -> str:
        if handler not in ("", "runc"):
            raise InvalidArgument(f"runtime handler {handler!r} is not configured")
        return handler or "runc"


def _servicer(probe: CriuProbe) -> CheckpointRPCs:
    rpcs = CheckpointRPCs()
    rpcs.daemon = SimpleNamespace(  # type: ignore[assignment]
        criu=probe, containers=_Containers({"c1": "pod1", "c2": "pod2"}), sandboxes=_Pods(),
        runtimes=_Runtimes())
    return rpcs


async def _call(rpcs: CheckpointRPCs, request: Any) -> CrishimError:
    method = {pb.CheckpointContainerRequest: rpcs.CheckpointContainer,
              pb.CheckpointPodRequest: rpcs.CheckpointPod,
              pb.RestorePodRequest: rpcs.RestorePod}[type(request)]
    with pytest.raises(CrishimError) as err:
        await method(request, None)  # type: ignore[operator]
    return err.value


def _restore(**kw: Any) -> pb.RestorePodRequest:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u",
                                                             namespace="n"))
    return pb.RestorePodRequest(**{"config": cfg, **kw})


async def test_each_call_checks_its_request_before_criu(tmp_path: Path) -> None:
    archive = tmp_path / "pod.tar"
    archive.write_bytes(b"")
    rpcs = _servicer(CriuProbe(_fake_criu(tmp_path, "echo nope >&2; exit 3")))
    refused = [
        (pb.CheckpointContainerRequest(location="/tmp/a.tar"), "container_id is required"),
        (pb.CheckpointContainerRequest(container_id="c1"), "location is required"),
        (pb.CheckpointContainerRequest(container_id="c1", location="a.tar"), "absolute"),
        (pb.CheckpointContainerRequest(container_id="c1", location="/x", timeout=-1),
         "negative"),
        (pb.CheckpointPodRequest(output_path="/tmp/p"), "pod_sandbox_id is required"),
        (pb.CheckpointPodRequest(pod_sandbox_id="pod1"), "output_path is required"),
        (pb.CheckpointPodRequest(pod_sandbox_id="pod1", output_path="/a/../b"), "'..'"),
        (pb.CheckpointPodRequest(pod_sandbox_id="pod1", output_path="/o",
                                 container_ids=["c1", ""]), r"container_ids[1]"),
        (pb.CheckpointPodRequest(pod_sandbox_id="pod1", output_path="/o",
                                 container_ids=["c2"]), "is in pod pod2, not in pod pod1"),
        (_restore(), "checkpoint_path is required"),
        (pb.RestorePodRequest(checkpoint_path=str(archive)), "config"),
        (_restore(checkpoint_path=str(archive), config=pb.PodSandboxConfig()),
         "missing name, uid, namespace"),
        (_restore(checkpoint_path=str(archive), runtime_handler="kata"), "'kata'"),
        (_restore(checkpoint_path=str(archive), container_configs=[
            pb.ContainerConfig(metadata=pb.ContainerMetadata(name="a")),
            pb.ContainerConfig(metadata=pb.ContainerMetadata(name="a"))]), "name a more"),
    ]
    for request, words in refused:
        err = await _call(rpcs, request)
        assert err.code == Kind.INVALID_ARGUMENT and words in str(err), (request, err)
    missing = [
        (pb.CheckpointContainerRequest(container_id="nope", location="/x"), "nope"),
        (pb.CheckpointPodRequest(pod_sandbox_id="nope", output_path="/o"), "nope"),
        (pb.CheckpointPodRequest(pod_sandbox_id="pod1", output_path="/o",
                                 container_ids=["c9"]), "c9"),
        (_restore(checkpoint_path=str(tmp_path / "none.tar")), "none.tar"),
    ]
    for request, words in missing:
        err = await _call(rpcs, request)
        assert isinstance(err, NotFound) and words in str(err), (request, err)
    assert _runs(tmp_path) == 0  # no bad request reached CRIU
    for request, what in [
        (pb.CheckpointContainerRequest(container_id="c1", location="/x"),
         "checkpoint of container c1"),
        (pb.CheckpointPodRequest(pod_sandbox_id="pod1", output_path="/o",
                                 container_ids=["c1"]), "checkpoint of pod pod1"),
        (_restore(checkpoint_path=str(archive)), f"restore of pod p from {archive}"),
    ]:
        err = await _call(rpcs, request)
        assert isinstance(err, FailedPrecondition), err
        assert str(err).startswith(f"{what}: CRIU cannot run on this node: ")
        assert "check failed (exit 3): nope" in str(err)
    assert _runs(tmp_path) == 1


async def test_where_criu_runs_the_checkpoints_reach_the_containers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod_checkpoints = []

    async def checkpoint_pod(sb: Any, recs: list[tuple[Any, str]], lock: Any, work: str,
                             output: str) -> None:
        pod_checkpoints.append((sb.id, [(r.id, rt) for r, rt in recs], work, output))

    monkeypatch.setattr(podckpt, "checkpoint_pod", checkpoint_pod)
    rpcs = _servicer(CriuProbe(_fake_criu(tmp_path, "echo 'Looks good.'")))
    await rpcs.CheckpointContainer(pb.CheckpointContainerRequest(
        container_id="c1", location="/x/c.tar", timeout=7), None)  # type: ignore[arg-type]
    assert rpcs.daemon.containers.checkpoints == [  # type: ignore[attr-defined]
        ("c1", "/x/c.tar", 7.0)]
    await rpcs.CheckpointPod(pb.CheckpointPodRequest(
        pod_sandbox_id="pod1", output_path="/o", container_ids=["c1"]),
        None)  # type: ignore[arg-type]
    assert pod_checkpoints == [("pod1", [("c1", "runtime of c1")], "/parts", "/o")]
