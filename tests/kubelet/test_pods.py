"""Pods as a kubelet runs them: init containers, probes, limits, restarts, host network,
host ports, security contexts, logs (and their rotation), stats, and crishim or the
kubelet restarting underneath running pods."""

from __future__ import annotations

import glob
import json
import socket
import time
import urllib.request
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.kubelet.node import Pod, statuses, wait_for
from tests.kubelet.nodeenv import Node, ctr, pod
from tests.kubelet.streams import kubelet_exec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _restarts(p: Pod) -> dict[str, int]:
    return {n: s.get("restartCount", 0) for n, s in statuses(p).items()}


def _ids(p: Pod) -> dict[str, str]:
    return {n: s.get("containerID", "") for n, s in statuses(p).items()}


def test_init_containers_probes_and_limits(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("web", pod("web", initContainers=[
        ctr(node, "init", "echo hello-from-init > /data/msg",
            volumeMounts=[{"name": "data", "mountPath": "/data"}])], containers=[
        ctr(node, "http", "cat /data/msg; exec httpd -f -p 8080 -h /data",
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
            resources={"limits": {"cpu": "200m", "memory": "64Mi"}},
            readinessProbe={"httpGet": {"path": "/msg", "port": 8080}, "periodSeconds": 1},
            livenessProbe={"exec": {"command": ["cat", "/data/msg"]}, "periodSeconds": 1}),
        ctr(node, "tcp", "exec nc -ll -p 9090 -e echo hi",
            readinessProbe={"tcpSocket": {"port": 9090}, "periodSeconds": 1}),
    ], volumes=[{"name": "data", "emptyDir": {}}]))
    p = k.wait_ready("web", 90)
    st = statuses(p)
    assert st["init"]["state"]["terminated"]["exitCode"] == 0
    assert set(st) == {"init", "http", "tcp"}
    # The later container read what the init container wrote into the emptyDir.
    logs = k.get(f"/containerLogs{k.pod_path('web', 'http')}").decode()
    assert "hello-from-init" in logs
    # The limits are in the container's own cgroup files (v1 or v2 names).
    mem = kubelet_exec(k, "web", "http", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
                       "2>/dev/null || cat /sys/fs/cgroup/memory.max")
    assert int(mem.stdout) == 64 << 20, mem
    cpu = kubelet_exec(k, "web", "http", "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us "
                       "2>/dev/null || cat /sys/fs/cgroup/cpu.max")
    assert cpu.stdout.split()[0] == b"20000", cpu
    # Probes keep passing: nothing restarts.
    time.sleep(3)
    assert _restarts(k.wait_ready("web", 10)) == {"init": 0, "http": 0, "tcp": 0}
    k.remove_manifest("web")


def test_restart_always_backs_off_with_last_exit_code(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("crashy", pod("crashy", [ctr(node, "c", "echo run; exit 3")]))

    def backing_off(p: Pod) -> bool:
        c = statuses(p).get("c", {})
        return (c.get("restartCount", 0) >= 2
                and c.get("lastState", {}).get("terminated", {}).get("exitCode") == 3
                and c.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff")
    p = k.wait_pod("crashy", backing_off, 90, "CrashLoopBackOff after exit 3")
    assert statuses(p)["c"]["lastState"]["terminated"]["reason"] == "Error"
    # One sandbox for all attempts: a restart is a new container, not a new pod.
    assert len(node.sandboxes("crashy")) == 1
    k.remove_manifest("crashy")


def test_host_network_and_host_port(node: Node) -> None:
    k = node.kubelet
    host_net, host_port = _free_port(), _free_port()
    k.write_manifest("hostnet", pod("hostnet", [ctr(
        node, "srv", f"mkdir -p /w && echo on-host-net > /w/i && exec httpd -f -p {host_net} "
        "-h /w", readinessProbe={"httpGet": {"path": "/i", "port": host_net},
                                 "periodSeconds": 1})], hostNetwork=True))
    k.write_manifest("hostport", pod("hostport", [ctr(
        node, "srv", "mkdir -p /w && echo via-host-port > /w/i && exec httpd -f -p 8080 -h /w",
        ports=[{"containerPort": 8080, "hostPort": host_port, "protocol": "TCP"}],
        readinessProbe={"httpGet": {"path": "/i", "port": 8080}, "periodSeconds": 1})]))
    k.wait_ready("hostnet", 60)
    k.wait_ready("hostport", 60)

    def fetch(port: int) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/i", timeout=2) as resp:
            body: bytes = resp.read()
            return body
    assert wait_for(lambda: fetch(host_net), 20, "host-network httpd") == b"on-host-net\n"
    assert wait_for(lambda: fetch(host_port), 20, "hostPort httpd") == b"via-host-port\n"
    k.remove_manifest("hostnet")
    k.remove_manifest("hostport")


def test_security_context(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("secure", pod("secure", [ctr(
        node, "c", "exec sleep 3600", securityContext={
            "runAsUser": 1000, "runAsGroup": 1000, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}})]))
    k.wait_ready("secure", 60)
    assert kubelet_exec(k, "secure", "c", "id -u; id -g").stdout.split() == [b"1000", b"1000"]
    ro = kubelet_exec(k, "secure", "c", "touch /x 2>&1; echo rc=$?")
    assert b"Read-only file system" in ro.stdout and b"rc=1" in ro.stdout, ro
    caps = kubelet_exec(k, "secure", "c", "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    lines = caps.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith(b"0000000000000000") for line in lines), caps
    nnp = kubelet_exec(k, "secure", "c", "grep NoNewPrivs /proc/self/status")
    assert nnp.stdout.split()[-1] == b"1", nnp
    k.remove_manifest("secure")


def test_logs_survive_rotation(node: Node) -> None:
    """The kubelet rotates at containerLogMaxSize (20Ki here) and asks crishim to reopen
    the log (ReopenContainerLog); /containerLogs keeps showing new lines."""
    k = node.kubelet
    k.write_manifest("chatty", pod("chatty", [ctr(
        node, "c", "i=0; while true; do echo line-$i-" + "x" * 100 + "; i=$((i+1)); "
        "sleep 0.01; done")]))
    p = k.wait_ready("chatty", 60)
    uid = p["metadata"]["uid"]

    def rotated() -> list[str]:
        return glob.glob(f"/var/log/pods/default_chatty-*_{uid}/c/0.log.*")
    wait_for(rotated, 60, "a rotated log file")

    def last_line() -> int:
        """The newest line's number; 0 (wait_for tries again) while the log just
        reopened has no line yet."""
        tail = k.get(f"/containerLogs{k.pod_path('chatty', 'c')}?tailLines=1").decode()
        parts = tail.split("-")
        return int(parts[1]) if len(parts) > 1 else 0
    first = wait_for(last_line, 10, "a log line")
    wait_for(lambda: last_line() > first + 20, 20, "new lines after rotation")
    k.remove_manifest("chatty")


def test_stats_summary(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("stats", pod("stats", [ctr(
        node, "c", "dd if=/dev/zero of=/big bs=1M count=4 2>/dev/null; echo started; "
        "while true; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 0.1; done")]))
    k.wait_ready("stats", 60)

    def pod_stats() -> dict[str, Any] | None:
        summary = json.loads(k.get("/stats/summary"))
        for ps in summary.get("pods", []):
            if ps["podRef"]["name"].startswith("stats-"):
                c = ps.get("containers", [{}])[0]
                if c.get("cpu", {}).get("usageNanoCores") and ps.get("network"):
                    found: dict[str, Any] = ps
                    return found
        return None
    ps = wait_for(pod_stats, 60, "/stats/summary with cpu and network for the pod")
    c = ps["containers"][0]
    assert c["name"] == "c"
    assert c["memory"]["workingSetBytes"] > 0
    assert c["rootfs"]["usedBytes"] >= 4 << 20  # the 4 MiB it wrote
    assert c["logs"]["usedBytes"] > 0
    iface = ps["network"].get("interfaces") or [ps["network"]]
    assert any("rxBytes" in i for i in iface), ps["network"]
    assert ps["process_stats"]["process_count"] >= 1
    # /metrics/cadvisor: with PodAndContainerStatsFromCRI the kubelet builds it from
    # crishim's metric descriptors and pod metrics; dashboards select by these labels.
    metrics = k.get("/metrics/cadvisor").decode().splitlines()
    pod_name = ps["podRef"]["name"]
    for family, container in (("container_memory_working_set_bytes", "c"),
                              ("container_cpu_usage_seconds_total", "c"),
                              ("container_network_receive_bytes_total", "POD")):
        labelled = [m for m in metrics if m.startswith(family + "{")
                    and f'container="{container}"' in m and f'pod="{pod_name}"' in m
                    and 'namespace="default"' in m]
        assert labelled, (family, [m for m in metrics if m.startswith(family)])
    k.remove_manifest("stats")


def test_crishim_restart_under_a_running_kubelet(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("steady", pod("steady", [ctr(node, "a", "exec sleep 3600"),
                                              ctr(node, "b", "exec sleep 3600")]))
    before = k.wait_ready("steady", 60)
    node.crishim.stop()
    node.crishim.start()
    time.sleep(6)  # several kubelet relists and syncs against the restarted runtime
    after = k.wait_ready("steady", 30)
    assert _ids(after) == _ids(before)
    assert _restarts(after) == {"a": 0, "b": 0}
    assert len(node.sandboxes("steady")) == 1
    k.remove_manifest("steady")


def test_kubelet_restart_adopts_running_pods(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("adopted", pod("adopted", [ctr(node, "a", "exec sleep 3600")]))
    before = k.wait_ready("adopted", 60)
    k.stop()
    k.start()
    after = k.wait_ready("adopted", 60)
    time.sleep(4)
    after = k.wait_ready("adopted", 10)
    assert _ids(after) == _ids(before)
    assert _restarts(after) == {"a": 0}
    assert len(node.sandboxes("adopted")) == 1
    k.remove_manifest("adopted")


def test_removed_manifests_remove_every_container_and_sandbox(node: Node) -> None:
    """Every pod of this module is gone from crishim once its manifest is: containers
    stopped and removed, sandboxes stopped and removed (the kubelet's GC does the
    removal, about once a minute)."""
    k = node.kubelet
    k.write_manifest("gone", pod("gone", [ctr(node, "a", "exec sleep 3600")]))
    k.wait_ready("gone", 60)
    k.remove_manifest("gone")
    wait_for(lambda: k.pod("gone") is None, 30, "the kubelet dropping the pod")
    wait_for(lambda: not [s for s in node.sandboxes("gone") if s.state == pb.SANDBOX_READY]
             and not [c for c in node.containers("gone")
                      if c.state == pb.CONTAINER_RUNNING], 30, "pod stopped")

    def nothing_left() -> bool:
        items = node.rt().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
        ctrs = node.rt().ListContainers(pb.ListContainersRequest(), timeout=10).containers
        return not items and not ctrs and not k.pods()
    for name in ("web", "crashy", "hostnet", "hostport", "secure", "chatty", "stats",
                 "steady", "adopted"):
        k.remove_manifest(name)
    wait_for(nothing_left, 150, "every sandbox and container removed", every=1)


def test_host_users_false(node: Node) -> None:
    """`hostUsers: false`: the kubelet gives the pod a 65536-wide range, crishim runs it in
    its own user namespace, root inside owns the image's files, an emptyDir is writable."""
    k = node.kubelet
    if k.version.startswith("1.32"):
        pytest.skip("kubelet 1.32: its UserNamespacesSupport gate is off by default (on "
                    "from 1.33)")
    k.write_manifest("userns", pod("userns", [ctr(
        node, "c", "exec sleep 3600", volumeMounts=[{"name": "scratch", "mountPath": "/s"}])],
        hostUsers=False, volumes=[{"name": "scratch", "emptyDir": {}}]))
    k.wait_ready("userns", 60)
    out = kubelet_exec(k, "userns", "c", "id -u; cat /proc/self/uid_map; stat -c %u /bin; "
                       "echo x > /s/f && echo x > /f && echo wrote").stdout.split()
    assert out[0] == b"0" and out[1] == b"0", out
    assert int(out[2]) >= 65536 and int(out[3]) == 65536, out  # the kubelet's range
    assert out[4] == b"0" and out[5] == b"wrote", out
    k.remove_manifest("userns")
    wait_for(lambda: not node.sandboxes("userns"), 60, "userns pod removed")
