"""Writable-layer caps enforced: the daemon's containers/ on a loop-mounted XFS with project
quotas (`prjquota`). A container capped at 64 MiB gets ENOSPC writing 100 MiB while its
uncapped neighbour writes them; its stats read the usage from the quota; its project id
is freed when it is removed and when a kill -9 cut its create short.

Kernels without XFS quota support (the cgroup v1 CI host: "quota support not available in
this kernel") cannot mount it: the module skips there, and the v2 guest runs it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.host import xfsquota
from crishim.host.quota import PROJECT_IDS, probe
from crishim.proc.crashpoint import ENV as CRASH_AT
from tests.e2e.cni import module_network
from tests.e2e.faults import force_cleanup, networked_daemon, wait_for
from tests.e2e.lifecycle import Env, container, exec_sync, status
from tests.e2e.registry import Registry
from tests.e2e.sandboxes import pod_config, running_pod

MiB = 1024 * 1024
KEY = "io.crishim.container-rootfs-size"


@dataclass
class QuotaEnv(Env):
    device: str = ""  # the XFS loop device

    def limits(self) -> dict[int, int]:
        """crishim's project ids that have a hard limit on the XFS, and the limits."""
        out: dict[int, int] = {}
        pid = PROJECT_IDS.start
        while (q := xfsquota.next_quota(self.device, pid)) is not None \
                and q.project_id < PROJECT_IDS.stop:
            if q.hard_bytes:
                out[q.project_id] = q.hard_bytes
            pid = q.project_id + 1
        return out

    def bundle(self, cid: str) -> str:
        return os.path.join(self.d.root, "containers", cid)


def _mount(image: str, target: str) -> str:
    """Mount `image` on `target` with project quotas; why it could not ("": mounted)."""
    done = subprocess.run(["mount", "-o", "loop,prjquota", image, target],
                          capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"


def _umount(target: str) -> None:
    if subprocess.run(["umount", target], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", target], capture_output=True)


@contextlib.contextmanager
def _xfs_image() -> Iterator[str]:
    """A 512 MiB XFS image, checked to mount with prjquota here (else the module skips)."""
    if shutil.which("mkfs.xfs") is None:
        pytest.skip("mkfs.xfs is not installed (xfsprogs: hack/setup.sh --dev)")
    work = tempfile.mkdtemp(prefix="crishim-xfs-")
    try:
        image, scratch = os.path.join(work, "xfs.img"), os.path.join(work, "mnt")
        os.mkdir(scratch)
        with open(image, "wb") as fh:
            fh.truncate(512 * MiB)
        subprocess.run(["mkfs.xfs", "-q", "-f", image], check=True, capture_output=True)
        why = _mount(image, scratch)
        if why:
            pytest.skip(f"this kernel cannot mount XFS with project quotas ({why}); "
                        "the v2 guest runs these tests")
        _umount(scratch)
        yield image
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[QuotaEnv]:
    with _xfs_image() as image, networked_daemon(
            "crishim-quota", *module_network("quota"),
            '[storage]\ncontainer_rootfs_size_max = "1Gi"\n', busybox_ref) as nd:
        # Writable layers (containers/) on the XFS, the rest of root where it was.
        nd.d.stop()
        containers = os.path.join(nd.d.root, "containers")
        why = _mount(image, containers)
        assert not why, why
        try:
            nd.d.start()
            yield QuotaEnv(nd.d, nd.tmpdir, nd.bridge, registry, busybox_ref,
                           probe(containers).source)
        finally:
            force_cleanup(nd.d)
            _umount(containers)


@contextlib.contextmanager
def _capped_pod(env: QuotaEnv, name: str, cap: str = "64Mi"
                ) -> Iterator[tuple[str, pb.PodSandboxConfig]]:
    """A pod whose container "capped" asks for `cap`; removed at the end."""
    cfg = pod_config(name, hostname=name, log_directory=os.path.join(env.tmpdir, "logs", name),
                     annotations={f"{KEY}/capped": cap})
    with running_pod(env.rt(), cfg) as sid:
        yield sid, cfg


def _fill(env: QuotaEnv, cid: str) -> tuple[int, str]:
    """Write 100 MiB in the container: (bytes written, what dd said)."""
    r = exec_sync(env, cid, ["sh", "-c", "dd if=/dev/zero of=/big bs=1M count=100 "
                             "conv=fsync 2>&1; echo rc=$?; stat -c %s /big"], timeout=180)
    out = r.stdout.decode() + r.stderr.decode()
    return int(out.split()[-1]), out


def test_a_capped_container_stops_at_its_cap_and_its_neighbour_does_not(
        env: QuotaEnv) -> None:
    with _capped_pod(env, "quota-pair") as (sid, cfg):
        capped = container(env, sid, cfg, "capped", ["sleep", "3600"])
        free = container(env, sid, cfg, "free", ["sleep", "3600"])
        flags, project = xfsquota.get_project(os.path.join(env.bundle(capped), "upper"))
        assert project in PROJECT_IDS and flags & xfsquota.FS_XFLAG_PROJINHERIT
        assert xfsquota.get_project(env.bundle(free))[1] == 0  # uncapped: no project
        assert env.limits() == {project: 64 * MiB}

        written, said = _fill(env, capped)
        assert "No space left on device" in said and "rc=1" in said, said
        assert 56 * MiB <= written <= 64 * MiB, said
        # The neighbour on the same filesystem writes its 100 MiB.
        written, said = _fill(env, free)
        assert written == 100 * MiB and "rc=0" in said, said

        # Usage from the quota: what the kernel counts for the project, at once.
        # (Within a MiB: XFS may still turn delayed allocations into extents meanwhile.)
        quota = xfsquota.get_quota(env.device, project)
        layer = env.rt().ContainerStats(pb.ContainerStatsRequest(container_id=capped),
                                        timeout=30).stats.writable_layer
        assert abs(layer.used_bytes.value - quota.used_bytes) <= MiB, (layer, quota)
        assert layer.inodes_used.value == quota.inodes_used
        assert 56 * MiB <= layer.used_bytes.value <= 64 * MiB
        # The neighbour's is walked (cached; its first walk may still run).
        stats = wait_for(lambda: [s for s in env.rt().ListContainerStats(
            pb.ListContainerStatsRequest(), timeout=30).stats
            if s.attributes.id == free and s.writable_layer.used_bytes.value >= 100 * MiB],
            60, "the neighbour's walked usage")
        assert stats
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=capped), timeout=60)
        assert env.limits() == {}  # freed with the container


def _crash_create(env: QuotaEnv, step: str) -> None:
    """CreateContainer of a capped container with the daemon killed at `step`, then a
    normal restart."""
    env.d.stop()
    os.environ[CRASH_AT] = step
    try:
        env.d.start()
    finally:
        del os.environ[CRASH_AT]
    with _capped_pod(env, f"quota-{step}") as (sid, cfg):
        with pytest.raises(grpc.RpcError):
            container(env, sid, cfg, "capped", ["sleep", "3600"], start=False)
        assert env.d.proc is not None and env.d.proc.wait(30) == 137
        assert len(env.limits()) == 1  # set before the crash
        env.d.start()
        assert env.limits() == {}  # cleared at the restart: no record owns it
        assert not env.rt().ListContainers(pb.ListContainersRequest(
            filter=pb.ContainerFilter(pod_sandbox_id=sid)), timeout=10).containers


@pytest.mark.parametrize("step", ["container-after-quota", "container-before-record"])
def test_a_kill9_during_create_leaks_no_project(env: QuotaEnv, step: str) -> None:
    _crash_create(env, step)


def test_a_kill9_after_create_keeps_the_cap_until_removal(env: QuotaEnv) -> None:
    with _capped_pod(env, "quota-kept") as (sid, cfg):
        cid = container(env, sid, cfg, "capped", ["sleep", "3600"])
        before = env.limits()
        assert list(before.values()) == [64 * MiB]
        env.d.kill9()
        env.d.start()
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        assert env.limits() == before  # its own, kept
        written, said = _fill(env, cid)
        assert "No space left on device" in said and written <= 64 * MiB, said
    assert env.limits() == {}  # removed with its pod


def test_a_cap_above_the_maximum_is_refused(env: QuotaEnv) -> None:
    with _capped_pod(env, "quota-greedy", "2Gi") as (sid, cfg):
        with pytest.raises(grpc.RpcError) as err:
            container(env, sid, cfg, "capped", ["true"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert env.limits() == {}
