"""The tracing scenario: pod ready with tracing off, and on with every span sampled.

Each runtime is restarted with tracing off, then on, sending OTLP over gRPC to a receiver
in a process of its own (tests/fakes/otlp.py, so that its work is not the bench's):
crishim with `[tracing] sampling_rate_per_million = 1000000`, a containerd 2.x with its
otlp plugin (the OTEL_* environment: OTEL_TRACES_SAMPLER=always_on). Phases repeat in
blocks, every other block in reverse order (off on / on off); in each the runtimes take
turns pod by pod, and after `warmup` unmeasured pods each lifecycle is measured: pod ready
(Run+Create+Start) and the daemon process's own CPU (all its threads, not its children)
over the whole lifecycle. The receiver's span count per runtime shows tracing was on.
containerd 1.x (configured in its TOML, not the environment) is left out, with a note.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from hack.benchlib.images import BenchImages
from hack.benchlib.nri import cost_pct
from hack.benchlib.phases import alternate, restart
from hack.benchlib.report import Results, Row
from hack.benchlib.runtimes import REPO_ROOT, Containerd, Runtime
from hack.benchlib.scenarios import Side, _notes, _one_lifecycle, _transient
from hack.benchlib.stats import p50, p90, summary

Progress = Callable[[str], None]
SCEN = "tracing"
OFF, ON = "off", "on"
PHASES = (OFF, ON)
PHASE_NAMES = {OFF: "tracing off", ON: "tracing on, 100% sampled"}
NO_ENV_TRACING = "containerd 1.x: tracing is in its TOML (not measured here)"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# Both SDKs' batch processors send every 5 s; containerd drops what is queued when it
# stops (crishim sends it), so a containerd with tracing on is given that long first.
EXPORT_WAIT_S = 6.0
# Pods per runtime and phase in a block at most: the phases alternate at least this often,
# so that a drift in the machine's load spreads over both.
BLOCK_PODS = 20

# The receiver process: prints its gRPC endpoint, then at EOF on stdin the span count
# per service name.
_SINK = """\
import json, sys
from collections import Counter
from tests.fakes.otlp import Receiver
with Receiver() as rx:
    print(rx.grpc_endpoint, flush=True)
    sys.stdin.read()
    print(json.dumps(Counter(s.service for s in rx.spans)), flush=True)
"""


class Sink:
    """An OTLP receiver in a child process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SINK], cwd=REPO_ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint:
            self.proc.wait(10)
            raise RuntimeError(f"the OTLP receiver did not start (exit {self.proc.returncode})")

    def close(self) -> dict[str, int]:
        """Stop; the spans received per service name."""
        import json
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return {}
        last = out.strip().splitlines()[-1:] or ["{}"]
        return dict(json.loads(last[0]))


def cpu_s(pid: int) -> float:
    """A process's own user+system CPU so far (its threads, not its waited-for children)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime


def daemon_cpu(rt: Runtime) -> float | None:
    pids = rt.daemon_pids()
    try:
        return sum(cpu_s(p) for p in pids) if pids else None
    except (OSError, ValueError, IndexError):
        return None


def tracing_rows(ready: dict[str, dict[str, list[float]]],
                 cpu: dict[str, dict[str, float | None]], notes: dict[str, str]) -> list[Row]:
    """p50/p90 pod ready per phase, daemon CPU per pod lifecycle, and what tracing costs
    each runtime as a percentage of its own numbers (no ratio across runtimes)."""

    def per(phase: str, fn: Callable[[list[float]], float]) -> dict[str, float | None]:
        return {name: fn(d[phase]) if d.get(phase) else None for name, d in ready.items()}

    rows = [Row(f"{PHASE_NAMES[ph]}: pod ready {q}", "s", per(ph, fn), dict(notes))
            for q, fn in (("p50", p50), ("p90", p90)) for ph in PHASES]
    rows += [Row(f"{PHASE_NAMES[ph]}: daemon CPU per pod lifecycle", "s",
                 {name: cpu[name].get(ph) for name in ready}, dict(notes)) for ph in PHASES]
    mid = {ph: per(ph, p50) for ph in PHASES}
    rows.append(Row("tracing cost: on vs off (pod ready p50)", "%",
                    {name: cost_pct(mid[ON][name], mid[OFF][name]) for name in ready},
                    dict(notes)))
    rows.append(Row("tracing cost: on vs off (daemon CPU per pod)", "%",
                    {name: cost_pct(cpu[name].get(ON), cpu[name].get(OFF)) for name in ready},
                    dict(notes)))
    return rows


def phase_order(block: int) -> tuple[str, ...]:
    return alternate(PHASES, block)


def _restart(side: Side, endpoint: str, log: Progress) -> bool:
    def change(rt: Runtime) -> None:
        rt.otlp = endpoint
    return restart(side, SCEN, f"tracing {'on' if endpoint else 'off'}", change, log)


def tracing(sides: Sequence[Side], images: BenchImages, n: int, blocks: int, warmup: int,
            res: Results, log: Progress) -> None:
    """Pod ready per phase: `n` pods per runtime and phase over `blocks` rounds of the
    two phases (more when a block would hold over BLOCK_PODS), each phase after `warmup`
    unmeasured pods."""
    for s in sides:
        if isinstance(s.runtime, Containerd) and s.runtime.anchor.major < 2:
            s.failed.setdefault(SCEN, NO_ENV_TRACING)
    live = [s for s in sides if SCEN not in s.failed and "images" not in s.failed]
    ready: dict[str, dict[str, list[float]]] = {s.name: {p: [] for p in PHASES}
                                                for s in sides}
    cpu_sum: dict[str, dict[str, float]] = {s.name: {p: 0.0 for p in PHASES} for s in sides}
    cpu_n: dict[str, dict[str, int]] = {s.name: {p: 0 for p in PHASES} for s in sides}
    blocks = max(blocks, -(-n // BLOCK_PODS))
    per_block = [n // blocks + (1 if b < n % blocks else 0) for b in range(blocks)]
    sink = Sink()
    log(f"tracing: OTLP receiver on {sink.endpoint}")
    try:
        for b, count in enumerate(per_block):
            for phase in phase_order(b):
                endpoint = sink.endpoint if phase == ON else ""
                changing = [s for s in live
                            if SCEN not in s.failed and s.runtime.otlp != endpoint]
                if any(s.runtime.otlp and isinstance(s.runtime, Containerd) for s in changing):
                    time.sleep(EXPORT_WAIT_S)
                for s in changing:
                    _restart(s, endpoint, log)
                log(f"tracing block {b + 1}/{blocks}: {PHASE_NAMES[phase]}: {warmup} "
                    f"warm-up + {count} per runtime")
                for i in range(warmup + count):
                    for s in live:
                        if SCEN in s.failed:
                            continue
                        before = daemon_cpu(s.runtime)
                        try:
                            pod = _one_lifecycle(s, images, f"tr-{phase}-{b}-{i}",
                                                 verify=i == warmup, userns=False)
                        except Exception as exc:
                            if not _transient(s, SCEN, exc, log):
                                log(f"{s.name}: tracing: {s.note(SCEN, exc)}")
                            continue
                        after = daemon_cpu(s.runtime)
                        if i >= warmup:
                            ready[s.name][phase].append(pod.ready)
                            if before is not None and after is not None:
                                cpu_sum[s.name][phase] += after - before
                                cpu_n[s.name][phase] += 1
    finally:
        if any(s.runtime.otlp and isinstance(s.runtime, Containerd) for s in live):
            time.sleep(EXPORT_WAIT_S)
        for s in live:
            s.runtime.stop()
        received = sink.close()
        for s in live:  # up again (off) for the bench's cleanup through the CRI
            _restart(s, "", log)
    log(f"tracing: spans received per service: {received}")
    cpu = {name: {ph: cpu_sum[name][ph] / cpu_n[name][ph] if cpu_n[name][ph] else None
                  for ph in PHASES} for name in cpu_sum}
    notes = _notes(list(sides), SCEN) | _notes(list(sides), "images")
    for row in tracing_rows(ready, cpu, notes):
        res.add(row)
    res.raw[SCEN] = {name: {ph: summary(v) | {"samples": v, "cpu_per_pod_s": cpu[name][ph]}
                            for ph, v in d.items() if v} for name, d in ready.items()}
    res.raw[SCEN]["spans_received"] = received
