"""Restart without losing a pod: SIGKILL or SIGTERM the daemon under running pods.

While the daemon is down the containers keep running under conmon; one of them exits
(code 5) in that window. After the restart every pod is READY, every other container is
RUNNING and can still be exec'd into and stopped, the one that exited is EXITED with its
code and a finished_at inside the downtime, and the counter containers' logs (one line per
100 ms, written by conmon while the daemon was away) hold every number exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.faults import DurabilityEnv, netns_pins, wait_for

_TAG = 50 + os.getpid() % 50

COUNTER = ["sh", "-c", "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done"]
SLEEPER = ["sleep", "3600"]
# Exits 5 once the test creates /go (through the container's rootfs on the host).
WAIT_GO = ["sh", "-c", "while [ ! -e /go ]; do sleep 0.05; done; exit 5"]


def counter_values(path: str) -> list[int]:
    """The stdout numbers of a CRI log file, in order (partial lines joined)."""
    values: list[int] = []
    partial = ""
    with open(path) as fh:
        for line in fh:
            _ts, stream, tag, text = line.rstrip("\n").split(" ", 3)
            assert stream == "stdout", line
            partial += text
            if tag == "F":
                values.append(int(partial))
                partial = ""
    return values


def assert_every_number_once(path: str, at_least: int, rotated: list[str]) -> None:
    values = [v for p in [*rotated, path] for v in counter_values(p)]
    assert values == list(range(len(values))), \
        f"{path}: lost or repeated lines: {[v for i, v in enumerate(values) if v != i][:10]}"
    assert len(values) >= at_least, f"{path}: only {len(values)} lines"
    if rotated:
        assert counter_values(path), "nothing written after the reopen"


def pod_ip(e: DurabilityEnv, pod_id: str) -> str:
    st = e.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id),
                                 timeout=10).status
    assert st.network.ip, f"pod {pod_id} has no IP"
    return str(st.network.ip)


def restart_scenario(e: DurabilityEnv, pods: int, sig: signal.Signals) -> None:
    rt = e.rt
    made: list[tuple[str, str, str]] = []  # (pod, counter, other)
    for i in range(pods):
        pod_id, cfg = e.run_pod(f"restart{sig.name.lower()}{i}")
        counter = e.container(pod_id, cfg, "counter", COUNTER)
        other = e.container(pod_id, cfg, "other", WAIT_GO if i == 0 else SLEEPER)
        made.append((pod_id, counter, other))
    dying = made[0][2]
    ips = {pod_id: pod_ip(e, pod_id) for pod_id, _c, _o in made}
    time.sleep(1.0)  # some lines before the restart

    down_at = time.time_ns()
    if sig == signal.SIGKILL:
        e.d.kill9()
    else:
        assert e.d.stop(sig) == 0, e.d.logs()
    # While the daemon is down: the containers run on; make one exit with code 5.
    states = e.scan().runtime
    assert states and all(s == "running" for s in states.values()), states
    with open(os.path.join(e.d.root, "containers", dying, "rootfs", "go"), "w"):
        pass
    wait_for(lambda: os.path.exists(os.path.join(e.d.state, "exits", dying)), 20,
             "the exit file of the container that exits while the daemon is down")
    time.sleep(1.0)  # more lines written by conmon alone
    up_at = time.time_ns()
    e.restart()

    pods_listed = e.pods_listed()
    for pod_id, counter, other in made:
        assert pods_listed[pod_id].state == pb.SANDBOX_READY, pod_id
        assert e.container_status(counter).state == pb.CONTAINER_RUNNING
        if other != dying:
            assert e.container_status(other).state == pb.CONTAINER_RUNNING
    # The pods kept their network: same IP, still reachable from the host.
    for pod_id, ip in ips.items():
        assert pod_ip(e, pod_id) == ip
        ping = subprocess.run(["busybox", "ping", "-c", "1", "-W", "5", ip], capture_output=True)
        assert ping.returncode == 0, f"pod {pod_id} at {ip} unreachable after restart"
    st = e.container_status(dying)
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 5, "Error")
    assert down_at < st.finished_at < up_at, (down_at, st.finished_at, up_at)
    assert st.started_at < down_at
    e.assert_consistent()

    # Re-adopted: exec works, and stop really stops (the exit is noticed after restart).
    _pod, counter0, _ = made[0]
    r = rt().ExecSync(pb.ExecSyncRequest(container_id=counter0, cmd=["echo", "hi"],
                                         timeout=10), timeout=20)
    assert (r.exit_code, r.stdout) == (0, b"hi\n")
    # Log rotation still reaches the re-adopted conmon.
    log0 = e.container_status(counter0).log_path
    time.sleep(0.3)
    os.rename(log0, log0 + ".1")
    rt().ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=counter0), timeout=10)
    time.sleep(0.5)
    for _pod, counter, _other in made:
        rt().StopContainer(pb.StopContainerRequest(container_id=counter, timeout=5),
                           timeout=30)
        st = e.container_status(counter)
        assert st.state == pb.CONTAINER_EXITED and st.finished_at > up_at
        # ~1 s before, >= 1 s down, 0.5 s after, at 10 lines/s: allow for a slow machine.
        assert_every_number_once(st.log_path, at_least=15, rotated=(
            [st.log_path + ".1"] if counter == counter0 else []))
    e.remove_all()
    e.assert_nothing_left()


@pytest.mark.parametrize("pods", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_sigkill_restart_keeps_pods_and_logs(denv: DurabilityEnv, pods: int) -> None:
    restart_scenario(denv, pods, signal.SIGKILL)


def test_sigterm_drains_leaves_containers_and_readopts(denv: DurabilityEnv) -> None:
    restart_scenario(denv, 1, signal.SIGTERM)


def test_sigterm_during_run_pod_drains_it(denv: DurabilityEnv) -> None:
    """A RunPodSandbox in flight when SIGTERM arrives completes (the server drains it):
    the caller gets the pod id and the pod is READY after the restart."""
    e = denv
    cfg = e.pod_config("sigterm-inflight")
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(e.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                                timeout=60).pod_sandbox_id)
        except grpc.RpcError as exc:
            outcome.append(exc)

    before = set(netns_pins(e.d))
    t = threading.Thread(target=run)
    t.start()
    # In flight for sure: the pod's netns is pinned (after its intent, before CNI ADD).
    wait_for(lambda: set(netns_pins(e.d)) - before, 30, "RunPodSandbox to pin a netns")
    assert e.d.stop(signal.SIGTERM) == 0, e.d.logs()
    t.join(60)
    assert not t.is_alive(), "RunPodSandbox did not return within 60s of SIGTERM"
    assert outcome and isinstance(outcome[0], str), \
        f"an in-flight RunPodSandbox was not drained: {outcome}\n{e.d.logs()[-3000:]}"
    e.restart()
    mine = [p for p in e.pods_listed().values() if p.metadata.name == cfg.metadata.name]
    assert [p.id for p in mine] == [outcome[0]]
    assert mine[0].state == pb.SANDBOX_READY
    e.assert_consistent()
    e.remove_all()
    e.assert_nothing_left()
