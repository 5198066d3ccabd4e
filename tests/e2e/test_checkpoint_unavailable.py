"""Checkpoint RPCs on a node where CRIU cannot run (this host: no criu, or a `criu check`
that fails on its kernel): CheckpointContainer, CheckpointPod and RestorePod answer
FAILED_PRECONDITION with the reason, after checking what they are asked (INVALID_ARGUMENT,
NOT_FOUND); CRIU is probed on the first such call, not at start, and once; nothing is
written where the archive would go, and the containers keep running."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import Env, container, daemon_env, pod, status
from tests.e2e.registry import Registry


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-checkpoint",
                    *module_network("checkpoint")) as e:
        yield e


def _expected() -> tuple[grpc.StatusCode, str]:
    """What this node should answer, judged as crishim judges it."""
    exe = shutil.which("criu")
    if exe is None:
        return grpc.StatusCode.FAILED_PRECONDITION, "criu not found in PATH"
    res = subprocess.run([exe, "check"], capture_output=True, text=True, timeout=120,
                         check=False)
    if res.returncode != 0:
        return grpc.StatusCode.FAILED_PRECONDITION, f"check failed (exit {res.returncode})"
    pytest.skip("CRIU runs here: tests/e2e/test_checkpoint.py checkpoints (this host "
                "answers no FAILED_PRECONDITION)")


def _error(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=180)  # type: ignore[operator]
    return err.value


def _probes(env: Env) -> int:
    return env.d.logs().count("CRIU probed")


def test_checkpoints_answer_why_criu_cannot_run(env: Env) -> None:
    assert _probes(env) == 0  # not at start
    code, words = _expected()
    out = os.path.join(env.tmpdir, "checkpoints")
    os.makedirs(out)
    rt = env.rt()
    with pod(env) as (sid, cfg):
        cid = container(env, sid, cfg, "counter", ["sleep", "3600"])
        # The request is checked, and what it names looked up, before CRIU.
        err = _error(rt.CheckpointContainer, pb.CheckpointContainerRequest(container_id=cid))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "location is required" in (err.details() or "")
        err = _error(rt.CheckpointContainer, pb.CheckpointContainerRequest(
            container_id="0" * 64, location=os.path.join(out, "c.tar")))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        err = _error(rt.CheckpointPod, pb.CheckpointPodRequest(
            pod_sandbox_id="f" * 64, output_path=os.path.join(out, "p")))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert _probes(env) == 0
        calls = [
            (rt.CheckpointContainer, pb.CheckpointContainerRequest(
                container_id=cid, location=os.path.join(out, "c.tar"), timeout=30)),
            (rt.CheckpointPod, pb.CheckpointPodRequest(
                pod_sandbox_id=sid, output_path=os.path.join(out, "pod"),
                container_ids=[cid])),
        ]
        archive = os.path.join(env.tmpdir, "from-elsewhere.tar")
        with open(archive, "wb"):
            pass
        calls.append((rt.RestorePod, pb.RestorePodRequest(
            checkpoint_path=archive, config=cfg, container_configs=[pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="counter"))])))
        for call, request in calls:
            err = _error(call, request)
            assert err.code() == code, (err.code(), err.details())
            assert words in (err.details() or ""), err.details()
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                assert "CRIU cannot run on this node" in (err.details() or "")
        assert _probes(env) == 1  # probed once, remembered
        assert os.listdir(out) == []  # nothing written where the archives would go
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        # The restore made no pod.
        pods = rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
        assert [p.id for p in pods] == [sid]
        # Nor does a container restored from an archive.
        err = _error(rt.CreateContainer, pb.CreateContainerRequest(
            pod_sandbox_id=sid, sandbox_config=cfg, config=pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="restored"),
                image=pb.ImageSpec(image=archive))))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
        assert "CRIU cannot run on this node" in (err.details() or "")
        listed = rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers
        assert [c.id for c in listed] == [cid]
