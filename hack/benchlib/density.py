"""A full node: many pods of two containers, and the calls a kubelet makes most.

Per runtime, one after the other (each holds its pods only while it is measured), each
starting once the host is quiet (wait_quiet):

1. ramp: `pods` pods (RunPodSandbox + 2 x CreateContainer/StartContainer) at concurrency
   `conc`; wall and per-pod ready. Meanwhile a second client in its own process
   (probe.py, through the thin client of h2unary.py) loops Version, ListPodSandbox,
   ListContainers every PROBE_PERIOD: Version's latency is the daemon's event-loop lag
   (it does no work), over the whole ramp (and, for reference, over IDLE_PROBE_S before
   it, when nothing starts); the lists' latency is what PLEG sees while pods start,
   from the moment all but 2 x `conc` pods are ready (about 100 listed while 10 start).
   Each time is the runtime's share: the call as timed, less the probe's own wait for a
   CPU during it (probe.py); the times as timed, and that wait, are reported next to it.
2. steady: the kubelet's mix for `mix_s` seconds: every second the PLEG relist
   (ListPodSandbox + ListContainers, through the thin client; the same pair through
   grpcio's client half a tick later, for reference), a few pods' status
   (PodSandboxStatus + ListContainers filtered by pod, as the kubelet's pod workers do)
   and a few ContainerStatus; every STATS_PERIOD ListContainerStats + ListPodSandboxStats.
   Then exec probes, bunched: EXEC_N ExecSync (`cat /etc/hostname`, the kubelet
   scenario's exec probe) at concurrency `conc` into the node's containers while the probe
   process times Version (event-loop lag) and the lists, as during the ramp.
3. sequential lifecycle at that load, `seq_n` times: a one-container pod whose process
   ignores SIGTERM (busybox `sleep` as the container's init), StopContainer with timeout 0,
   each RPC timed through the thin client, less the client's own wait for a CPU after
   its request was sent (as the probe's); p99 is compared with p50 (a tail means
   something waits). A p99 needs about 100 calls: of 30 it is their slowest.
4. teardown: StopPodSandbox + RemovePodSandbox of every pod at concurrency `conc`; wall.

For crishim, after the steady mix, the two lists' floor: the same reply bytes sent by
crishim's gRPC server doing nothing else (listfloor.py), timed with the same tick and
client.

Daemon RSS is read before the ramp (no pods) and at `pods` pods; the monitors' RSS too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.api.runtime.v1 import api_pb2_grpc as pbg
from hack.benchlib import procs, workload
from hack.benchlib.h2unary import H2Unary
from hack.benchlib.images import BenchImages
from hack.benchlib.probe import RunDelay
from hack.benchlib.report import SUBJECT, Results, Row
from hack.benchlib.runtimes import REPO_ROOT, Runtime
from hack.benchlib.stats import p50, percentile, summary
from hack.benchlib.workload import RPC_TIMEOUT, Unsupported, timed

Progress = Callable[[str], None]
SCEN = "density"
CONTAINERS = ("app", "sidecar")
PROBE_PERIOD = 0.01  # between probe rounds: a 100 Hz ticker, light next to 10 pod starts
IDLE_PROBE_S = 3.0  # probing before the ramp: the machine's own share of the lag
EXEC_N = 100  # ExecSync calls of the exec-probe burst
EXEC_CMD = ["cat", "/etc/hostname"]
STATS_PERIOD = 5.0
STATUS_PER_TICK = 5  # pods whose status a tick asks for (PodSandboxStatus + filtered list)
CONTAINER_STATUS_PER_TICK = 10
# The kubelet's gRPC client accepts 16 MiB replies; so does ours.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 16 * 1024 * 1024)]
# A container init with no handler ignores SIGTERM: StopContainer(timeout 0) must SIGKILL.
IGNORES_TERM = ["sleep", "3600"]
LIFECYCLE_STEPS = ("RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer",
                   "RemoveContainer", "StopPodSandbox", "RemovePodSandbox")
MIX_CALLS = ("ListPodSandbox", "ListContainers", "ListContainers (by pod)", "PodSandboxStatus",
             "ContainerStatus", "ListContainerStats", "ListPodSandboxStats")
RELIST = ("ListPodSandbox", "ListContainers")  # PLEG's pair, in its order
PROBE_CALLS = ("Version", "ListPodSandbox", "ListContainers")
# Before each runtime's node: CPUs this idle over this long, waited for at most this long.
QUIET_IDLE = 0.95
QUIET_WINDOW_S = 1.0
QUIET_MAX_S = 60.0
# Host limits a node with this many pods needs; raised for the run, then put back.
SYSCTLS = {"fs/inotify/max_user_instances": 1024, "fs/inotify/max_user_watches": 524288,
           "kernel/pid_max": 65536, "net/ipv4/neigh/default/gc_thresh3": 4096}


def p99(samples: list[float]) -> float:
    return percentile(samples, 99)


@contextlib.contextmanager
def host_limits(log: Progress) -> Iterator[None]:
    """Raise (never lower) the sysctls above for the scenario; restore them after."""
    old: dict[str, str] = {}
    for key, want in SYSCTLS.items():
        path = f"/proc/sys/{key}"
        try:
            with open(path) as fh:
                cur = fh.read().strip()
            if int(cur) < want:
                with open(path, "w") as fh:
                    fh.write(str(want))
                old[path] = cur
        except (OSError, ValueError) as exc:
            log(f"density: cannot raise {key}: {exc}")
    try:
        yield
    finally:
        for path, value in old.items():
            with contextlib.suppress(OSError), open(path, "w") as fh:
                fh.write(value)


@dataclass
class NodePod:
    sandbox_id: str = ""
    container_ids: list[str] = field(default_factory=list)
    ready: float = 0.0
    done: float = 0.0  # time.monotonic() when it was ready


def make_pod(rt: pbg.RuntimeServiceStub, runtime: str, name: str, image: str,
             log_root: str) -> NodePod:
    """RunPodSandbox, then CreateContainer + StartContainer for each of two containers
    (as the kubelet's pod worker: one after the other)."""
    config = workload.pod_config(runtime, name, log_root)
    os.makedirs(config.log_directory, exist_ok=True)
    pod = NodePod()
    t0 = time.perf_counter()
    reply, _ = timed("RunPodSandbox", rt.RunPodSandbox, pb.RunPodSandboxRequest(config=config))
    pod.sandbox_id = reply.pod_sandbox_id
    try:
        for cname in CONTAINERS:
            reply, _ = timed("CreateContainer", rt.CreateContainer, pb.CreateContainerRequest(
                pod_sandbox_id=pod.sandbox_id, config=workload.container_config(image, cname),
                sandbox_config=config))
            pod.container_ids.append(reply.container_id)
            timed("StartContainer", rt.StartContainer,
                  pb.StartContainerRequest(container_id=reply.container_id))
    except Exception:
        remove_pod(rt, pod.sandbox_id)
        raise
    pod.ready = time.perf_counter() - t0
    pod.done = time.monotonic()
    return pod


def remove_pod(rt: pbg.RuntimeServiceStub, sandbox_id: str) -> None:
    for fn, req in ((rt.StopPodSandbox, pb.StopPodSandboxRequest),
                    (rt.RemovePodSandbox, pb.RemovePodSandboxRequest)):
        with contextlib.suppress(grpc.RpcError):
            fn(req(pod_sandbox_id=sandbox_id), timeout=RPC_TIMEOUT)


class Probe:
    """hack/benchlib/probe.py in its own process: Version and the two PLEG lists in a
    loop, each sample with its start time (CLOCK_MONOTONIC, shared by every process) and
    the probe's own wait for a CPU during the call."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.proc: subprocess.Popen[str] | None = None
        self.samples: dict[str, list[tuple[float, float, float]]] = {
            c: [] for c in PROBE_CALLS}
        self.error = ""

    def __enter__(self) -> Probe:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hack.benchlib.probe", self.socket, str(PROBE_PERIOD),
             ",".join(PROBE_CALLS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=REPO_ROOT)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("the probe client did not connect")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        try:
            out, _ = self.proc.communicate(input="", timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.error = "the probe client did not stop"
            return
        doc = json.loads(out.strip().splitlines()[-1])
        self.error = doc["error"]
        self.samples = {c: [(t, s, w) for t, s, w in v] for c, v in doc["samples"].items()}

    def since(self, call: str, t: float, until: float = float("inf")) -> list[float]:
        """The calls' times, less the probe's own wait for a CPU: the runtime's share."""
        return [s - w for t0, s, w in self.samples[call] if t <= t0 < until]

    def timed_since(self, call: str, t: float) -> list[float]:
        """The calls' times as the probe timed them, its own wait for a CPU included."""
        return [s for t0, s, _ in self.samples[call] if t0 >= t]

    def waited_since(self, call: str, t: float) -> list[float]:
        return [w for t0, _, w in self.samples[call] if t0 >= t]


@dataclass
class SideResult:
    wall: float = 0.0
    ready: list[float] = field(default_factory=list)
    probe: dict[str, list[float]] = field(default_factory=dict)
    probe_timed: dict[str, list[float]] = field(default_factory=dict)  # the wait included
    probe_waited: dict[str, list[float]] = field(default_factory=dict)
    probe_all: dict[str, list[float]] = field(default_factory=dict)
    probe_idle: dict[str, list[float]] = field(default_factory=dict)
    mix: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in MIX_CALLS})
    mix_grpcio: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in RELIST})
    list_floor: dict[str, list[float]] = field(default_factory=dict)
    exec_sync: list[float] = field(default_factory=list)
    exec_probe: dict[str, list[float]] = field(default_factory=dict)
    seq: dict[str, list[float]] = field(
        default_factory=lambda: {s: [] for s in LIFECYCLE_STEPS})
    # The client's own wait for a CPU once its request was sent, taken out of `seq`.
    seq_waited: dict[str, list[float]] = field(
        default_factory=lambda: {s: [] for s in LIFECYCLE_STEPS})
    teardown: float = 0.0
    quiet_wait: float = 0.0  # seconds waited for a quiet host before the ramp
    mem_idle: dict[str, float] = field(default_factory=dict)
    mem_full: dict[str, float] = field(default_factory=dict)
    mem_after: dict[str, float] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)


def _memory(rt: Runtime) -> dict[str, float]:
    d = procs.mem_sum(rt.daemon_pids())
    m = procs.mem_sum(rt.monitor_pids())
    return {"daemon_rss": float(d.rss), "daemon_pss": float(d.pss),
            "monitor_rss": float(m.rss), "monitor_pss": float(m.pss),
            "monitors": float(m.count)}


def _ramp(rt: Runtime, image: str, pods: int, conc: int, out: SideResult,
          made: list[NodePod], log: Progress) -> None:
    assert rt.rt is not None and rt.socket
    stub = rt.rt
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            pod = make_pod(stub, rt.name, f"node-{i}", image, rt.log_dir)
        except Exception as exc:  # reported below; the ramp goes on like a kubelet's
            with lock:
                errors.append(exc)
            return
        with lock:
            made.append(pod)

    with Probe(rt.socket) as probe:
        time.sleep(IDLE_PROBE_S)  # the same calls on a node where nothing starts
        started = time.monotonic()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=conc) as pool:
            list(pool.map(one, range(pods)))
        out.wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    if probe.error:
        raise RuntimeError(f"probe: {probe.error}")
    out.ready = [p.ready for p in made]
    # The last pods: from when all but 2 x conc were ready (about 100 listed, 10 starting).
    done = sorted(p.done for p in made)
    window = done[max(0, len(done) - 2 * conc - 1)] if done else 0.0
    out.probe = {c: probe.since(c, window) for c in PROBE_CALLS}
    out.probe_timed = {c: probe.timed_since(c, window) for c in PROBE_CALLS}
    out.probe_waited = {c: probe.waited_since(c, window) for c in PROBE_CALLS}
    out.probe_all = {c: probe.since(c, started) for c in PROBE_CALLS}
    out.probe_idle = {c: probe.since(c, 0.0, until=started) for c in PROBE_CALLS}


def _thin_timed(thin: H2Unary, name: str, request: bytes) -> tuple[bytes, float]:
    """RuntimeService `name` through the thin client: (the reply, seconds), the request
    encoded before the timer starts."""
    prepared = thin.request(f"/runtime.v1.RuntimeService/{name}", request)
    t0 = time.perf_counter()
    reply = thin.exchange(prepared)
    return reply, time.perf_counter() - t0


def _relist(thin: H2Unary, into: dict[str, list[float]]) -> None:
    """PLEG's relist through the thin client (both requests unfiltered: no bytes)."""
    for name in RELIST:
        into[name].append(_thin_timed(thin, name, b"")[1])


def _mix(rt: pbg.RuntimeServiceStub, socket: str, made: list[NodePod], seconds: float,
         out: SideResult) -> None:
    """The kubelet's steady-state calls, one tick a second (sequential, like PLEG). The
    relist goes through the thin client; half a tick later, for reference, the same two
    calls through grpcio's."""
    rng = random.Random(7)
    containers = [c for p in made for c in p.container_ids]
    relist_grpcio = [("ListPodSandbox", rt.ListPodSandbox, pb.ListPodSandboxRequest()),
                     ("ListContainers", rt.ListContainers, pb.ListContainersRequest())]
    next_stats = 0.0
    with H2Unary(socket) as thin:
        thin.call("/runtime.v1.RuntimeService/Version", b"")  # connected before timing
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            tick = time.monotonic()
            _relist(thin, out.mix)
            calls: list[tuple[str, Callable[..., Any], Any]] = []
            for pod in rng.sample(made, min(STATUS_PER_TICK, len(made))):
                calls += [("PodSandboxStatus", rt.PodSandboxStatus,
                           pb.PodSandboxStatusRequest(pod_sandbox_id=pod.sandbox_id)),
                          ("ListContainers (by pod)", rt.ListContainers,
                           pb.ListContainersRequest(filter=pb.ContainerFilter(
                               pod_sandbox_id=pod.sandbox_id)))]
            calls += [("ContainerStatus", rt.ContainerStatus,
                       pb.ContainerStatusRequest(container_id=cid))
                      for cid in rng.sample(containers, min(CONTAINER_STATUS_PER_TICK,
                                                            len(containers)))]
            if tick - start >= next_stats:
                next_stats += STATS_PERIOD
                calls += [("ListContainerStats", rt.ListContainerStats,
                           pb.ListContainerStatsRequest()),
                          ("ListPodSandboxStats", rt.ListPodSandboxStats,
                           pb.ListPodSandboxStatsRequest())]
            for name, fn, req in calls:
                if name in out.unsupported:
                    continue
                try:
                    _, secs = timed(name, fn, req)
                except Unsupported:
                    out.unsupported[name] = "unsupported (UNIMPLEMENTED)"
                    continue
                out.mix[name].append(secs)
            time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
            for name, fn, req in relist_grpcio:
                out.mix_grpcio[name].append(timed(name, fn, req)[1])
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))


def _list_floor(rt: Runtime, seconds: float) -> dict[str, list[float]]:
    """The relist, with the kubelet's tick and the thin client, against listfloor.py
    serving the bytes `rt` answers it with now."""
    assert rt.channel is not None
    folder = os.path.join(rt.workdir, "listfloor")
    os.makedirs(folder, exist_ok=True)
    requests = {"ListPodSandbox": pb.ListPodSandboxRequest(),
                "ListContainers": pb.ListContainersRequest()}
    for name, req in requests.items():
        raw = rt.channel.unary_unary(f"/runtime.v1.RuntimeService/{name}",
                                     request_serializer=lambda m: m.SerializeToString())
        with open(os.path.join(folder, f"{name}.bin"), "wb") as fh:
            fh.write(raw(req, timeout=RPC_TIMEOUT))
    sock = os.path.join(folder, "floor.sock")
    proc = subprocess.Popen([sys.executable, "-m", "hack.benchlib.listfloor", sock, folder],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    samples: dict[str, list[float]] = {name: [] for name in RELIST}
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the list floor server did not start")
        with H2Unary(sock) as thin:
            thin.call("/runtime.v1.RuntimeService/ListPodSandbox", b"")  # connected
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                tick = time.monotonic()
                _relist(thin, samples)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(input="", timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return samples


def _exec_burst(rt: Runtime, made: list[NodePod], conc: int, out: SideResult) -> None:
    """EXEC_N ExecSync into the node's containers at `conc`, as the exec probes of a full
    node that happen to fall together; the probe process times Version and the lists."""
    stub = rt.rt
    assert stub is not None
    targets = [cid for pod in made for cid in pod.container_ids]

    def one(i: int) -> float:
        req = pb.ExecSyncRequest(container_id=targets[i % len(targets)], cmd=EXEC_CMD,
                                 timeout=10)
        reply, seconds = timed("ExecSync", stub.ExecSync, req)
        if reply.exit_code != 0:
            raise RuntimeError(f"ExecSync {EXEC_CMD} exited {reply.exit_code}: "
                               f"{reply.stderr[:200]!r}")
        return seconds

    with Probe(rt.socket) as probe:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=conc) as pool:
            out.exec_sync = list(pool.map(one, range(EXEC_N)))
        ended = time.monotonic()
    if probe.error:
        raise RuntimeError(f"probe: {probe.error}")
    out.exec_probe = {c: probe.since(c, started, until=ended) for c in PROBE_CALLS}


def _timed(r: SideResult, step: str) -> list[float]:
    return [v + w for v, w in zip(r.seq[step], r.seq_waited[step], strict=True)]


def _lifecycle(rt: Runtime, image: str, n: int, out: SideResult) -> None:
    """One-container pods, one at a time, next to the node's pods, through the thin
    client: grpcio's client adds its own thread hand-offs to every call, a millisecond
    and more at times, which would be most of a tail of a call of a few milliseconds.
    Each time is the runtime's share, as the probe's: less the client's own wait for a
    CPU once its request is out (woken by the reply on a CPU a kworker holds, it waits
    up to a millisecond or two). Its wait while the daemon, woken on its CPU, answers is
    not taken out: it would have slept then anyway."""
    stub = rt.rt
    assert stub is not None
    run_delay = RunDelay()
    with H2Unary(rt.socket) as thin:
        def call(steps: dict[str, tuple[float, float]], name: str, req: Any,
                 reply: Any) -> Any:
            """The reply; into `steps[name]`, (seconds as timed, the client's wait)."""
            prepared = thin.request(f"/runtime.v1.RuntimeService/{name}",
                                    req.SerializeToString())
            t0 = time.perf_counter()
            thin.send(prepared)
            w0 = run_delay()
            raw = thin.receive(prepared)
            steps[name] = (time.perf_counter() - t0, run_delay() - w0)
            return reply.FromString(raw)

        for i in range(n + 1):  # the first is a warm-up
            config = workload.pod_config(rt.name, f"seq-{i}", rt.log_dir)
            os.makedirs(config.log_directory, exist_ok=True)
            cconf = workload.container_config(image)
            del cconf.args[:]
            cconf.command[:] = IGNORES_TERM
            steps: dict[str, tuple[float, float]] = {}
            reply = call(
                steps, "RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                pb.RunPodSandboxResponse)
            sid = reply.pod_sandbox_id
            try:
                reply = call(
                    steps, "CreateContainer", pb.CreateContainerRequest(
                        pod_sandbox_id=sid, config=cconf, sandbox_config=config),
                    pb.CreateContainerResponse)
                cid = reply.container_id
                for name, req, rep in (
                        ("StartContainer", pb.StartContainerRequest(container_id=cid),
                         pb.StartContainerResponse),
                        ("StopContainer", pb.StopContainerRequest(container_id=cid, timeout=0),
                         pb.StopContainerResponse),
                        ("RemoveContainer", pb.RemoveContainerRequest(container_id=cid),
                         pb.RemoveContainerResponse),
                        ("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid),
                         pb.StopPodSandboxResponse),
                        ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid),
                         pb.RemovePodSandboxResponse)):
                    call(steps, name, req, rep)
            except Exception:
                remove_pod(stub, sid)
                raise
            if i > 0:
                for k, (timed, waited) in steps.items():
                    out.seq[k].append(timed - waited)
                    out.seq_waited[k].append(waited)


def _teardown(rt: pbg.RuntimeServiceStub, made: list[NodePod], conc: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=conc) as pool:
        list(pool.map(lambda p: _stop_remove(rt, p), list(made)))
    wall = time.perf_counter() - t0
    made.clear()
    return wall


def _stop_remove(rt: pbg.RuntimeServiceStub, pod: NodePod) -> None:
    timed("StopPodSandbox", rt.StopPodSandbox,
          pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id))
    timed("RemovePodSandbox", rt.RemovePodSandbox,
          pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id))


def _left(rt: pbg.RuntimeServiceStub) -> int:
    return len(rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items)


def run_side(rt: Runtime, image: str, pods: int, conc: int, mix_s: float, seq_n: int,
             log: Progress) -> SideResult:
    assert rt.rt is not None
    stub = rt.rt
    out = SideResult()
    made: list[NodePod] = []
    out.mem_idle = _memory(rt)
    try:
        _ramp(rt, image, pods, conc, out, made, log)
        log(f"{rt.name}: {pods} pods x {len(CONTAINERS)} @{conc}: {out.wall:.2f}s; "
            f"Version p99 {p99(out.probe_all['Version']) * 1000:.1f} ms")
        time.sleep(1.0)  # post-start work settles, as in the concurrent scenario
        out.mem_full = _memory(rt)
        _mix(stub, rt.socket, made, mix_s, out)
        log(f"{rt.name}: kubelet mix {mix_s:g}s: ListContainers p50 "
            f"{p50(out.mix['ListContainers']) * 1000:.2f} ms")
        if rt.name == SUBJECT:
            out.list_floor = _list_floor(rt, mix_s)
        _exec_burst(rt, made, conc, out)
        log(f"{rt.name}: {EXEC_N} ExecSync @{conc}: p50 {p50(out.exec_sync) * 1000:.1f} ms; "
            f"Version p99 {p99(out.exec_probe['Version']) * 1000:.1f} ms")
        _lifecycle(rt, image, seq_n, out)
        out.teardown = _teardown(stub, made, conc)
        log(f"{rt.name}: teardown {out.teardown:.2f}s")
        out.mem_after = _memory(rt)
        if _left(stub):
            raise RuntimeError(f"{rt.name}: pods left after the teardown")
        return out
    finally:
        if made:  # a failure half-way: the next runtime measures on an empty node
            with ThreadPoolExecutor(max_workers=conc) as pool:
                list(pool.map(lambda p: remove_pod(stub, p.sandbox_id), made))


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs so far; iowait counts as idle."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:9]]
    return fields[3] + fields[4], sum(fields)


def wait_quiet(log: Progress, name: str) -> float:
    """Wait (up to QUIET_MAX_S) until the CPUs are QUIET_IDLE idle over QUIET_WINDOW_S,
    so that every runtime starts on an equally quiet host: a run started right after
    other work (another run, whose last pods the kernel may still be tearing down, or a
    test suite) would measure that work too. Seconds waited."""
    start = time.monotonic()
    while True:
        idle0, total0 = _cpu_times()
        time.sleep(QUIET_WINDOW_S)
        idle1, total1 = _cpu_times()
        waited = time.monotonic() - start
        if total1 > total0 and (idle1 - idle0) / (total1 - total0) >= QUIET_IDLE:
            log(f"{name}: density: host quiet after {waited:.1f}s")
            return waited
        if waited >= QUIET_MAX_S:
            log(f"{name}: density: the host is still busy after {waited:.0f}s; "
                "measuring anyway")
            return waited


def density(sides: list[Any], images: BenchImages, pods: int, conc: int, mix_s: float,
            seq_n: int, res: Results, log: Progress) -> None:
    """`sides` are scenarios.Side; each runtime in turn (a full node each)."""
    results: dict[str, SideResult] = {}
    with host_limits(log):
        for side in sides:
            if SCEN in side.failed or "images" in side.failed:
                continue
            waited = wait_quiet(log, side.name)
            try:
                results[side.name] = run_side(side.runtime, images.busybox, pods, conc,
                                              mix_s, seq_n, log)
                results[side.name].quiet_wait = waited
            except Exception as exc:
                log(f"{side.name}: density: {side.note(SCEN, exc)}")
    notes = {s.name: s.failed[SCEN] for s in sides if SCEN in s.failed}
    add_rows(res, [s.name for s in sides], results, pods, conc, notes)


def add_rows(res: Results, names: list[str], results: dict[str, SideResult], pods: int,
             conc: int, notes: dict[str, str]) -> None:
    def vals(fn: Callable[[SideResult], float | None]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for n in names:
            r = results.get(n)
            out[n] = fn(r) if r is not None else None
        return out

    def q(samples: list[float], fn: Callable[[list[float]], float]) -> float | None:
        return fn(samples) if samples else None

    ctrs = len(CONTAINERS)
    tag = f"@{pods} pods x {ctrs}"
    res.add(Row(f"density: {pods} pods x {ctrs} @{conc}: wall", "s",
                vals(lambda r: r.wall), notes))
    res.add(Row(f"density: pod ready p50 (Run + {ctrs} x Create+Start) @{conc}", "s",
                vals(lambda r: q(r.ready, p50)), notes))
    subject = results.get(SUBJECT)
    for call in ("ListContainers", "ListPodSandbox"):
        floor = q(subject.list_floor.get(call, []), p50) if subject else None
        res.add(Row(f"density: {call} p50 {tag} (kubelet mix)", "s",
                    vals(lambda r, c=call: q(r.mix[c], p50)), notes, target=0.5,
                    floor=floor))
        res.add(Row(f"density: {call} p99 while {conc} pods start", "s",
                    vals(lambda r, c=call: q(r.probe[c], p99)), notes, limit=0.005))
        res.add(Row(f"density: {call} p99 while {conc} pods start, as timed "
                    "(the probe's own CPU wait included)", "s",
                    vals(lambda r, c=call: q(r.probe_timed[c], p99)), notes))
    res.add(Row(f"density: Version p50 while {conc} pods start (event-loop lag)", "s",
                vals(lambda r: q(r.probe_all["Version"], p50)), notes))
    res.add(Row(f"density: Version p99 while {conc} pods start (event-loop lag)", "s",
                vals(lambda r: q(r.probe_all["Version"], p99)), notes, limit=0.020))
    res.add(Row("density: Version p99 before the ramp (nothing starting)", "s",
                vals(lambda r: q(r.probe_idle.get("Version", []), p99)), notes))
    res.add(Row(f"density: the probe's own CPU wait in a call, p99 while {conc} pods "
                "start", "s",
                vals(lambda r: q([w for c in PROBE_CALLS for w in r.probe_waited[c]], p99)),
                notes))
    for call in MIX_CALLS:
        if call in ("ListContainers", "ListPodSandbox"):
            continue
        cnotes = notes | {n: r.unsupported[call] for n, r in results.items()
                          if call in r.unsupported}
        res.add(Row(f"density: {call} p50 {tag}", "s",
                    vals(lambda r, c=call: q(r.mix[c], p50)), cnotes))
    for call in ("ListContainers", "ListPodSandbox"):
        res.add(Row(f"density: {call} p99 {tag} (kubelet mix)", "s",
                    vals(lambda r, c=call: q(r.mix[c], p99)), notes))
    for call in ("ListContainers", "ListPodSandbox"):
        res.add(Row(f"density: {call} p50 {tag} (kubelet mix, grpcio's client)", "s",
                    vals(lambda r, c=call: q(r.mix_grpcio[c], p50)), notes))
    res.add(Row(f"density: ExecSync p50, {EXEC_N} @{conc} {tag}", "s",
                vals(lambda r: q(r.exec_sync, p50)), notes))
    res.add(Row(f"density: ExecSync p99, {EXEC_N} @{conc} {tag}", "s",
                vals(lambda r: q(r.exec_sync, p99)), notes))
    res.add(Row("density: Version p99 during the ExecSync burst (event-loop lag)", "s",
                vals(lambda r: q(r.exec_probe.get("Version", []), p99)), notes))
    res.add(Row("density: ListPodSandbox p99 during the ExecSync burst", "s",
                vals(lambda r: q(r.exec_probe.get("ListPodSandbox", []), p99)), notes))
    for step in LIFECYCLE_STEPS:
        res.add(Row(f"density: {step} p50 (sequential, next to {pods} pods)", "s",
                    vals(lambda r, s=step: q(r.seq[s], p50)), notes))
        crishim_p50 = q(results["crishim"].seq[step], p50) if "crishim" in results else None
        res.add(Row(f"density: {step} p99 (≤ 2x its p50)", "s",
                    vals(lambda r, s=step: q(r.seq[s], p99)), notes,
                    limit=2 * crishim_p50 if crishim_p50 else None))
        res.add(Row(f"density: {step} p99 as timed (the client's own CPU wait included)",
                    "s", vals(lambda r, s=step: q(_timed(r, s), p99)), notes))
    res.add(Row(f"density: teardown {pods} pods @{conc} (StopPodSandbox+Remove): wall", "s",
                vals(lambda r: r.teardown), notes))
    res.add(Row("density: daemon RSS, no pods", "B",
                vals(lambda r: r.mem_idle.get("daemon_rss")), notes))
    res.add(Row(f"density: daemon RSS {tag}", "B",
                vals(lambda r: r.mem_full.get("daemon_rss")), notes))
    res.add(Row(f"density: daemon RSS growth 0 → {pods} pods", "B",
                vals(lambda r: r.mem_full.get("daemon_rss", 0) - r.mem_idle.get("daemon_rss", 0)),
                notes))
    res.add(Row("density: monitor RSS per pod", "B",
                vals(lambda r: r.mem_full.get("monitor_rss", 0) / pods), notes))
    res.add(Row("density: monitor PSS per pod", "B",
                vals(lambda r: r.mem_full.get("monitor_pss", 0) / pods), notes))
    res.raw[SCEN] = {n: {"wall": r.wall, "teardown": r.teardown, "quiet_wait": r.quiet_wait,
                         "ready": summary(r.ready) | {"samples": r.ready},
                         "probe": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                   for c, v in r.probe.items()},
                         "probe_timed": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                         for c, v in r.probe_timed.items()},
                         "probe_waited": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                          for c, v in r.probe_waited.items()},
                         "probe_all": {c: summary(v) | {"p99": q(v, p99)}
                                       for c, v in r.probe_all.items()},
                         "probe_idle": {c: summary(v) | {"p99": q(v, p99)}
                                        for c, v in r.probe_idle.items()},
                         "mix": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                 for c, v in r.mix.items()},
                         "list_floor": {c: summary(v) | {"samples": v}
                                        for c, v in r.list_floor.items()},
                         "mix_grpcio": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                        for c, v in r.mix_grpcio.items()},
                         "sequential": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                        for c, v in r.seq.items()},
                         "sequential_waited": {c: summary(v) | {"p99": q(v, p99),
                                                                "samples": v}
                                               for c, v in r.seq_waited.items()},
                         "exec_sync": summary(r.exec_sync) | {"p99": q(r.exec_sync, p99),
                                                              "samples": r.exec_sync},
                         "exec_probe": {c: summary(v) | {"p99": q(v, p99), "samples": v}
                                        for c, v in r.exec_probe.items()},
                         "memory": {"idle": r.mem_idle, "full": r.mem_full,
                                    "after": r.mem_after}}
                     for n, r in results.items()}
