"""Render README's "Performance" section from two bench JSON files (latest first).

    python -m hack.benchlib.readme bench-results/A.json bench-results/B.json [README.md]

With README.md, its "Performance" section is replaced in place (nothing else changes).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from hack.benchlib.anchors import parse_version
from hack.benchlib.report import SUBJECT, Results, Row, fmt_value, render_markdown

KEY_METRICS = ("kubelet 1.32: pod Ready p50 (manifest → all containers Ready)",
               "kubelet 1.32: pod Ready p90", "pod ready p50 (Run+Create+Start)",
               *(f"{rpc} {q}" for rpc in ("CreateContainer", "StartContainer", "StopContainer",
                                          "RemoveContainer") for q in ("p50", "p90")),
               "30 pods @10: wall", "memory per pod (monitor PSS + daemon growth) @30",
               "monitor RSS per pod", "pull 5 layers 120 MiB (cold, median of 3)")

INTRO = """\
`hack/bench` runs crishim and containerd (Debian's 1.6 with its CRI plugin) side by side
on one machine, through the CRI with the project's generated client, alternating A B A B.
Both get the same CNI plugins (bridge + host-local + portmap, each its own bridge and
subnet), the same loopback registry (plain-http `hosts.toml` under `config_path`), the
same images (built by the bench: busybox, a catatonit pause, a 5-layer ~120 MiB image per
pull) and `restrict_oom_score_adj = true` for containerd.

    sudo hack/setup.sh --with-bench   # once: containerd and the bench extra (matplotlib)
    sudo hack/bench                   # 1.5-3 minutes; --quick <1.5; --only crishim|containerd

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
"""


def load(path: str) -> Results:
    with open(path) as fh:
        doc = json.load(fh)
    res = Results(meta=doc["meta"])
    for r in doc["rows"]:
        res.add(Row(r["metric"], r["unit"], r["values"], r.get("notes") or {},
                    r.get("target"), r.get("floor")))
    return res


def _containerds(m: dict[str, Any]) -> str:
    """"containerd 1.6.20, 2.3.4" from the `--version` lines (a dict per anchor; runs from
    before there were several recorded one line)."""
    ctrd = m.get("containerd") or {}
    lines = ctrd.values() if isinstance(ctrd, dict) else [ctrd]
    return "containerd " + ", ".join(parse_version(str(v)) or "?" for v in lines)


def _machine(res: Results) -> str:
    m: dict[str, Any] = res.meta.get("machine", {})
    return (f"{m.get('cpus')} vCPU {m.get('cpu')}, {m.get('memory_gib')} GiB, {m.get('os', '')}, "
            f"kernel {m.get('kernel')}, cgroup v1; {_containerds(m)}; "
            f"{m.get('runc')}; load average {m.get('loadavg_at_start', 0):.0f} to "
            f"{res.meta.get('loadavg_at_end', 0):.0f} (other work on the machine)")


def render(latest: Results, previous: Results) -> str:
    out = ["## Performance", "", INTRO,
           f"Latest full run, {latest.meta.get('date')}, crishim "
           f"{latest.meta.get('machine', {}).get('crishim', '?')} — {_machine(latest)}:", "",
           render_markdown(latest).rstrip(), "",
           f"Reproducibility: the run before it ({previous.meta.get('date')}):", "",
           "| metric | run | crishim | anchor | ratio |", "|---|---|---:|---|---:|"]
    for metric in KEY_METRICS:
        for label, res in (("latest", latest), ("previous", previous)):
            row = res.row(metric)
            if row is None:
                continue
            for anchor in res.anchors():
                q = row.ratio(anchor)
                out.append(f"| {metric} | {label} | "
                           f"{fmt_value(row.values.get(SUBJECT), row.unit)} | {anchor} "
                           f"{fmt_value(row.values.get(anchor), row.unit)} | "
                           f"{'—' if q is None else f'{q:.2f}x'} |")
    out += ["", "The machine is shared with other jobs (see the load average), so numbers "
            "move between runs; the two runs above show by how much.", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    section = render(load(argv[0]), load(argv[1]))
    if len(argv) == 3:
        replace_section(argv[2], section)
    else:
        print(section)
    return 0


def replace_section(readme: str, section: str) -> None:
    """Swap README's "## Performance" section (up to the next "## ") for `section`."""
    with open(readme) as fh:
        text = fh.read()
    start = text.index("## Performance\n")
    nxt = text.find("\n## ", start + 1)
    end = len(text) if nxt < 0 else nxt + 1
    with open(readme, "w") as fh:
        fh.write(text[:start] + section.rstrip("\n") + "\n\n" + text[end:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
