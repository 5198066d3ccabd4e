"""Pod sandboxes end to end: real daemon, runc, catatonit and CNI bridge plugins.

The pause runs under runc alone (no conmon); its death is noticed through a pidfd."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import host_local_ips
from tests.e2e.daemon import Daemon
from tests.e2e.faults import conmon_processes
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


def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [line.split()[4] for line in fh if line.split()[4].startswith(path)]


@pytest.fixture(scope="module")
def pods() -> Iterator[tuple[Daemon, Env]]:
    with _daemon() as de:
        yield de


def test_pod_gets_ip_in_range_and_reports_status(pods: tuple[Daemon, Env]) -> None:
    d, env = pods
    rt = d.runtime()
    config = pod_config("web", labels={"app": "web"}, annotations={"a": "b"},
                        hostname="webhost", dns_config=pb.DNSConfig(
                            servers=["10.96.0.10"], searches=["e2e.svc.cluster.local"],
                            options=["ndots:5"]))
    sid = run_pod(rt, config)
    try:
        resp = status(rt, sid, verbose=True)
        st = resp.status
        assert st.id == sid and st.state == pb.SANDBOX_READY
        assert ipaddress.ip_address(st.network.ip) in ipaddress.ip_network(env.subnet)
        assert st.network.ip in host_local_ips(env.tmpdir)
        assert st.metadata.name == "web" and st.metadata.namespace == "e2e"
        assert dict(st.labels) == {"app": "web"} and dict(st.annotations) == {"a": "b"}
        assert st.runtime_handler == "runc"
        assert st.linux.namespaces.options.network == pb.POD
        assert st.created_at > 0
        info = json.loads(resp.info["info"])
        assert info["pid"] > 0 and info["netNamespacePath"].startswith(d.state)
        assert info["runtimeSpec"]["process"]["args"] == ["/catatonit", "-P"]
        # The pause joined the pinned netns: its netns is the pin's.
        assert os.stat(f"/proc/{info['pid']}/ns/net").st_ino == \
            os.stat(info["netNamespacePath"]).st_ino
        # oom_score_adj asked for -998 but clamped to what the daemon may set.
        with open(f"/proc/{info['pid']}/oom_score_adj") as fh:
            assert int(fh.read()) == info["runtimeSpec"]["process"]["oomScoreAdj"]
        # Pod files for the containers: DNS from dns_config, hostname, hosts with our IP.
        sandbox_dir = info["sandboxDir"]
        with open(os.path.join(sandbox_dir, "resolv.conf")) as fh:
            resolv = fh.read()
        assert "nameserver 10.96.0.10" in resolv
        assert "search e2e.svc.cluster.local" in resolv and "options ndots:5" in resolv
        with open(os.path.join(sandbox_dir, "hostname")) as fh:
            assert fh.read() == "webhost\n"
        with open(os.path.join(sandbox_dir, "hosts")) as fh:
            assert f"{st.network.ip}\twebhost" in fh.read()
        uts = sh("nsenter", "-t", str(info["pid"]), "-u", "hostname")
        assert uts.stdout.strip() == "webhost"
        # ListPodSandbox filters: id prefix, state, labels.
        listed = rt.ListPodSandbox(pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(
            id=sid[:12], label_selector={"app": "web"},
            state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY)))).items
        assert [p.id for p in listed] == [sid]
        none = rt.ListPodSandbox(pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(
            label_selector={"app": "other"}))).items
        assert list(none) == []
    finally:
        remove_pod(rt, sid)


def test_duplicate_name_is_already_exists(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()
    sid = run_pod(rt, pod_config("dup", host_network=True))
    try:
        with pytest.raises(grpc.RpcError) as err:
            run_pod(rt, pod_config("dup", host_network=True))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert sid in (err.value.details() or "")
    finally:
        remove_pod(rt, sid)
    # Once removed, the name is free again.
    remove_pod(rt, run_pod(rt, pod_config("dup", host_network=True)))


@pytest.mark.parametrize("meta", [
    None,
    pb.PodSandboxMetadata(name="x", namespace="e2e"),
    pb.PodSandboxMetadata(uid="u", namespace="e2e"),
    pb.PodSandboxMetadata(name="x", uid="u"),
])
def test_missing_metadata_is_invalid_argument(pods: tuple[Daemon, Env],
                                              meta: pb.PodSandboxMetadata | None) -> None:
    d, _ = pods
    config = pb.PodSandboxConfig()
    if meta is not None:
        config.metadata.CopyFrom(meta)
    with pytest.raises(grpc.RpcError) as err:
        run_pod(d.runtime(), config)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "required" in (err.value.details() or "")


def test_unknown_runtime_handler_is_invalid_argument(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    with pytest.raises(grpc.RpcError) as err:
        d.runtime().RunPodSandbox(pb.RunPodSandboxRequest(
            config=pod_config("h", host_network=True), runtime_handler="kata"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kata" in (err.value.details() or "")


def test_sysctls_namespaced_applied_node_wide_rejected(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()
    bad = pod_config("sysbad")
    bad.linux.sysctls["vm.swappiness"] = "10"
    with pytest.raises(grpc.RpcError) as err:
        run_pod(rt, bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "vm.swappiness" in (err.value.details() or "")

    good = pod_config("sysgood")
    good.linux.sysctls["net.ipv4.ip_unprivileged_port_start"] = "81"
    good.linux.sysctls["kernel.shm_rmid_forced"] = "1"
    sid = run_pod(rt, good)
    try:
        pid = json.loads(status(rt, sid, verbose=True).info["info"])["pid"]
        net = sh("nsenter", "-t", str(pid), "-n", "cat",
                 "/proc/sys/net/ipv4/ip_unprivileged_port_start")
        assert net.stdout.strip() == "81", net.stderr
        ipc = sh("nsenter", "-t", str(pid), "-i", "cat", "/proc/sys/kernel/shm_rmid_forced")
        assert ipc.stdout.strip() == "1", ipc.stderr
    finally:
        remove_pod(rt, sid)
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as fh:
        assert fh.read().strip() != "81"  # the node's value was not touched


def test_host_network_pod_shares_host_network(pods: tuple[Daemon, Env]) -> None:
    d, env = pods
    rt = d.runtime()
    before = host_local_ips(env.tmpdir)
    sid = run_pod(rt, pod_config("hostnet", host_network=True))
    try:
        resp = status(rt, sid, verbose=True)
        info = json.loads(resp.info["info"])
        assert resp.status.network.ip == "" and info["netNamespacePath"] == ""
        assert os.stat(f"/proc/{info['pid']}/ns/net").st_ino == \
            os.stat("/proc/self/ns/net").st_ino
        links = sh("nsenter", "-t", str(info["pid"]), "-n", "ip", "-o", "link", "show")
        assert links.stdout == sh("ip", "-o", "link", "show").stdout
        assert host_local_ips(env.tmpdir) == before  # no CNI for host-network pods
        assert resp.status.linux.namespaces.options.network == pb.NODE
    finally:
        remove_pod(rt, sid)


def test_two_pods_ping_each_other(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()
    a = run_pod(rt, pod_config("ping-a"))
    b = run_pod(rt, pod_config("ping-b"))
    try:
        netns_a = json.loads(status(rt, a, verbose=True).info["info"])["netNamespacePath"]
        ip_b = status(rt, b).status.network.ip
        ping = sh("nsenter", f"--net={netns_a}", "busybox", "ping", "-c", "1", "-W", "5", ip_b)
        assert ping.returncode == 0, ping.stdout + ping.stderr
    finally:
        remove_pod(rt, a)
        remove_pod(rt, b)


def test_stop_and_remove_are_idempotent_and_leave_nothing(pods: tuple[Daemon, Env]) -> None:
    d, env = pods
    rt = d.runtime()
    sid = run_pod(rt, pod_config("gone"))
    info = json.loads(status(rt, sid, verbose=True).info["info"])
    ip = status(rt, sid).status.network.ip
    assert ip in host_local_ips(env.tmpdir)
    for _ in range(2):
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    assert status(rt, sid).status.state == pb.SANDBOX_NOTREADY
    assert ip not in host_local_ips(env.tmpdir)  # CNI DEL at stop
    assert not os.path.lexists(info["netNamespacePath"])
    for _ in range(2):
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    # Unknown ids: stop and remove succeed (CRI), status is NOT_FOUND.
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id="0" * 64))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id="0" * 64))
    with pytest.raises(grpc.RpcError) as err:
        status(rt, sid)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert sid not in sh("runc", "--root", os.path.join(d.state, "runc"), "list").stdout
    assert not any(sid in m for m in _mounts_under(d.workdir))
    assert not os.path.exists(info["sandboxDir"])
    assert sid not in conmon_processes(d).values()
    assert pause_gone(info["pid"]), "pause process still alive"


def test_pause_has_no_conmon_and_its_death_is_noticed_at_once(
        pods: tuple[Daemon, Env]) -> None:
    d, env = pods
    rt = d.runtime()
    sid = run_pod(rt, pod_config("nomon"))
    ip = status(rt, sid).status.network.ip
    try:
        info = json.loads(status(rt, sid, verbose=True).info["info"])
        pid = info["pid"]
        assert "conmonPid" not in info
        assert sid not in conmon_processes(d).values()
        # `runc start` returns once the init was told to go; its exec of the pause may
        # still be under way, so the pid shows runc's init for a moment.
        argv0 = b""
        for _ in range(200):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0")[0]
            if argv0 == b"/catatonit":
                break
            time.sleep(0.01)
        assert argv0 == b"/catatonit"
        # No monitor in between: the pause's parent is not conmon (init, once `runc
        # create` exited).
        with open(f"/proc/{pid}/stat") as fh:
            ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/comm") as fh:
            assert fh.read().strip() != "conmon"
        assert status(rt, sid).status.state == pb.SANDBOX_READY
        os.kill(pid, 9)
        t0 = time.monotonic()
        while status(rt, sid).status.state != pb.SANDBOX_NOTREADY:
            assert time.monotonic() - t0 < 1.0, "NOTREADY not reported within 1 s"
            time.sleep(0.02)
        assert pause_gone(pid)
        runc_root = os.path.join(d.state, "runc")
        state = json.loads(sh("runc", "--root", runc_root, "state", sid).stdout)
        assert state["status"] == "stopped"
    finally:
        remove_pod(rt, sid)
    assert sid not in sh("runc", "--root", os.path.join(d.state, "runc"), "list").stdout
    assert os.listdir(os.path.join(d.state, "netns")) == []
    assert ip not in host_local_ips(env.tmpdir)
    assert not os.path.exists(os.path.join(d.state, "conmon", sid))


@pytest.mark.parametrize("step", ["sandbox-after-netns", "sandbox-after-cni-add",
                                  "sandbox-before-pause-start", "sandbox-before-ready"])
def test_crash_mid_run_is_rolled_back_at_restart(step: str) -> None:
    with _daemon() as (d, env):
        d.stop()
        os.environ["CRISHIM_TEST_CRASH_AT"] = step
        try:
            d.start()
            with pytest.raises(grpc.RpcError):
                run_pod(d.runtime(), pod_config("crashy"))
            assert d.proc is not None and d.proc.wait(10) == 137
        finally:
            del os.environ["CRISHIM_TEST_CRASH_AT"]
        if step != "sandbox-after-netns":
            assert host_local_ips(env.tmpdir), "the crash should have left an IP allocated"
        d.start()  # reconcile rolls the half sandbox back before serving
        rt = d.runtime()
        assert list(rt.ListPodSandbox(pb.ListPodSandboxRequest()).items) == []
        assert host_local_ips(env.tmpdir) == []
        assert os.listdir(os.path.join(d.state, "netns")) == []
        runc_root = os.path.join(d.state, "runc")
        listed = sh("runc", "--root", runc_root, "list", "-q").stdout.split()
        assert listed == []
        assert conmon_processes(d) == {}
        assert [m for m in _mounts_under(d.workdir) if "/sandboxes/" in m] == []
        # The name was not left reserved.
        remove_pod(rt, run_pod(rt, pod_config("crashy")))


def test_lifecycle_events_for_the_sandbox(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()
    stream = rt.GetContainerEvents(pb.GetEventsRequest())
    seen: list[pb.ContainerEventResponse] = []

    def collect() -> None:
        with contextlib.suppress(grpc.RpcError):
            for ev in stream:
                seen.append(ev)

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()

    def wait_for(pred: Any) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(pred(e) for e in list(seen)):
            time.sleep(0.05)

    try:
        # A probe pod until its event arrives: then the subscription is surely live.
        probe = ""
        for i in range(20):
            probe = run_pod(rt, pod_config(f"probe{i}", host_network=True))
            wait_for(lambda e, p=probe: e.container_id == p)
            remove_pod(rt, probe)
            if any(e.container_id == probe for e in seen):
                break
        sid = run_pod(rt, pod_config("events", host_network=True))
        remove_pod(rt, sid)
        wait_for(lambda e: e.container_id == sid
                 and e.container_event_type == pb.CONTAINER_DELETED_EVENT)
        mine = [e for e in seen if e.container_id == sid]
        assert [e.container_event_type for e in mine] == [
            pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
            pb.CONTAINER_STOPPED_EVENT, pb.CONTAINER_DELETED_EVENT]
        assert mine[1].pod_sandbox_status.id == sid
        assert mine[1].pod_sandbox_status.state == pb.SANDBOX_READY
        assert mine[2].pod_sandbox_status.state == pb.SANDBOX_NOTREADY
    finally:
        stream.cancel()
        thread.join(5)
        assert not thread.is_alive(), "the event stream did not end after its cancel"


def test_concurrent_runs_and_removes(pods: tuple[Daemon, Env]) -> None:
    d, env = pods
    rt = d.runtime()
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda i: run_pod(rt, pod_config(f"conc{i}")), range(4)))
        try:
            ips = [status(rt, sid).status.network.ip for sid in ids]
            assert len(set(ips)) == 4
            assert all(status(rt, sid).status.state == pb.SANDBOX_READY for sid in ids)
        finally:
            list(pool.map(lambda sid: remove_pod(rt, sid), ids))
    assert not set(ips) & set(host_local_ips(env.tmpdir))
    assert os.listdir(os.path.join(d.state, "netns")) == []


def test_same_name_raced_twice_gives_one_pod(pods: tuple[Daemon, Env]) -> None:
    d, _ = pods
    rt = d.runtime()

    def attempt(_: int) -> str | grpc.StatusCode:
        try:
            return run_pod(rt, pod_config("race", host_network=True))
        except grpc.RpcError as exc:
            return exc.code()

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(attempt, range(3)))
    ids = [r for r in results if isinstance(r, str)]
    try:
        assert len(ids) == 1
        assert sorted(str(r) for r in results if not isinstance(r, str)) == \
            [str(grpc.StatusCode.ALREADY_EXISTS)] * 2
    finally:
        for sid in ids:
            remove_pod(rt, sid)
