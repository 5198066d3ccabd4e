"""Write docs/performance.md's results from bench JSON files (the one shown in full
first, the one it is compared with second: earlier, or a run of some scenarios).

    python -m hack.benchlib.perfdoc A.json B.json [MORE.json ...] [DOC.md | -]
    python -m hack.benchlib.perfdoc --density A.json B.json [DOC.md | -]

Each further JSON (a run of some scenarios, e.g. `--scenarios kubelet --kubelet 1.32`) is
shown as its own table after those two. `--density` renders only the full-node section
(`hack/bench --density`: A in full, then the goals of A and B side by side). A run of
`--scenarios nri` alone goes to the NRI section (A in full, B's cost rows; B optional).

The document (default docs/performance.md; `-` prints instead) has one section per kind
of run; only that section is replaced, the rest of the page is kept as it is.
`hack/bench --write-doc` calls this after a run, with the newest earlier run of the
same kind.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from hack.benchlib.anchors import parse_version
from hack.benchlib.report import SUBJECT, Results, Row, fmt_value, render_markdown

KEY_METRICS = (*(f"kubelet {v}: pod Ready {q}" for v in ("1.36", "1.32")
                 for q in ("p50 (manifest → all containers Ready)", "p90")),
               "pod ready p50 (Run+Create+Start)",
               *(f"{rpc} {q}" for rpc in ("CreateContainer", "StartContainer", "StopContainer",
                                          "RemoveContainer") for q in ("p50", "p90")),
               "30 pods @10: wall", "memory per pod (monitor PSS + daemon growth) @30",
               "monitor RSS per pod", "pull 5 layers 120 MiB (cold, median of 3)")

INTRO = """\
`hack/bench` runs crishim and each containerd anchor side by side on one machine, through
the CRI with the project's generated client, alternating A B C A B C. The anchors are
Debian's containerd 1.6 and containerd 2.3.4 (`../shared/anchors/containerd-2.3.4`; most
clusters run 2.x); `--containerd PATH[,SHIM]` (repeatable) compares with whichever
containerd you would pick instead, and every scenario gets a column and a ratio per anchor.
All get the same CNI plugins (bridge + host-local + portmap, each its own bridge and
subnet), the same loopback registry (plain-http `hosts.toml` under `config_path`), the
same images (built by the bench: busybox, a catatonit pause, a 5-layer ~120 MiB image per
pull) and `restrict_oom_score_adj = true` for containerd (config format 2 for 1.x, 3 for
2.x, each with its own shim, root, state and runc root).

    sudo hack/setup.sh --with-bench   # once: containerd and the bench extra (matplotlib)
    sudo hack/bench                   # 5-8 minutes; --quick 1.5-3; --only crishim|containerd
    sudo hack/bench --scenarios kubelet --kubelet 1.36   # one scenario, the newer kubelet
    sudo hack/bench --density         # a full node, 110 pods x 2 (not in the default run)
    sudo hack/bench --scenarios nri   # NRI off / on / 3 plugins (docs/nri.md; not default)

Each run writes `bench-results/bench-<time>.{md,json,png}` (JSON holds every sample).
Pod ready = RunPodSandbox + CreateContainer + StartContainer (sequential, after warm-up).
Memory per pod = the monitors' PSS (one conmon per container; the pause runs without a
monitor) vs containerd-shim-runc-v2 per pod, plus the daemon's RSS growth, over 30
running pods; the monitors' RSS is reported too. Container RPCs are timed one by one in
the sequential lifecycle (the workload exits on SIGTERM at once). The floor
is the same pod made by hand (`ip netns add`, the CNI plugins alongside the pause's
`runc create` + exec-fifo start, `mount` of the overlay, the container's `runc create`)
from Python subprocesses: a reference, not a strict lower bound: it spawns tools where a
daemon can work in-process, so a runtime can come in under it. Before its numbers count,
the bench checks that each pod really runs and has an IP from its runtime's subnet.
Before StopContainer is timed, the bench waits (untimed) until the workload's shell
catches SIGTERM (`SigCgt` in /proc): a container's init ignores a signal it has no
handler for, so an earlier Stop would time the 10 s timeout instead of the runtime.

The kubelet scenario is the node's view: a stock kubelet from `../shared/bin` (1.36,
upstream unmodified, by default; `--kubelet 1.32` for the KubeEdge-based build) runs the
same static pod on each runtime, 10 pods each (3 with `--quick`), restarted on a fresh
root per runtime in alternating blocks. The pod has two busybox containers with
cpu/memory limits and a readiness probe each (httpGet and exec, `periodSeconds: 1`).
Measured: manifest written (`fileCheckFrequency: 1s`, inotify) to every container Ready
in the kubelet's own `/pods` (read-only port, polled every 50 ms).
That includes the kubelet's pod worker, its PLEG and status updates and the probes. With
kubelet 1.32 it moves in steps of about a second (PLEG's 1 s relist and the 1 s probe
period), so p50 is about 1 s on every runtime and only the p90 shows who misses a tick;
1.36 reports a started container sooner and shows the runtime's share. "All containers
running" (before the probes) and the teardown (manifest removed to sandbox stopped) are
reported beside it.
"""


def load(path: str) -> Results:
    with open(path) as fh:
        doc = json.load(fh)
    res = Results(meta=doc["meta"])
    for r in doc["rows"]:
        res.add(Row(r["metric"], r["unit"], r["values"], r.get("notes") or {},
                    r.get("target"), r.get("floor"), r.get("limit")))
    return res


def _containerds(m: dict[str, Any]) -> str:
    """"containerd 1.6.20, 2.3.4" from the `--version` lines (a dict per anchor; runs from
    before there were several recorded one line)."""
    ctrd = m.get("containerd") or {}
    lines = ctrd.values() if isinstance(ctrd, dict) else [ctrd]
    return "containerd " + ", ".join(parse_version(str(v)) or "?" for v in lines)


def _given(res: Results) -> str:
    """"crishim with log_level=...; " for a run given --crishim-set, else empty: a run
    with other settings is not the default daemon, in its own header or as the run
    before."""
    settings = res.meta.get("crishim_settings") or []
    return f"crishim with {', '.join(settings)}; " if settings else ""


def _load(res: Results) -> str:
    return (f"load average {res.meta.get('machine', {}).get('loadavg_at_start', 0):.0f} "
            f"to {res.meta.get('loadavg_at_end', 0):.0f}")


def _machine(res: Results) -> str:
    m: dict[str, Any] = res.meta.get("machine", {})
    return (f"{_given(res)}{m.get('cpus')} vCPU {m.get('cpu')}, {m.get('memory_gib')} GiB, "
            f"{m.get('os', '')}, "
            f"kernel {m.get('kernel')}, cgroup v1; {_containerds(m)}; "
            f"{m.get('runc')}; {_load(res)} (other work on the machine)")


def render(latest: Results, previous: Results, more: tuple[Results, ...] = ()) -> str:
    out = [MAIN_HEAD, "", INTRO,
           f"Latest full run, {latest.meta.get('date')} — {_machine(latest)}:", "",
           render_markdown(latest).rstrip(), "",
           f"Reproducibility: another full run ({previous.meta.get('date')}, "
           f"{_given(previous)}{_load(previous)}; the metrics it measured):", "",
           "| metric | run | crishim | anchor | ratio |", "|---|---|---:|---|---:|"]
    for metric in KEY_METRICS:
        if latest.row(metric) is None or previous.row(metric) is None:
            continue  # only what both runs measured says anything about reproducibility
        for res in (latest, previous):
            row = res.row(metric)
            assert row is not None
            label = str(res.meta.get("date", "?")).split(" ", 1)[-1]  # "04:27 UTC"
            for anchor in res.anchors():
                q = row.ratio(anchor)
                out.append(f"| {metric} | {label} | "
                           f"{fmt_value(row.values.get(SUBJECT), row.unit)} | {anchor} "
                           f"{fmt_value(row.values.get(anchor), row.unit)} | "
                           f"{'—' if q is None else f'{q:.2f}x'} |")
    out += ["", "The machine is shared with other jobs (see the load average), so numbers "
            "move between runs; the two runs above show by how much.", ""]
    for res in more:
        plan = res.meta.get("plan", {})
        cmd = res.meta.get("argv")
        what = f"`{cmd}`" if cmd else f"a {res.meta.get('mode', '')} run of these scenarios"
        out += [f"Also {res.meta.get('date')}, {what} "
                f"({plan.get('kubelet_rounds', '?')} kubelet pods per runtime; {_load(res)}):",
                "", render_markdown(res).rstrip(), ""]
    return "\n".join(out)


MAIN_HEAD = "## The default run (`hack/bench`)"
DENSITY_HEAD = "## A full node (`hack/bench --density`)"
NRI_HEAD = "## NRI's cost (`hack/bench --scenarios nri`)"
# The generated sections, in the page's order.
GENERATED = (MAIN_HEAD, DENSITY_HEAD, NRI_HEAD)

NRI_INTRO = """\
`sudo hack/bench --scenarios nri` (hack/benchlib/nri.py, not in the default run) restarts
each runtime with NRI off, then on, then with nri-logger, nri-ulimit-adjuster and
nri-device-injector connected; the runtimes take turns pod by pod, in blocks of the three
phases, every other block in reverse order. Pod ready = RunPodSandbox + CreateContainer +
StartContainer. The cost rows compare a runtime with itself. docs/nri.md splits the
plugins' own time from crishim's."""

DENSITY_INTRO = """\
`sudo hack/bench --density` (5-8 minutes; `--pods N`, `--only crishim`) gives each runtime
in turn a full node, once the host is quiet (95% idle over a second, waited for up to a
minute, so that no runtime is measured next to the last one's or other work): 110 pods
of two busybox containers started at concurrency 10 (wall
and per-pod ready), while a second client in its own process loops Version (it does no
work: its latency is the daemon's event-loop lag) and the two lists PLEG makes, whose p99
counts from when 90 pods were ready (about 100 listed while 10 start). Then 30 s of the
kubelet's steady calls: every second ListPodSandbox + ListContainers, 5 pods' status
(PodSandboxStatus + ListContainers by pod), 10 ContainerStatus; every 5 s
ListContainerStats + ListPodSandboxStats. Then 100 sequential lifecycles next to those
pods, of a container that ignores SIGTERM with StopContainer timeout 0 (each RPC's p99
against its p50, timed through the thin client below; of fewer calls the p99 would be
their slowest), and a parallel teardown
(StopPodSandbox + RemovePodSandbox at concurrency 10). Daemon RSS before the first pod
and at 110. Limits in the target column are absolute bounds on crishim's value.
Version's p99 before the ramp shows how much of the lag is the machine's own (2 vCPUs,
shared).

While pods start, the probe itself often waits for a CPU: after the answer has arrived,
its thread is runnable but not running, for up to tens of milliseconds. The kernel counts
that wait per thread (`/proc/thread-self/schedstat`), so the probe takes it out of each
call's time: the probe's rows are the runtime's share. The lists' times as timed, and the
probe's own wait, have rows of their own. The sequential lifecycle's times are the
runtime's share too: less the client's wait for a CPU once its request is out (a reply
that wakes it on a CPU a kworker holds waits up to a millisecond or two); its p99 as
timed has a row of its own.

The probe and the relist go through a thin client (`hack/benchlib/h2unary.py`: HTTP/2
frames written by hand, blocking reads in the calling thread into one buffer kept for
the connection, as grpc-go keeps its read buffers), so that they time the server:
grpcio's client hands each call between its own threads, which adds half a millisecond
to a millisecond and more on this VM whatever the server and squeezes every ratio
towards 1. Its requests carry the kubelet's headers (grpc-go's fields and the
kubelet's two-minute deadline, HPACK-encoded with indexing, as grpc-go sends them), and
are encoded before the timer starts. The relist
through grpcio's client, half a tick later, is shown for reference. The floor of the
two list rows is the very reply crishim sent, served by crishim's own gRPC server doing
nothing else (`hack/benchlib/listfloor.py`) and timed the same way: what the call costs
before any CRI work."""


def render_nri(latest: Results, previous: Results | None) -> str:
    out = [NRI_HEAD, "", NRI_INTRO, "",
           f"Run {latest.meta.get('date')} — {_machine(latest)}:", "",
           render_markdown(latest).rstrip(), ""]
    costs = [r for r in latest.rows if r.metric.startswith("NRI cost")]
    if previous is not None and costs:
        out += [f"The run before ({previous.meta.get('date')}, {_given(previous)}"
                f"{_load(previous)}): "
                + "; ".join(f"{r.metric.removeprefix('NRI cost: ')} "
                            + ", ".join(f"{name} {fmt_value(v, r.unit)}"
                                        for name, v in r.values.items())
                            for r in previous.rows if r.metric.startswith("NRI cost")) + ".",
                ""]
    return "\n".join(out)


def _density_goals(res: Results) -> list[Row]:
    return [r for r in res.rows if r.metric.startswith("density:")
            and (r.target is not None or r.limit is not None)]


def render_density(latest: Results, previous: Results) -> str:
    out = [DENSITY_HEAD, "", DENSITY_INTRO, "",
           f"Run {latest.meta.get('date')} — {_machine(latest)}:", "",
           render_markdown(latest).rstrip(), ""]
    anchors = latest.anchors()
    label = {id(r): str(r.meta.get("date", "?")).split(" ", 1)[-1] for r in (latest, previous)}
    out += [f"Both runs' goals ({label[id(latest)]}, and {previous.meta.get('date')}, "
            f"{_given(previous)}{_load(previous)}):", "",
            "| metric | goal | " + " | ".join(
                f"{label[id(r)]} crishim | {label[id(r)]} " + " / ".join(
                    f"vs {a.removeprefix('containerd-')}" for a in anchors)
                for r in (latest, previous)) + " |",
            "|---|---|" + "---:|---:|" * 2]
    for row in _density_goals(latest):
        goal = (f"≤ {row.target:.2f}x" if row.target is not None else
                "≤ 2x p50" if "2x its p50" in row.metric else
                f"≤ {fmt_value(row.limit, row.unit)}")
        cells = []
        for res in (latest, previous):
            r = res.row(row.metric)
            if r is None:
                cells += ["—", "—"]
                continue
            ok = r.within_limit()
            mark = "" if ok is None else (" ✅" if ok else " ❌")
            ratios = []
            for a in anchors:
                q = r.ratio(a)
                met = "" if q is None or r.target is None else \
                    (" ✅" if q <= r.target else " ❌")
                ratios.append("—" if q is None else f"{q:.2f}x{met}")
            cells += [fmt_value(r.values.get(SUBJECT), r.unit) + mark, " / ".join(ratios)]
        out.append(f"| {row.metric.removeprefix('density: ')} | {goal} | "
                   f"{' | '.join(cells)} |")
    return "\n".join(out) + "\n"


DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "performance.md")


def replace(doc: str, head: str, section: str) -> None:
    """Swap the section that starts with `head` (to the next "## " heading) for
    `section`. A page without it gets it after the other generated section, or before
    its first section; the hand-written sections are kept as they are."""
    with open(doc) as fh:
        text = fh.read()
    start = text.find(head + "\n")
    if start < 0:
        # After the generated sections there are, else before the first section.
        ends = [_section_end(text, at) for h in GENERATED
                if (at := text.find(h + "\n")) >= 0]
        start = max(ends) if ends else text.find("\n## ") + 1
        if start <= 0:
            start = len(text)
        end = start
    else:
        end = _section_end(text, start)
    with open(doc, "w") as fh:
        fh.write(text[:start] + section.rstrip("\n") + "\n\n" + text[end:].lstrip("\n"))


def _section_end(text: str, start: int) -> int:
    nxt = text.find("\n## ", start + 1)
    return len(text) if nxt < 0 else nxt + 1


def write(doc: str, latest: Results, previous: Results | None,
          more: tuple[Results, ...] = ()) -> None:
    """The section of `latest`'s kind (full node, NRI or default run) in `doc`; only an
    NRI run goes without a `previous`."""
    if is_nri(latest):
        replace(doc, NRI_HEAD, render_nri(latest, previous))
        return
    assert previous is not None
    if is_density(latest):
        replace(doc, DENSITY_HEAD, render_density(latest, previous))
    else:
        replace(doc, MAIN_HEAD, render(latest, previous, more))


def is_density(res: Results) -> bool:
    return bool(res.rows) and all(r.metric.startswith(("density:", "errors"))
                                  for r in res.rows)


def is_nri(res: Results) -> bool:
    """A `--scenarios nri` run: its rows are all the nri scenario's."""
    return bool(res.rows) and all(r.metric.startswith(("NRI ", "errors"))
                                  for r in res.rows)


def kind(res: Results) -> str:
    """Which section a run's results go to: "density", "nri" or "main"."""
    return "density" if is_density(res) else "nri" if is_nri(res) else "main"


def main(argv: list[str]) -> int:
    density = bool(argv) and argv[0] == "--density"
    if density:
        argv = argv[1:]
    doc = argv.pop() if argv and not argv[-1].endswith(".json") else DOC
    runs = [load(a) for a in argv]
    if not runs or (len(runs) < 2 and not is_nri(runs[0])) or (density and len(runs) != 2):
        print(__doc__, file=sys.stderr)
        return 2
    if is_nri(runs[0]):
        head, section = NRI_HEAD, render_nri(runs[0], runs[1] if len(runs) > 1 else None)
    elif density:
        head, section = DENSITY_HEAD, render_density(runs[0], runs[1])
    else:
        head, section = MAIN_HEAD, render(runs[0], runs[1], tuple(runs[2:]))
    if doc == "-":
        print(section)
    else:
        replace(doc, head, section)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
