"""Containers end to end: real daemon, registry, runc under conmon, CNI bridge.

One daemon and one pod network per module (fast); every test makes its own pod and
removes it, and the module fixture force-cleans whatever a failing test left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.execsync import REPLY_BUDGET
from crishim.host.apparmor import kernel_enabled, parser_path
from crishim.host.facts import hybrid_v2_controllers, kernel_supports_rro
from crishim.proc import priority
from tests.e2e.cni import module_network
from tests.e2e.faults import conmon_processes, runtime_containers, wait_for
from tests.e2e.imagebuild import push_busybox
from tests.e2e.lifecycle import (
    Env,
    container,
    daemon_env,
    exec_sync,
    log_lines,
    pod,
    remove_pod,
    run_pod,
    status,
    wait_exited,
)
from tests.e2e.registry import Registry, free_port


def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [line.split()[4] for line in fh if line.split()[4].startswith(path)]


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-ctr", *module_network("lifecycle"),
                    'daemon_nice = -10\n'
                    '[runtimes.runc]\npath = "runc"\n[runtimes.crun]\npath = "crun"\n'
                    '[runtimes.second]\npath = "runc"\nroot = "{tmpdir}/second-root"\n') as e:
        yield e


# --- tests ---------------------------------------------------------------------------------

def test_exit_code_reason_logs_and_status(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "exit3",
                        ["sh", "-c", "echo out-line; echo err-line >&2; exit 3"],
                        labels={"app": "e2e"}, annotations={"note": "x"})
        st = wait_exited(env, cid)
        assert (st.exit_code, st.reason) == (3, "Error")
        assert st.started_at > 0 and st.finished_at >= st.started_at >= st.created_at
        assert st.image.image == env.busybox and st.image_ref and st.image_id
        assert st.labels["app"] == "e2e" and st.annotations["note"] == "x"
        assert st.log_path == os.path.join(pod_cfg.log_directory, "exit3.log")
        # Only what the container printed: a runtime warning (runc's "skipping device
        # /dev/char/10:200 for systemd" on a host without /dev/net/tun) goes to the
        # runtime's own log, never into the container's.
        assert sorted(log_lines(st.log_path)) == [("stderr", "err-line"),
                                                  ("stdout", "out-line")]
        ok = container(env, pod_id, pod_cfg, "ok", ["true"])
        assert wait_exited(env, ok).reason == "Completed"
        # ListContainers filters, served from memory.
        rt = env.rt()
        by_label = rt.ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(
            label_selector={"app": "e2e"}))).containers
        assert [c.id for c in by_label] == [cid]
        by_pod = rt.ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(
            pod_sandbox_id=pod_id, state=pb.ContainerStateValue(
                state=pb.CONTAINER_EXITED)))).containers
        assert {c.id for c in by_pod} == {cid, ok}
        by_prefix = rt.ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(
            id=cid[:12]))).containers
        assert [c.id for c in by_prefix] == [cid]
        info = json.loads(status(env, cid, verbose=True).info["info"])
        assert info["sandboxID"] == pod_id
        assert info["runtimeSpec"]["process"]["args"][:2] == ["sh", "-c"]
        # A duplicate name in the same pod is refused; after removal it is free again.
        with pytest.raises(grpc.RpcError) as err:
            container(env, pod_id, pod_cfg, "ok", ["true"], start=False)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        rt.RemoveContainer(pb.RemoveContainerRequest(container_id=ok))
        rt.RemoveContainer(pb.RemoveContainerRequest(container_id=ok))  # idempotent
        container(env, pod_id, pod_cfg, "ok", ["true"], start=False)


def test_create_errors(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        with pytest.raises(grpc.RpcError) as err:
            container(env, pod_id, pod_cfg, "noimg", ["true"],
                      image=f"{env.registry.host}/test/missing:latest")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            container(env, "no-such-pod", pod_cfg, "x", ["true"])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        for call in (lambda: status(env, "no-such-container"),):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # Stop/Remove of unknown containers succeed (idempotent).
        env.rt().StopContainer(pb.StopContainerRequest(container_id="nope", timeout=1))
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id="nope"))


def test_oom_killed(env: Env) -> None:
    limit = 24 << 20
    res = pb.LinuxContainerResources(memory_limit_in_bytes=limit,
                                     memory_swap_limit_in_bytes=limit)
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "hog", [
            "sh", "-c", 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}'],
            linux=pb.LinuxContainerConfig(resources=res))
        st = wait_exited(env, cid, 60)
        assert st.reason == "OOMKilled", (st.exit_code, st.reason)
        assert st.resources.linux.memory_limit_in_bytes == limit


def test_security_settings(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        sc = pb.LinuxContainerSecurityContext(
            readonly_rootfs=True,
            capabilities=pb.Capability(drop_capabilities=["CHOWN"]),
            seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))
        cid = container(env, pod_id, pod_cfg, "locked", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(security_context=sc))
        # Masked path: /proc/timer_list is covered, nothing can be read from it (the
        # privileged test below shows the same read returns data without masking).
        r = exec_sync(env, cid, ["sh", "-c", "head -c 16 /proc/timer_list | wc -c"])
        assert (r.exit_code, r.stdout.strip()) == (0, b"0"), r.stderr
        r = exec_sync(env, cid, ["touch", "/newfile"])
        assert r.exit_code != 0 and b"Read-only file system" in r.stderr
        r = exec_sync(env, cid, ["sh", "-c", "touch /dev/shm/f && chown 1000 /dev/shm/f"])
        assert r.exit_code != 0 and b"Operation not permitted" in r.stderr
        r = exec_sync(env, cid, ["unshare", "-U", "true"])
        assert r.exit_code != 0 and b"Operation not permitted" in r.stderr
        # The same call works without the profile: it was seccomp that denied it.
        free = container(env, pod_id, pod_cfg, "free", ["sleep", "3600"],
                         linux=pb.LinuxContainerConfig(
                             security_context=pb.LinuxContainerSecurityContext(
                                 seccomp=pb.SecurityProfile(
                                     profile_type=pb.SecurityProfile.Unconfined))))
        r = exec_sync(env, free, ["unshare", "-U", "true"])
        assert r.exit_code == 0, r.stderr
        r = exec_sync(env, free, ["sh", "-c", "touch /tmp/f && chown 1000 /tmp/f"])
        assert r.exit_code == 0, r.stderr


def _apparmor_on() -> bool:
    return kernel_enabled() and parser_path() is not None


def test_apparmor_state_is_reported(env: Env) -> None:
    """Status(verbose) says whether containers get the default profile, and why not."""
    info = json.loads(env.rt().Status(pb.StatusRequest(verbose=True), timeout=15)
                      .info["apparmor"])
    if _apparmor_on():
        assert info == {"enabled": True, "defaultProfile": "crishim-default",
                        "reason": "loaded", "error": ""}
    else:
        assert (info["enabled"], info["defaultProfile"]) == (False, "")
        assert info["reason"]
        # Without AppArmor a RuntimeDefault request runs (unconfined), as before.
        with pod(env) as (pod_id, pod_cfg):
            sc = pb.LinuxContainerSecurityContext(apparmor=pb.SecurityProfile(
                profile_type=pb.SecurityProfile.RuntimeDefault))
            cid = container(env, pod_id, pod_cfg, "aa", ["sleep", "3600"],
                            linux=pb.LinuxContainerConfig(security_context=sc))
            assert exec_sync(env, cid, ["true"]).exit_code == 0


@pytest.mark.skipif(not _apparmor_on(), reason="the kernel has no AppArmor (no "
                    "/sys/kernel/security/apparmor, or apparmor_parser missing): the "
                    "default profile cannot be loaded or enforced here")
def test_apparmor_default_profile_confines(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        def label(name: str, sc: pb.LinuxContainerSecurityContext) -> tuple[str, str]:
            cid = container(env, pod_id, pod_cfg, name, ["sleep", "3600"],
                            linux=pb.LinuxContainerConfig(security_context=sc))
            r = exec_sync(env, cid, ["cat", "/proc/self/attr/current"])
            return r.stdout.decode().strip(), cid

        # Unset (what the kubelet sends for a pod without a profile) → the default.
        current, cid = label("unset", pb.LinuxContainerSecurityContext())
        assert current == "crishim-default (enforce)"
        r = exec_sync(env, cid, ["sh", "-c", "echo h > /proc/sysrq-trigger"])
        assert r.exit_code != 0
        r = exec_sync(env, cid, ["mount", "-t", "tmpfs", "t", "/mnt"])
        assert r.exit_code != 0
        current, _ = label("unconfined", pb.LinuxContainerSecurityContext(
            apparmor=pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)))
        assert current == "unconfined"


def test_explicit_masked_and_readonly_paths(env: Env) -> None:
    # critest's MaskedPaths case, on a file (the test image's applets are symlinks to
    # busybox, and masking follows them): the kubelet's list replaces the defaults.
    sc = pb.LinuxContainerSecurityContext(masked_paths=["/etc/group"],
                                          readonly_paths=["/tmp"])
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "masked", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(security_context=sc))
        r = exec_sync(env, cid, ["sh", "-c", "wc -c < /etc/group; wc -c < /etc/passwd"])
        group, passwd = r.stdout.split()
        assert group == b"0" and int(passwd) > 0, r.stderr
        r = exec_sync(env, cid, ["touch", "/tmp/f"])
        assert r.exit_code != 0 and b"Read-only file system" in r.stderr
        # Not in the list, so not masked any more.
        r = exec_sync(env, cid, ["sh", "-c", "head -c 16 /proc/timer_list | wc -c"])
        assert r.stdout.strip() == b"16", r.stderr


def test_image_user_stop_signal_and_stop_semantics(env: Env) -> None:
    push_busybox(env.registry.host, "test/busybox-app", "v1",
                 config_overrides={"User": "app", "StopSignal": "SIGUSR1"})
    ref = f"{env.registry.host}/test/busybox-app:v1"
    env.d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "app", [
            "sh", "-c", "trap 'exit 7' USR1; while true; do sleep 0.1; done"], image=ref)
        r = exec_sync(env, cid, ["id"])
        assert r.stdout.startswith(b"uid=1000(app) gid=1000(app)"), r.stdout
        st = status(env, cid).status
        assert (st.user.linux.uid, st.user.linux.gid) == (1000, 1000)
        # Status names the image's STOPSIGNAL, which reaches the process: it exits 7.
        assert st.stop_signal == pb.SIGUSR1
        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=20))
        st = status(env, cid).status
        assert (st.state, st.exit_code, st.stop_signal) == (pb.CONTAINER_EXITED, 7, pb.SIGUSR1)
        # The kubelet's lifecycle.stopSignal "SIGRTMIN+1" (signal 35) wins over the image's.
        rt = container(env, pod_id, pod_cfg, "rtmin", [
            "sh", "-c", "trap 'exit 8' 35; while true; do sleep 0.1; done"], image=ref,
            stop_signal=pb.SIGRTMINPLUS1)
        assert status(env, rt).status.stop_signal == pb.SIGRTMINPLUS1
        env.rt().StopContainer(pb.StopContainerRequest(container_id=rt, timeout=20))
        assert status(env, rt).status.exit_code == 8
        # Without either, SIGTERM is what is used and reported.
        assert status(env, container(env, pod_id, pod_cfg, "plain", ["true"], start=False)
                      ).status.stop_signal == pb.SIGTERM
        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=20))
        # A process that ignores the stop signal is SIGKILLed after the timeout...
        stubborn = container(env, pod_id, pod_cfg, "stubborn", [
            "sh", "-c", "trap '' USR1 TERM; while true; do sleep 0.1; done"], image=ref)
        env.rt().StopContainer(pb.StopContainerRequest(container_id=stubborn, timeout=1))
        assert status(env, stubborn).status.exit_code == 137
        # ...and timeout 0 kills at once.
        quick = container(env, pod_id, pod_cfg, "quick", ["sleep", "3600"])
        env.rt().StopContainer(pb.StopContainerRequest(container_id=quick, timeout=0))
        assert status(env, quick).status.exit_code == 137
        # Remove leaves no mount (the exit released it) and, in the background, deletes
        # the container's directory.
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=quick))
        assert not [m for m in _mounts_under(env.d.root) if quick in m]
        wait_for(lambda: not os.path.exists(os.path.join(env.d.root, "containers", quick)), 10,
                 "the removed container's directory to go")
        # Removing a running container stops it first.
        running = container(env, pod_id, pod_cfg, "running", ["sleep", "3600"])
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=running))
        with pytest.raises(grpc.RpcError) as err:
            status(env, running)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_exec_sync(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "sleeper", ["sleep", "3600"],
                        envs=[pb.KeyValue(key="GREETING", value=b"hi")])
        r = exec_sync(env, cid, ["sh", "-c", "echo $GREETING; echo oops >&2; exit 5"])
        assert (r.stdout, r.stderr, r.exit_code) == (b"hi\n", b"oops\n", 5)
        r = exec_sync(env, cid, ["cat", "/etc/hostname"])
        assert r.stdout.strip() == pod_cfg.hostname.encode()
        # The timed-out process is killed and reaped, not left a zombie for the pod's
        # init to reap some time later: only the container's own sleep remains. (A few
        # rounds: killing runc together with the process lost that reap only mostly.)
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as err:
                exec_sync(env, cid, ["sleep", "30"], timeout=1)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            r = exec_sync(env, cid, ["sh", "-c", "cat /proc/[0-9]*/comm | grep -cx sleep"])
            assert r.stdout.strip() == b"1"
        # Output beyond what fits in one 16 MiB reply is dropped; the process still runs
        # to its end and the reply is receivable by a kubelet-sized client.
        big = exec_sync(env, cid, ["sh", "-c", "head -c 20000000 /dev/zero; "
                                   "head -c 17000000 /dev/zero >&2; exit 2"], timeout=30)
        assert (len(big.stdout), len(big.stderr), big.exit_code) == (
            REPLY_BUDGET // 2, REPLY_BUDGET - REPLY_BUDGET // 2, 2)
        big = exec_sync(env, cid, ["sh", "-c", "head -c 20000000 /dev/zero; echo e >&2"],
                        timeout=30)
        assert (len(big.stdout), big.stderr) == (REPLY_BUDGET - 2, b"e\n")


def test_log_rotation_keeps_every_line_once(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "writer", [
            "sh", "-c", "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); "
            "sleep 0.01; done"])
        path = status(env, cid).status.log_path
        rotated = []
        for n in range(3):
            time.sleep(0.5)
            target = f"{path}.{n}"
            os.rename(path, target)  # what the kubelet does, then it asks for a reopen
            rotated.append(target)
            env.rt().ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
            # Synchronous: the new file is there when the call returns (critest checks it
            # at once).
            assert os.path.exists(path)
        wait_exited(env, cid)
        lines: list[str] = []
        for p in [*rotated, path]:
            lines += [text for _s, text in log_lines(p)]
        assert lines == [f"line-{i}" for i in range(300)]
        with pytest.raises(grpc.RpcError) as err:
            env.rt().ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_create_prepares_and_start_launches(env: Env) -> None:
    """CreateContainer prepares the bundle and rootfs only; conmon and `runc create` run at
    StartContainer (as containerd creates its task at start). A container that never
    started stops at once; one that cannot start is EXITED with reason StartError."""
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "later", ["sleep", "60"], start=False)
        assert status(env, cid).status.state == pb.CONTAINER_CREATED
        assert cid not in conmon_processes(env.d).values()
        assert cid not in runtime_containers(env.d)
        env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        st = status(env, cid).status
        assert st.state == pb.CONTAINER_RUNNING and st.started_at >= st.created_at
        assert cid in conmon_processes(env.d).values()
        assert runtime_containers(env.d)[cid] == "running"
        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
        # Exited: its runc container is deleted and its rootfs unmounted right away.
        assert cid not in runtime_containers(env.d)
        assert not [m for m in _mounts_under(env.d.root) if cid in m]
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
        wait_for(lambda: not os.path.exists(os.path.join(env.d.root, "containers", cid)), 10,
                 "the removed container's directory to go (in the background)")

        never = container(env, pod_id, pod_cfg, "never", ["sleep", "60"], start=False)
        env.rt().StopContainer(pb.StopContainerRequest(container_id=never, timeout=10))
        st = status(env, never).status
        assert st.state == pb.CONTAINER_EXITED and st.started_at == 0
        assert st.message == "stopped before it was started"
        assert not [m for m in _mounts_under(env.d.root) if never in m]
        with pytest.raises(grpc.RpcError) as err:
            env.rt().StartContainer(pb.StartContainerRequest(container_id=never), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        broken = container(env, pod_id, pod_cfg, "broken", ["/no/such/binary"], start=False)
        with pytest.raises(grpc.RpcError) as err:
            env.rt().StartContainer(pb.StartContainerRequest(container_id=broken), timeout=30)
        assert "/no/such/binary" in (err.value.details() or "")
        st = status(env, broken).status
        assert (st.state, st.reason, st.exit_code) == (pb.CONTAINER_EXITED, "StartError", 128)
        assert broken not in runtime_containers(env.d)
        assert broken not in conmon_processes(env.d).values()
        for c in (never, broken):
            env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=c))
            env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=c))  # idempotent
        assert not [m for m in _mounts_under(env.d.root) if pod_id not in m]


def test_runtime_handlers(env: Env) -> None:
    # "second" is a handler from the config: runc with its own state root.
    with pod(env, handler="second") as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "c", ["sleep", "60"])
        info = json.loads(status(env, cid, verbose=True).info["info"])
        assert info["runtimeHandler"] == "second"
        root = os.path.join(env.tmpdir, "second-root")
        assert info["runtimeOptions"]["root"] == root
        listed = subprocess.run(["runc", "--root", root, "list", "-q"], check=True,
                                capture_output=True, text=True).stdout.split()
        assert cid in listed
        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
        # Once it exited its runc container is deleted (as a shim deletes its task).
        listed = subprocess.run(["runc", "--root", root, "list", "-q"], check=True,
                                capture_output=True, text=True).stdout.split()
        assert cid not in listed
        cid = container(env, pod_id, pod_cfg, "c4", ["sh", "-c", "exit 4"])
        assert wait_exited(env, cid).exit_code == 4
    with pytest.raises(grpc.RpcError) as err:
        run_pod(env, handler="no-such-handler")
    assert "no-such-handler" in (err.value.details() or "")
    # crun: on a cgroup v1 hybrid host with controllers in its cgroup2 mount crun refuses
    # to run at all; the start-up probe knows, and the pod is refused naming the handler.
    # Elsewhere (cgroup v2: test_cgroup_v2 covers its cgroups there) it must work.
    if hybrid_v2_controllers():
        with pytest.raises(grpc.RpcError) as err:
            run_pod(env, handler="crun")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
        assert "runtime handler 'crun' cannot run on this host" in (
            err.value.details() or ""), err.value.details()
        return
    pod_id, pod_cfg = run_pod(env, handler="crun")
    try:
        cid = container(env, pod_id, pod_cfg, "c", ["sh", "-c", "exit 4"])
        assert wait_exited(env, cid).exit_code == 4
    finally:
        remove_pod(env, pod_id)


def test_containers_survive_daemon_restart(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        keep = container(env, pod_id, pod_cfg, "keep", ["sleep", "3600"])
        dies = container(env, pod_id, pod_cfg, "dies", ["sh", "-c", "sleep 2; exit 9"])
        env.d.kill9()
        time.sleep(3)  # "dies" exits while crishim is down
        env.d.start()
        assert status(env, keep).status.state == pb.CONTAINER_RUNNING
        assert exec_sync(env, keep, ["true"]).exit_code == 0
        st = status(env, dies).status
        assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 9, "Error")
        env.rt().StopContainer(pb.StopContainerRequest(container_id=keep, timeout=0))
        assert status(env, keep).status.state == pb.CONTAINER_EXITED


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def test_daemon_is_raised_but_what_it_starts_runs_at_nice_zero(env: Env) -> None:
    """daemon_nice (-10 in this module) is the daemon's own: conmon, the container's
    processes and an exec begin at nice 0, as under any other runtime."""
    assert env.d.proc is not None
    assert _nice(env.d.proc.pid) == -10
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "nice", ["sleep", "3600"])
        # Field 19 of /proc/<pid>/stat is the nice value: the container's init, then the exec.
        out = exec_sync(env, cid, ["cut", "-d", " ", "-f", "19", "/proc/1/stat",
                                   "/proc/self/stat"]).stdout.split()
        assert out == [b"0", b"0"]
        monitors = [pid for pid, c in conmon_processes(env.d).items() if c == cid]
        assert monitors and all(_nice(pid) == 0 for pid in monitors)
        assert "daemon CPU priority raised" in env.d.logs()
        default = priority.slice_of(os.getpid())
        if default:  # a kernel with a time slice per thread (6.12+): the loop's is short
            assert priority.slice_of(env.d.proc.pid) == priority.LOOP_SLICE_NS
            inits = [int(c) for m in monitors
                     for c in Path(f"/proc/{m}/task/{m}/children").read_text().split()]
            assert inits and all(priority.slice_of(pid) == default
                                 for pid in monitors + inits)


def test_host_port_reaches_httpd(env: Env) -> None:
    # A port free now, not a fixed one: a pod of the host's own runtime may hold that.
    host_port = free_port()
    ports = [pb.PortMapping(protocol=pb.TCP, container_port=80, host_port=host_port)]
    with pod(env, port_mappings=ports) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "web", [
            "sh", "-c", "mkdir -p /www && echo hello-from-pod > /www/index.html && "
            "exec httpd -f -p 80 -h /www"])
        deadline = time.monotonic() + 20
        body = b""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{host_port}/", timeout=2) as resp:
                    body = resp.read()
                break
            except OSError:
                time.sleep(0.2)
        assert body == b"hello-from-pod\n"
        env.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))


def test_tty_termination_message_and_target_pid_namespace(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        tty = container(env, pod_id, pod_cfg, "tty", ["sh", "-c", "tty; exit 0"], tty=True,
                        stdin=True, stdin_once=True)
        st = wait_exited(env, tty)
        with open(st.log_path) as fh:
            assert "/dev/pts/" in fh.read()
        term = container(env, pod_id, pod_cfg, "term", [
            "sh", "-c", "printf 'bye bye' > /dev/termination-log; exit 1"],
            annotations={"io.kubernetes.container.terminationMessagePath":
                         "/dev/termination-log"})
        st = wait_exited(env, term)
        assert (st.reason, st.message) == ("Error", "bye bye")
        # A debug container in the target container's pid namespace sees its processes.
        target = container(env, pod_id, pod_cfg, "target", [
            "sh", "-c", "exec sleep 3601"],
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                namespace_options=pb.NamespaceOption(pid=pb.CONTAINER))))
        debug = container(env, pod_id, pod_cfg, "debug", ["sleep", "3600"],
                          linux=pb.LinuxContainerConfig(
                              security_context=pb.LinuxContainerSecurityContext(
                                  namespace_options=pb.NamespaceOption(
                                      pid=pb.TARGET, target_id=target))))
        r = exec_sync(env, debug, ["ps", "-o", "pid,args"])
        rows = [line.split(None, 1) for line in r.stdout.decode().splitlines()[1:]]
        assert ["1", "sleep 3601"] in rows, r.stdout


def test_privileged_container(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        sc = pb.LinuxContainerSecurityContext(
            privileged=True,
            seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))
        cid = container(env, pod_id, pod_cfg, "priv", ["sleep", "3600"],
                        linux=pb.LinuxContainerConfig(security_context=sc))
        # No masking, all capabilities, no seccomp: mounting works, /proc/timer_list is real.
        r = exec_sync(env, cid, ["sh", "-c", "mkdir -p /mnt/t && mount -t tmpfs t /mnt/t && "
                                 "head -c 16 /proc/timer_list | wc -c"])
        assert (r.exit_code, r.stdout.strip()) == (0, b"16"), r.stderr
        # Host devices are there (every host has /dev/kmsg).
        assert exec_sync(env, cid, ["test", "-c", "/dev/kmsg"]).exit_code == 0
        # An unprivileged neighbour has neither.
        plain = container(env, pod_id, pod_cfg, "plain", ["sleep", "3600"])
        assert exec_sync(env, plain, ["test", "-c", "/dev/kmsg"]).exit_code != 0
        r = exec_sync(env, plain, ["sh", "-c", "echo 1 > /proc/sys/vm/overcommit_memory"])
        assert r.exit_code != 0 and b"Read-only file system" in r.stderr


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_device_rules_allow_the_standard_devices_only(env: Env, handler: str) -> None:
    """The spec denies every device and the OCI runtime allows its standard set, as with
    containerd: /dev/null, zero, full, random and urandom work, and mknod of anything
    does too, but a node made for another device cannot be opened."""
    if handler == "crun" and hybrid_v2_controllers():
        pytest.skip("crun cannot run on a cgroup v1 hybrid host (test_runtime_handlers)")
    with pod(env, handler=handler) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "devs", ["sleep", "3600"])
        r = exec_sync(env, cid, ["sh", "-c",
                                 "echo x > /dev/null && for d in zero random urandom full; "
                                 "do head -c 4 /dev/$d | wc -c; done"])
        assert (r.exit_code, r.stdout.split()) == (0, [b"4"] * 4), r.stderr
        for kind, major, minor in (("c", "1", "1"), ("b", "7", "0")):  # /dev/mem, loop0
            node = f"/tmp/{kind}{major}-{minor}"
            r = exec_sync(env, cid, ["sh", "-c", f"mknod {node} {kind} {major} {minor} && "
                                     f"head -c 1 {node}"])
            assert r.exit_code != 0 and b"Operation not permitted" in r.stderr, (kind, r)
            assert exec_sync(env, cid, ["test", "-e", node]).exit_code == 0  # mknod worked


def test_image_volume_read_only_sub_path_and_status(env: Env) -> None:
    image_id = env.d.images().ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=env.busybox)), timeout=10).image.id

    def vol(path: str, sub: str = "", readonly: bool = True) -> pb.Mount:
        return pb.Mount(container_path=path, readonly=readonly,
                        image=pb.ImageSpec(image=env.busybox), image_sub_path=sub)

    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "imgvol", ["sleep", "3600"],
                        mounts=[vol("/mnt/image"), vol("/mnt/etc", sub="etc")])
        # The image's files are there and executable...
        r = exec_sync(env, cid, ["/mnt/image/bin/busybox", "ls", "/mnt/image"])
        assert r.exit_code == 0 and b"bin" in r.stdout.split(), r.stderr
        # ...but not writable.
        r = exec_sync(env, cid, ["touch", "/mnt/image/new"])
        assert r.exit_code != 0 and b"Read-only file system" in r.stderr
        # image_sub_path mounts only that directory.
        r = exec_sync(env, cid, ["sh", "-c", "grep -c ^root: /mnt/etc/passwd; ls /mnt/etc/etc"])
        assert r.stdout.splitlines()[0] == b"1" and r.exit_code != 0
        # ContainerStatus names the image the volume was made from.
        mounts = {m.container_path: m for m in status(env, cid).status.mounts}
        assert mounts["/mnt/image"].image.image_ref == image_id
        assert mounts["/mnt/etc"].image_sub_path == "etc"
        # Bad requests are refused and leave no bundle or mount behind.
        bundles = os.path.join(env.d.root, "containers")
        before = (set(os.listdir(bundles)), _mounts_under(env.d.root))
        for mounts_, code in (([vol("/mnt/rw", readonly=False)], grpc.StatusCode.INVALID_ARGUMENT),
                              ([vol("/mnt/x", sub="no/such/dir")], grpc.StatusCode.NOT_FOUND)):
            with pytest.raises(grpc.RpcError) as err:
                container(env, pod_id, pod_cfg, "badvol", ["true"], mounts=mounts_)
            assert err.value.code() == code, err.value.details()
        # (Bundles of containers removed earlier may go meanwhile: their files are
        # deleted in the background.)
        assert set(os.listdir(bundles)) <= before[0]
        assert _mounts_under(env.d.root) == before[1]
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
        assert not [m for m in _mounts_under(env.d.root) if cid in m]


def test_recursive_read_only_mounts_announced_and_enforced(env: Env) -> None:
    rro = kernel_supports_rro()
    features = {h.name: h.features for h in env.rt().Status(
        pb.StatusRequest(), timeout=30).runtime_handlers}
    # runc >= 1.1 lists "rro" in `runc features`; crun 1.8 has no such command (and is
    # not announced where it cannot run: a cgroup v1 hybrid host).
    assert features["runc"].recursive_read_only_mounts == rro
    assert features[""].recursive_read_only_mounts == rro  # the default handler is runc
    assert ("crun" in features) != bool(hybrid_v2_controllers()), features
    assert "crun" not in features or not features["crun"].recursive_read_only_mounts
    if not rro:
        pytest.skip("kernel without mount_setattr (Linux < 5.12)")
    host = os.path.join(env.tmpdir, "rro-src")
    sub = os.path.join(host, "sub")
    os.makedirs(sub, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", sub], check=True)
    try:
        with pod(env) as (pod_id, pod_cfg):
            def mounted(name: str, recursive: bool) -> str:
                return container(env, pod_id, pod_cfg, name, ["sleep", "3600"], mounts=[
                    pb.Mount(container_path="/data", host_path=host, readonly=True,
                             recursive_read_only=recursive)])
            # A plain read-only bind leaves the submount writable; rro covers it too.
            r = exec_sync(env, mounted("ro", False), ["touch", "/data/sub/f"])
            assert r.exit_code == 0, r.stderr
            r = exec_sync(env, mounted("rro", True), ["touch", "/data/sub/g"])
            assert r.exit_code != 0 and b"Read-only file system" in r.stderr
    finally:
        subprocess.run(["umount", "-l", sub], check=False)


# What kubelet v1.32 sends for a Burstable container (200m, 64Mi): limit-0 hugepage
# entries for every page size, whether or not the host has a hugetlb controller.
KUBELET_RESOURCES = pb.LinuxContainerResources(
    cpu_period=100000, cpu_quota=20000, cpu_shares=204, memory_limit_in_bytes=64 << 20,
    memory_swap_limit_in_bytes=64 << 20, oom_score_adj=998,
    hugepage_limits=[pb.HugepageLimit(page_size="2MB"), pb.HugepageLimit(page_size="1GB")])


def _cgroup_file(env: Env, cid: str, v1: str, v2: str) -> str:
    out = env.rt().ExecSync(pb.ExecSyncRequest(
        container_id=cid, cmd=["sh", "-c", f"cat /sys/fs/cgroup/{v1} 2>/dev/null || "
                               f"cat /sys/fs/cgroup/{v2}"], timeout=10), timeout=20)
    assert out.exit_code == 0, out.stderr
    return out.stdout.decode().strip()


def test_kubelet_resources_run_whatever_controllers_the_host_has(env: Env) -> None:
    """A host without a hugetlb hierarchy (this one) still runs the kubelet's containers:
    the hugepage part is dropped, the rest is enforced, and Status says what is missing."""
    info = json.loads(env.rt().Status(pb.StatusRequest(verbose=True), timeout=15)
                      .info["cgroups"])
    assert info["missingPolicy"] == "drop"
    hugetlb_mounted = any(" - cgroup " in line and "hugetlb" in line.split()[-1]
                          for line in open("/proc/self/mountinfo"))
    if info["version"] == 1:
        assert ("hugetlb" in info["missing"]) is not hugetlb_mounted
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "kubeletish", ["sleep", "300"],
                        linux=pb.LinuxContainerConfig(resources=KUBELET_RESOURCES))
        assert status(env, cid).status.state == pb.CONTAINER_RUNNING
        assert int(_cgroup_file(env, cid, "memory/memory.limit_in_bytes",
                                "memory.max")) == 64 << 20
        assert _cgroup_file(env, cid, "cpu/cpu.cfs_quota_us", "cpu.max").split()[0] == "20000"
        # An update carrying the same hugepage entries is applied too.
        env.rt().UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=96 << 20, memory_swap_limit_in_bytes=96 << 20,
                hugepage_limits=KUBELET_RESOURCES.hugepage_limits)), timeout=30)
        assert int(_cgroup_file(env, cid, "memory/memory.limit_in_bytes",
                                "memory.max")) == 96 << 20
