"""Pod sandbox Linux options and lifecycle across daemon restarts (real runc/CNI)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import host_local_ips
from tests.e2e.daemon import Daemon
from tests.e2e.faults import wait_for
from tests.e2e.imagebuild import push_busybox
from tests.e2e.registry import Registry
from tests.e2e.sandboxes import (
    Env,
    pause_gone,
    pod_config,
    remove_pod,
    run_pod,
    sh,
    status,
)
from tests.e2e.sandboxes import sandbox_daemon as _daemon


@pytest.fixture(scope="module")
def pods() -> Iterator[tuple[Daemon, Env]]:
    with _daemon() as de:
        yield de


def _pid(d: Daemon, sid: str) -> int:
    return int(json.loads(status(d.runtime(), sid, verbose=True).info["info"])["pid"])


def _proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in fh if ":" in line)}


def _wait_state(d: Daemon, sid: str, state: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(d.runtime(), sid).status.state == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"sandbox {sid} did not reach state {state}")


def _driver(d: Daemon) -> str:
    resp = d.runtime().RuntimeConfig(pb.RuntimeConfigRequest(), timeout=10)
    return "systemd" if resp.linux.cgroup_driver == pb.CgroupDriver.SYSTEMD else "cgroupfs"


V2 = os.path.isfile("/sys/fs/cgroup/cgroup.controllers")


@pytest.mark.skipif(V2, reason="cgroup v1 only: reads the memory hierarchy's line of "
                    "/proc/<pid>/cgroup (the systemd variant below covers v2)")
def test_cgroup_parent_cgroupfs(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    if _driver(d) != "cgroupfs":
        pytest.skip("the daemon runs the systemd cgroup driver (systemd is PID 1)")
    parent = f"/crishim-e2e-{os.getpid()}/podabc"
    config = pod_config("cg")
    config.linux.cgroup_parent = parent
    sid = run_pod(d.runtime(), config)
    try:
        with open(f"/proc/{_pid(d, sid)}/cgroup") as fh:
            lines = fh.read().splitlines()
        memory = next(line for line in lines if ":memory:" in line)
        assert memory.endswith(f"{parent}/crishim-{sid}")
    finally:
        remove_pod(d.runtime(), sid)
        # The kubelet owns the parent; remove what runc created for this test.
        for ctrl in os.listdir("/sys/fs/cgroup"):
            for path in (f"/sys/fs/cgroup/{ctrl}{parent}",
                         f"/sys/fs/cgroup/{ctrl}/crishim-e2e-{os.getpid()}"):
                with contextlib.suppress(OSError):
                    os.rmdir(path)


def test_cgroup_parent_systemd(pods: tuple[Daemon, Env]) -> None:
    """The systemd driver: the kubelet's slice parent holds the pause's scope; a cgroupfs
    path is refused (it used to become a top-level slice that outlived the pod)."""
    d, _ = pods
    if _driver(d) != "systemd":
        pytest.skip("the daemon runs the cgroupfs driver (no systemd as PID 1)")
    top = f"crishimtest{os.getpid()}"
    slice_name = f"{top}-podabc.slice"
    parent = f"/{top}.slice/{slice_name}"
    config = pod_config("cgs")
    config.linux.cgroup_parent = parent
    sid = run_pod(d.runtime(), config)
    try:
        with open(f"/proc/{_pid(d, sid)}/cgroup") as fh:
            line = fh.read().splitlines()[-1]
        assert line == f"0::{parent}/crishim-{sid}.scope" or \
            line.endswith(f"{parent}/crishim-{sid}.scope"), line
    finally:
        remove_pod(d.runtime(), sid)
    # No kubelet made these slices: systemd started them for the pause's scope, and
    # crishim stops them with the pod (systemd itself keeps an empty slice for good).
    for unit in (slice_name, f"{top}.slice"):
        state = subprocess.run(["systemctl", "is-active", unit], capture_output=True,
                               text=True).stdout.strip()
        if state == "active":
            subprocess.run(["systemctl", "stop", unit], check=False)
        assert state != "active", f"{unit} outlived the pod"
    assert not os.path.exists(f"/sys/fs/cgroup/{top}.slice")
    bad = pod_config("cgbad")
    bad.linux.cgroup_parent = f"/{top}/burstable/podabc"
    with pytest.raises(grpc.RpcError) as err:
        d.runtime().RunPodSandbox(pb.RunPodSandboxRequest(config=bad), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a systemd slice" in (err.value.details() or "")
    assert not os.path.exists("/sys/fs/cgroup/podabc.slice")


def test_run_as_user_privileged_and_seccomp(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()
    user = pod_config("user")
    sc = user.linux.security_context
    sc.run_as_user.value = 65534
    sc.run_as_group.value = 65533
    sc.supplemental_groups.extend([1234])
    sc.seccomp.profile_type = pb.SecurityProfile.RuntimeDefault
    priv = pod_config("priv", host_network=True)
    priv.linux.security_context.privileged = True
    a = run_pod(rt, user)
    b = run_pod(rt, priv)
    try:
        st = _proc_status(_pid(d, a))
        assert st["Uid"].split()[0] == "65534" and st["Gid"].split()[0] == "65533"
        assert "1234" in st["Groups"].split()
        assert st["Seccomp"] == "2"  # filter mode: RuntimeDefault applied to the pause
        assert st["NoNewPrivs"] == "1"
        pst = _proc_status(_pid(d, b))
        assert int(pst["CapEff"], 16) == int(pst["CapBnd"], 16)  # every capability
        assert pst["Seccomp"] == "0"
    finally:
        remove_pod(rt, a)
        remove_pod(rt, b)


def test_pid_and_ipc_namespace_options(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()
    pod_ns = pod_config("pidpod")
    pod_ns.linux.security_context.namespace_options.pid = pb.POD
    host_ns = pod_config("pidhost")
    host_ns.linux.security_context.namespace_options.pid = pb.NODE
    host_ns.linux.security_context.namespace_options.ipc = pb.NODE
    a = run_pod(rt, pod_ns)
    b = run_pod(rt, host_ns)
    try:
        me = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in ("pid", "ipc")}
        pa, pb_ = _pid(d, a), _pid(d, b)
        assert os.stat(f"/proc/{pa}/ns/pid").st_ino != me["pid"]
        assert os.stat(f"/proc/{pa}/ns/ipc").st_ino != me["ipc"]
        assert os.stat(f"/proc/{pb_}/ns/pid").st_ino == me["pid"]
        assert os.stat(f"/proc/{pb_}/ns/ipc").st_ino == me["ipc"]
        # The pod's own /dev/shm is a tmpfs of pod_shm_size (64 MiB default) in its dir.
        info = json.loads(status(rt, a, verbose=True).info["info"])
        df = sh("df", "-k", info["shm"]).stdout.splitlines()[-1].split()
        assert int(df[1]) == 64 * 1024
        assert json.loads(status(rt, b, verbose=True).info["info"])["shm"] == ""
    finally:
        remove_pod(rt, a)
        remove_pod(rt, b)


def test_pause_death_makes_sandbox_notready_and_stop_still_cleans(
        pods: tuple[Daemon, Env]) -> None:
    d, env = pods
    rt = d.runtime()
    sid = run_pod(rt, pod_config("dies"))
    ip = status(rt, sid).status.network.ip
    os.kill(_pid(d, sid), signal.SIGKILL)
    _wait_state(d, sid, pb.SANDBOX_NOTREADY)
    remove_pod(rt, sid)
    assert ip not in host_local_ips(env.tmpdir)


def test_pods_survive_daemon_restart_and_kill9() -> None:
    with _daemon() as (d, env):
        rt = d.runtime()
        keep = run_pod(rt, pod_config("keep"))
        lost = run_pod(rt, pod_config("lost"))
        pid_keep, pid_lost = _pid(d, keep), _pid(d, lost)
        d.stop()  # graceful: pods keep running
        d.start()
        assert status(d.runtime(), keep).status.state == pb.SANDBOX_READY
        d.kill9()
        os.kill(pid_lost, signal.SIGKILL)  # the pause dies while crishim is down
        d.start()
        rt = d.runtime()
        assert status(rt, keep).status.state == pb.SANDBOX_READY
        assert _pid(d, keep) == pid_keep
        _wait_state(d, lost, pb.SANDBOX_NOTREADY)
        # Exit watching (the pidfd) was re-armed for the surviving pod: noticed at once.
        os.kill(pid_keep, signal.SIGKILL)
        _wait_state(d, keep, pb.SANDBOX_NOTREADY, timeout=1.0)
        # Duplicate names are still detected after restart.
        with pytest.raises(grpc.RpcError) as err:
            run_pod(rt, pod_config("keep"))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        for sid in (keep, lost):
            remove_pod(rt, sid)
        assert host_local_ips(env.tmpdir) == []
        assert os.listdir(os.path.join(d.state, "netns")) == []
        del pid_lost


def test_pause_image_from_registry(registry: Registry) -> None:
    # A stand-in pause image: busybox whose entrypoint just sleeps.
    push_busybox(registry.host, "test/pause", "e2e",
                 config_overrides={"Entrypoint": ["/bin/sleep"], "Cmd": ["100000"]})
    ref = f"{registry.host}/test/pause:e2e"
    with _daemon(f'pause_image = "{ref}"\n') as (d, _env):
        rt = d.runtime()
        sid = run_pod(rt, pod_config("imgpause"))
        try:
            info = json.loads(status(rt, sid, verbose=True).info["info"])
            assert info["runtimeSpec"]["process"]["args"] == ["/bin/sleep", "100000"]
            # Start returns once runc init is released; its exec follows a moment later.
            cmdline: list[str] = []
            for _ in range(100):
                with open(f"/proc/{info['pid']}/cmdline") as fh:
                    cmdline = fh.read().split("\0")[:2]
                if cmdline == ["/bin/sleep", "100000"]:
                    break
                time.sleep(0.05)
            assert cmdline == ["/bin/sleep", "100000"]
            # The image was pulled through the image service and is listed there.
            images = d.images().ListImages(pb.ListImagesRequest()).images
            assert any(ref in img.repo_tags for img in images)
            rootfs = os.path.join(info["sandboxDir"], "rootfs")
            assert os.path.ismount(rootfs)
            rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
            assert not os.path.ismount(rootfs)  # the pause is dead: nothing uses it
        finally:
            remove_pod(rt, sid)
        # and the pod's files deleted in the background right after
        wait_for(lambda: not os.path.exists(info["sandboxDir"]), 5, "the sandbox dir to go")


def test_failed_pause_create_rolls_everything_back(tmp_path: Any) -> None:
    # A runtime handler whose `create` fails: everything done before it must be undone.
    # The reason goes to the runtime's --log file, as runc's own errors do (the pause is
    # created with its stdio on /dev/null: no stderr to read).
    wrapper = os.path.join(str(tmp_path), "flaky-runc")
    with open(wrapper, "w") as fh:
        fh.write('#!/bin/sh\ncase " $* " in *" create "*)\n'
                 '  log=""; prev=""\n'
                 '  for a in "$@"; do [ "$prev" = --log ] && log="$a"; prev="$a"; done\n'
                 '  echo \'{"level":"error","msg":"injected create failure"}\' >> "$log"\n'
                 '  exit 1;;\nesac\nexec runc "$@"\n')
    os.chmod(wrapper, 0o755)
    extra = (f'[runtimes.runc]\npath = "runc"\n[runtimes.flaky]\npath = "{wrapper}"\n')
    with _daemon(extra) as (d, env):
        rt = d.runtime()
        with pytest.raises(grpc.RpcError) as err:
            rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config("rb"),
                                                     runtime_handler="flaky"), timeout=60)
        assert "injected create failure" in (err.value.details() or "")
        assert list(rt.ListPodSandbox(pb.ListPodSandboxRequest()).items) == []
        assert host_local_ips(env.tmpdir) == []  # CNI DEL done
        assert os.listdir(os.path.join(d.state, "netns")) == []
        assert os.listdir(os.path.join(d.root, "sandboxes")) == []
        with open("/proc/self/mountinfo") as fh:
            assert d.workdir not in fh.read()
        # The name is free again and the normal handler works.
        remove_pod(rt, run_pod(rt, pod_config("rb")))


def test_start_cleans_pods_no_record_owns() -> None:
    # A lost database: the pause, its netns pin and its IP are leftovers nobody owns.
    with _daemon() as (d, env):
        sid = run_pod(d.runtime(), pod_config("orphan"))
        pid = _pid(d, sid)
        d.kill9()
        for name in os.listdir(d.root):
            if name.startswith("crishim.db"):
                os.unlink(os.path.join(d.root, name))
        d.start()
        assert list(d.runtime().ListPodSandbox(pb.ListPodSandboxRequest()).items) == []
        assert sh("runc", "--root", os.path.join(d.state, "runc"), "list", "-q").stdout == ""
        assert os.listdir(os.path.join(d.state, "netns")) == []
        assert host_local_ips(env.tmpdir) == []
        assert os.listdir(os.path.join(d.root, "sandboxes")) == []
        with open("/proc/self/mountinfo") as fh:
            assert d.workdir not in fh.read()
        for _ in range(50):  # the pause dies shortly after the kill
            if pause_gone(pid):
                break
            time.sleep(0.1)
        assert pause_gone(pid)
