"""The kubelet's view of speed: one static pod on a stock kubelet, per runtime.

A round writes a pod manifest into the kubelet's static-pod dir and polls the kubelet's
read-only `/pods` until the pod is Running with every container Ready; the time from the
manifest's rename to that poll is the sample. So it includes, as on a real node, the
kubelet's own work and periods: noticing the file (inotify, fileCheckFrequency 1 s), the
pod worker's RunPodSandbox / CreateContainer / StartContainer calls, PLEG's 1 s relist
that reports the containers running, the readiness probes (periodSeconds 1; one httpGet,
one exec through the runtime) and the status manager. The kubelet (tests/kubelet/node.py)
is restarted on a fresh root for each block of rounds, since it talks to one endpoint;
blocks alternate between runtimes (A B C A B C) so drifting machine load hits each alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from hack.benchlib.hostclean import unmount_under
from hack.benchlib.report import Results, Row
from hack.benchlib.stats import p50, p90, summary
from tests.kubelet.node import LOCK, NODE, Kubelet, all_ready, missing_reason

Progress = Callable[[str], None]
POLL = 0.05  # /pods poll period: well under the kubelet's 1 s probe and relist periods
READY_TIMEOUT = 120.0
GONE_TIMEOUT = 60.0
# Stock settings, except what a bench needs: no image GC (the disk may be fuller than its
# 85 % threshold; a re-pull would be measured) and logs not rotated by the tests' sizes.
KUBELET_CONFIG: dict[str, Any] = {
    "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
    "containerLogMaxSize": "10Mi", "containerLogMaxFiles": 5,
    "containerLogMonitorInterval": "10s",
}


def bench_pod(name: str, image: str) -> dict[str, Any]:
    """Two containers, each with cpu/memory limits (Guaranteed QoS) and a 1 s readiness
    probe: an httpGet one (the kubelet dials the pod IP) and an exec one (ExecSync through
    the runtime). Both probe a file the runtime mounts (/etc/hostname), so neither waits on
    the workload writing one first. Both shells exit on SIGTERM, so teardown does not wait
    out the grace period."""
    limits = {"limits": {"cpu": "100m", "memory": "32Mi"}}

    def ctr(cname: str, script: str, probe: dict[str, Any]) -> dict[str, Any]:
        return {"name": cname, "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", f"trap 'exit 0' TERM; {script} & wait"],
                "resources": limits,
                "readinessProbe": {**probe, "periodSeconds": 1, "failureThreshold": 1}}

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "bench"}},
            "spec": {"terminationGracePeriodSeconds": 2, "containers": [
                ctr("web", "httpd -f -p 8080 -h /etc",
                    {"httpGet": {"path": "/hostname", "port": 8080}}),
                ctr("sidecar", "sleep 3600",
                    {"exec": {"command": ["cat", "/etc/hostname"]}}),
            ]}}


def schedule(names: list[str], rounds: int, blocks: int) -> list[tuple[str, int]]:
    """(runtime, rounds) blocks, runtimes alternating: rounds=5, blocks=2 over A, B →
    A3 B3 A2 B2. Every runtime gets `rounds` in all."""
    blocks = max(1, min(blocks, rounds))
    out: list[tuple[str, int]] = []
    for b in range(blocks):
        count = rounds // blocks + (1 if b < rounds % blocks else 0)
        out += [(n, count) for n in names]
    return out


def _sandbox_up(stub: Any, full_name: str) -> bool:
    req = pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(
        state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY)))
    return any(s.metadata.name == full_name for s in stub.ListPodSandbox(req, timeout=30).items)


def _poll(pred: Callable[[], bool], seconds: float, what: str) -> float:
    """Seconds until pred() holds; TimeoutError after `seconds`."""
    t0 = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - t0
        except (OSError, ValueError, grpc.RpcError):
            pass  # the kubelet's server or the runtime busy: poll again
        if time.monotonic() - t0 > seconds:
            raise TimeoutError(f"{what}: not within {seconds:.0f}s")
        time.sleep(POLL)


def all_running(pod: dict[str, Any]) -> bool:
    """Every container reported running by the kubelet (PLEG saw it; probes may not yet)."""
    cs = pod.get("status", {}).get("containerStatuses", [])
    return bool(cs) and all("running" in c.get("state", {}) for c in cs)


@dataclass
class Round:
    running: float  # manifest written → every container running in /pods
    ready: float  # manifest written → every container Ready in /pods
    gone: float  # manifest removed → pod out of /pods and its sandbox stopped


def one_round(k: Kubelet, stub: Any, name: str, image: str) -> Round:
    full = f"{name}-{NODE}"
    running: list[float] = []
    t0 = time.monotonic()

    def ready() -> bool:
        p = k.pod(name)
        if p is not None and not running and all_running(p):
            running.append(time.monotonic() - t0)
        return p is not None and all_ready(p)

    def gone() -> bool:
        return k.pod(name) is None and not _sandbox_up(stub, full)

    k.write_manifest(name, bench_pod(name, image))
    try:
        up = _poll(ready, READY_TIMEOUT, f"pod {name} Ready")
    finally:
        k.remove_manifest(name)
        down = _poll(gone, GONE_TIMEOUT, f"pod {name} gone")
    # Ready implies running; seen in the same poll when both came between two polls.
    return Round(running[0] if running else up, up, down)


def kubelet_ready(sides: list[Any], image: str, version: str, rounds: int, blocks: int,
                  warmup: int, workdir: str, res: Results, log: Progress) -> None:
    """`rounds` measured pods per runtime (after `warmup` per kubelet start); p50/p90."""
    scen = "kubelet"
    samples: dict[str, list[Round]] = {s.name: [] for s in sides}
    reason = missing_reason(version)
    if reason:
        log(f"kubelet: skipped: {reason}")
        for s in sides:
            s.failed.setdefault(scen, "no kubelet")
    by_name = {s.name: s for s in sides}
    k = Kubelet(version, "", "", dict(KUBELET_CONFIG))
    try:
        plan = [] if reason else schedule([s.name for s in sides], rounds, blocks)
        for b, (rt_name, count) in enumerate(plan):
            side = by_name[rt_name]
            if scen in side.failed or "images" in side.failed:
                continue
            _block(k, side, b, count, warmup, image, workdir, samples[rt_name], log)
    finally:
        k.close()  # lets go of the machine's kubelet lock
    notes = {s.name: s.failed[scen] for s in sides if scen in s.failed}

    def series(key: str) -> dict[str, list[float]]:
        return {n: [getattr(r, key) for r in rs] for n, rs in samples.items()}

    def vals(key: str, fn: Callable[[list[float]], float]) -> dict[str, float | None]:
        return {n: fn(v) if v else None for n, v in series(key).items()}

    kl = f"kubelet {version}:"
    res.add(Row(f"{kl} pod Ready p50 (manifest → all containers Ready)", "s",
                vals("ready", p50), notes, target=0.8))
    res.add(Row(f"{kl} pod Ready p90", "s", vals("ready", p90), notes, target=0.8))
    res.add(Row(f"{kl} all containers running p50 (before probes)", "s",
                vals("running", p50), notes))
    res.add(Row(f"{kl} pod gone p50 (manifest removed → sandbox stopped)", "s",
                vals("gone", p50), notes))
    res.raw[scen] = {"kubelet": version} | {
        key: {n: summary(v) | {"samples": v} for n, v in series(key).items()}
        for key in ("ready", "running", "gone")}


def _block(k: Kubelet, side: Any, b: int, count: int, warmup: int, image: str,
           workdir: str, out: list[Round], log: Progress) -> None:
    """One kubelet start on `side`'s socket, `warmup` + `count` rounds, kubelet stop."""
    scen = "kubelet"
    k.endpoint = "unix://" + side.runtime.socket
    k.workdir = os.path.join(workdir, "kubelet", f"{b}-{side.name}")
    log(f"kubelet {k.version} on {side.name} (waits for {LOCK} while another kubelet runs)")
    try:
        k.start()
        for i in range(warmup + count):
            name = f"bench-{b}-{i}"
            try:
                r = one_round(k, side.runtime.rt, name, image)
            except Exception as exc:
                log(f"{side.name}: kubelet: {name}: {exc}\n{k.tail(20)}")
                side.errors.setdefault(scen, []).append(f"{type(exc).__name__}: {exc}")
                if len(side.errors[scen]) > 3:
                    side.failed.setdefault(scen, f"error ({type(exc).__name__})")
                    return
                continue
            if i >= warmup:
                out.append(r)
            log(f"{side.name}: kubelet pod {name}{' (warm-up)' if i < warmup else ''}: "
                f"running in {r.running:.2f}s, Ready in {r.ready:.2f}s, "
                f"gone in {r.gone:.2f}s")
    except AssertionError as exc:  # the driver's "kubelet did not come up"
        log(f"{side.name}: kubelet: {exc}")
        side.failed.setdefault(scen, "kubelet did not start")
    finally:
        k.stop()
        unmount_under(k.workdir)
