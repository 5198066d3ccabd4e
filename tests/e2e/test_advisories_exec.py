"""Advisories about exec, ExecSync and log files, performed against the real daemon.

- Clients that give up (containerd CVE-2022-23471 class: abandoned streams leave no task,
  fd or memory behind): 200 streaming exec sessions and 200 ExecSync calls whose client
  leaves at a random moment, before, while or after runc starts the command.
- ExecSync output bounded (containerd CVE-2022-31030 class): a command printing 200 MiB
  costs the daemon about one reply's worth of memory.
- Log paths reaching other files (CVE-2025-0750 class): a `<log>.tmp` link planted in the
  pod's log directory, or a symlinked directory in the log path, never lets a reopen or a
  start write outside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc
from crishim.streaming.client import exec_spdy
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import Env, container, daemon_env, exec_sync, pod
from tests.e2e.registry import Registry

ABANDONED = 200
# Sessions in flight at once: enough to finish quickly on two cores, few enough that
# the host's load does not turn every start into a timeout.
CONCURRENCY = 20
# How long the daemon may take to clear up after the last client left.
SETTLE = 30.0
# Daemon fds and memory after the storm, against before it.
FD_SLACK = 8
RSS_SLACK = 48 * 1024 * 1024


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-advexec",
                    *module_network("advisories-exec")) as e:
        yield e


@pytest.fixture(scope="module")
def target(env: Env) -> Iterator[tuple[str, int]]:
    """(container id, host pid of its init) of a container in its own pid namespace, whose
    init (`sleep`) reaps nothing: an orphaned exec stays visible, running or a zombie."""
    own_pid = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "target", ["sleep", "3600"], linux=own_pid)
        info = env.rt().ContainerStatus(pb.ContainerStatusRequest(
            container_id=cid, verbose=True), timeout=10).info
        yield cid, int(json.loads(info["info"])["pid"])


def in_container(init: int) -> list[str]:
    """The container's processes other than its init: in its pid namespace, or orphaned
    to its init (a zombie has no namespace link left)."""
    ns = os.readlink(f"/proc/{init}/ns/pid")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == init:
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            try:
                mine = os.readlink(f"/proc/{name}/ns/pid") == ns
            except OSError:
                mine = False
            if mine or ppid == init:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    cmdline = fh.read().replace(b"\0", b" ")
                found.append(f"{name} ppid={ppid} {cmdline!r}")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def settled(init: int) -> list[str]:
    """The container's leftover processes once the daemon had SETTLE s to clear up."""
    deadline = time.monotonic() + SETTLE
    while (left := in_container(init)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


async def _abandon_stream(env: Env, cid: str, delay: float) -> None:
    req = pb.ExecRequest(container_id=cid, cmd=["sleep", "4242"], stdout=True, stderr=True)
    url = (await asyncio.to_thread(env.rt().Exec, req, timeout=30)).url
    task = asyncio.create_task(exec_spdy(url))
    await asyncio.sleep(delay)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _abandon_exec_sync(stub: api_pb2_grpc.RuntimeServiceStub, cid: str,
                             delay: float) -> None:
    req = pb.ExecSyncRequest(container_id=cid, cmd=["sleep", "4243"], timeout=0)
    try:
        await stub.ExecSync(req, timeout=delay)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.CANCELLED), exc
    else:
        raise AssertionError("`sleep 4243` returned before its client left")


async def _storm(env: Env, cid: str) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)
    rng = random.Random(50)
    async with grpc.aio.insecure_channel(env.d.endpoint) as channel:
        stub = api_pb2_grpc.RuntimeServiceStub(channel)

        async def one(i: int) -> None:
            delay = rng.uniform(0.0, 0.2)
            async with gate:
                if i % 2:
                    await _abandon_stream(env, cid, delay)
                else:
                    await _abandon_exec_sync(stub, cid, max(delay, 0.001))

        await asyncio.gather(*(one(i) for i in range(2 * ABANDONED)))


def test_abandoned_exec_and_exec_sync_leave_nothing_cve_2022_23471(
        env: Env, target: tuple[str, int]) -> None:
    cid, init = target
    daemon = env.d.proc.pid if env.d.proc else 0
    # Warm the daemon's lazily built parts (channels, streaming server) before the baseline.
    assert exec_sync(env, cid, ["true"]).exit_code == 0
    asyncio.run(_abandon_stream(env, cid, 0.5))
    assert settled(init) == []
    fds, mem = fd_count(daemon), rss(daemon)
    asyncio.run(asyncio.wait_for(_storm(env, cid), 300))
    left = settled(init)
    assert left == [], f"{len(left)} exec'd processes outlived their clients: {left[:10]}"
    deadline = time.monotonic() + SETTLE
    while fd_count(daemon) > fds + FD_SLACK and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fd_count(daemon) <= fds + FD_SLACK, os.listdir(f"/proc/{daemon}/fd")
    assert rss(daemon) <= mem + RSS_SLACK
    # The container is still usable, its init untouched.
    assert exec_sync(env, cid, ["echo", "ok"]).stdout == b"ok\n"
    assert os.path.exists(f"/proc/{init}")


# What a 200 MiB ExecSync may add to the daemon's peak memory: the 16 MiB reply held
# once, and what the gRPC layer needs to send it.
EXEC_SYNC_PEAK = 40 * 1024 * 1024


def test_exec_sync_output_bounded_in_daemon_memory_cve_2022_31030(
        env: Env, target: tuple[str, int]) -> None:
    cid, _ = target
    daemon = env.d.proc.pid if env.d.proc else 0
    assert exec_sync(env, cid, ["head", "-c", "1048576", "/dev/zero"]).exit_code == 0
    before = rss(daemon)
    with open(f"/proc/{daemon}/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM from now on
    res = exec_sync(env, cid, ["head", "-c", str(200 * 1024 * 1024), "/dev/zero"], timeout=60)
    peak = rss(daemon, "VmHWM") - before
    assert res.exit_code == 0
    assert 15 * 1024 * 1024 <= len(res.stdout) <= 16 * 1024 * 1024
    assert peak <= EXEC_SYNC_PEAK, f"peak +{peak / 2**20:.1f} MiB"


def _reopen(env: Env, cid: str) -> None:
    env.rt().ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid), timeout=10)


def _wait_for_line(path: str, text: bytes, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as fh:
                if text in fh.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never reached {path}")


def test_planted_log_tmp_link_is_not_followed_on_reopen_cve_2025_0750(env: Env) -> None:
    outside = os.path.join(env.tmpdir, "outside-precious")
    with open(outside, "wb") as fh:
        fh.write(b"precious\n")
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "ticker",
                        ["sh", "-c", "while true; do echo tick; sleep 0.05; done"])
        log = os.path.join(pod_cfg.log_directory, "ticker.log")
        _wait_for_line(log, b"tick")
        # As the kubelet rotates: the log renamed, then the reopen; the pod (a log shipper
        # with the log directory mounted) planted a link where conmon makes the new file.
        os.rename(log, log + ".1")
        os.symlink(outside, log + ".tmp")
        _reopen(env, cid)
        _wait_for_line(log, b"tick")
        assert not os.path.islink(log)
        assert not os.path.lexists(log + ".tmp") or not os.path.islink(log + ".tmp")
        with open(outside, "rb") as fh:
            assert fh.read() == b"precious\n"


def test_symlinked_log_dir_is_refused_cve_2025_0750(env: Env) -> None:
    outside = os.path.join(env.tmpdir, "outside-dir")
    os.makedirs(outside, exist_ok=True)
    with pod(env) as (pod_id, pod_cfg):
        os.makedirs(pod_cfg.log_directory, exist_ok=True)
        os.symlink(outside, os.path.join(pod_cfg.log_directory, "linked"))
        cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="linked"),
                                 image=pb.ImageSpec(image=env.busybox),
                                 command=["sh", "-c", "echo escaped"],
                                 log_path="linked/0.log")
        with pytest.raises(grpc.RpcError) as err:
            cid = env.rt().CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg),
                timeout=60).container_id
            env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value
        assert "symlink" in str(err.value.details())
        assert os.listdir(outside) == []


ATTACHES = 50


def _conmon_of(cid: str) -> int:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"conmon") and cid.encode() in argv:
            return int(name)
    raise AssertionError(f"no conmon for {cid}")


async def _abandon_attach(env: Env, cid: str, delay: float) -> None:
    req = pb.AttachRequest(container_id=cid, stdout=True, stderr=True)
    url = (await asyncio.to_thread(env.rt().Attach, req, timeout=30)).url
    task = asyncio.create_task(exec_spdy(url))
    await asyncio.sleep(delay)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _fds_down_to(pid: int, limit: int) -> int:
    deadline = time.monotonic() + SETTLE
    while fd_count(pid) > limit and time.monotonic() < deadline:
        time.sleep(0.2)
    return fd_count(pid)


def test_abandoned_attach_leaves_no_socket_cve_2022_23471(env: Env) -> None:
    # conmon (2.1) lets go of a client's socket once both directions are done, and it
    # learns that its writes are done only from a failed write: a gone client's own
    # socket would stay in conmon until the container next prints. This one never does.
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "quiet", ["sleep", "3600"])
        daemon, conmon = (env.d.proc.pid if env.d.proc else 0), _conmon_of(cid)
        asyncio.run(_abandon_attach(env, cid, 0.5))  # warm up, then the baselines
        fds, conmon_fds = fd_count(daemon), fd_count(conmon)
        rng = random.Random(23471)

        async def storm() -> None:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one() -> None:
                async with gate:
                    await _abandon_attach(env, cid, rng.uniform(0.0, 0.2))

            await asyncio.gather(*(one() for _ in range(ATTACHES)))

        asyncio.run(asyncio.wait_for(storm(), 120))
        assert _fds_down_to(daemon, fds + FD_SLACK) <= fds + FD_SLACK
        assert _fds_down_to(conmon, conmon_fds) <= conmon_fds
