"""hack/bench: crishim vs containerd through the CRI, side by side.

    sudo hack/bench            # full run (5-8 min on 2 cores, by load)
    sudo hack/bench --quick    # 1.5-3 min
    sudo hack/bench --only containerd --scenarios lifecycle -n 5 --keep
    sudo hack/bench --scenarios kubelet --kubelet 1.32 --containerd /opt/ctrd/containerd
    sudo hack/bench --density  # a full node: 110 pods x 2 containers (4-8 min)
    sudo hack/bench --scenarios nri  # pod start with NRI off / on / on with 3 plugins
    sudo hack/bench --scenarios tracing -n 40  # pod start with tracing off / 100% sampled
    sudo hack/bench --only crishim --scenarios quota-stats  # layer usage: walk vs quota
    sudo hack/bench --only crishim --scenarios lifecycle --userns  # hostUsers: false pods

Every scenario runs on crishim and on each containerd given with --containerd PATH[,SHIM]
(default: Debian's /usr/bin/containerd and ../shared/anchors/containerd-2.3.4 when there).

Writes bench-results/bench-<UTC time>.{md,json,png} and prints the markdown table;
--write-doc also puts the results into docs/performance.md (hack/benchlib/perfdoc.py).
Everything it starts (registry, containerd, crishim, pods, mounts, netns, cgroups) is
removed at the end, on Ctrl-C too; a bench killed with SIGKILL is cleaned up by the next.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import fcntl
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from hack.benchlib import density as bdensity
from hack.benchlib import images as bimages
from hack.benchlib import kubelet as bkubelet
from hack.benchlib import nri as bnri
from hack.benchlib import perfdoc, report, scenarios
from hack.benchlib import quotastats as bquota
from hack.benchlib import tracing as btracing
from hack.benchlib.anchors import Anchor, default_specs, resolve_all
from hack.benchlib.floor import NET as FLOOR_NET
from hack.benchlib.floor import Floor
from hack.benchlib.hostclean import (
    PIDFILE,
    WORKDIR_PREFIX,
    clean_stale_workdirs,
    remove_cgroup_tree,
)
from hack.benchlib.runtimes import (
    MAX_ANCHORS,
    REPO_ROOT,
    Containerd,
    Crishim,
    Runtime,
    all_bridges,
)
from hack.benchlib.workload import CGROUP_PARENT
from tests.e2e.registry import Registry
from tests.kubelet.node import KUBELETS


@dataclass
class Plan:
    warmup: int
    lifecycle_n: int
    pods: int
    concurrency: int
    concurrent_reps: int
    list_k: int
    pull_reps: int
    kubelet_rounds: int  # measured pods per runtime
    kubelet_blocks: int  # kubelet starts per runtime (blocks alternate between runtimes)
    # Unmeasured pods after each kubelet start: a kubelet that started less than a probe
    # period ago delays each new probe worker's first probe by a random part of it.
    kubelet_warmup: int
    density_pods: int  # pods of two containers on the full node
    density_mix_s: float  # seconds of the kubelet's steady-state calls at that load
    density_seq: int  # sequential lifecycles next to those pods
    nri_n: int  # measured pods per runtime and NRI phase
    nri_blocks: int  # rounds of the three NRI phases (restarts between them)
    quota_calls: int  # ListContainerStats calls per mode of the quota-stats scenario


QUICK = Plan(warmup=1, lifecycle_n=6, pods=30, concurrency=10, concurrent_reps=1, list_k=5,
             pull_reps=1, kubelet_rounds=3, kubelet_blocks=1, kubelet_warmup=1,
             density_pods=30, density_mix_s=5, density_seq=6, nri_n=6, nri_blocks=1,
             quota_calls=40)
FULL = Plan(warmup=3, lifecycle_n=40, pods=30, concurrency=10, concurrent_reps=2, list_k=20,
            pull_reps=3, kubelet_rounds=10, kubelet_blocks=2, kubelet_warmup=1,
            density_pods=110, density_mix_s=30, density_seq=100, nri_n=48, nri_blocks=4,
            quota_calls=200)
ALL_SCENARIOS = "lifecycle,concurrent,pull,kubelet"
# Not in the default run: density holds a full node per runtime for minutes; nri
# restarts every runtime with NRI off and on, and needs ../shared/bin/nri; tracing
# restarts every runtime with tracing off and on; quota-stats needs a kernel with XFS
# quota support.
EXTRA_SCENARIOS = "density,nri,tracing,quota-stats"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hack/bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run (1.5-3 minutes)")
    p.add_argument("--only", choices=["crishim", "containerd"],
                   help="benchmark crishim only, or the containerd anchors only (debugging)")
    p.add_argument("--containerd", action="append", metavar="PATH[,SHIM]",
                   help="a containerd to compare with (repeatable; SHIM defaults to the "
                   "containerd-shim-runc-v2 beside PATH); default: Debian's and "
                   "../shared/anchors/containerd-2.3.4")
    p.add_argument("--kubelet", default="1.36", choices=sorted(KUBELETS),
                   help="the ../shared/bin kubelet of the kubelet scenario (default 1.36, "
                   "upstream unmodified; 1.32 is the KubeEdge-based build)")
    p.add_argument("--crishim-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a top-level crishim config setting for the run, in TOML (repeatable), "
                   "e.g. daemon_nice=0 to compare a setting's effect")
    p.add_argument("--userns", action="store_true",
                   help="the lifecycle and concurrent pods each in a user namespace of its "
                   "own (the kubelet's hostUsers: false); the by-hand floor is not")
    p.add_argument("--no-floor", action="store_true", help="skip the by-hand floor")
    p.add_argument("--scenarios", default=ALL_SCENARIOS,
                   help=f"comma list of {ALL_SCENARIOS.replace(',', ', ')}, "
                   f"{EXTRA_SCENARIOS.replace(',', ', ')} (default: all but "
                   f"{EXTRA_SCENARIOS.replace(',', ', ')})")
    p.add_argument("--density", action="store_true",
                   help="the full-node scenario alone (= --scenarios density): 110 pods x 2 "
                   "containers, the kubelet's list/status/stats calls, parallel teardown")
    p.add_argument("--pods", type=int, help="pods of the density scenario (default 110)")
    p.add_argument("-n", type=int, help="sequential lifecycle iterations (the density "
                   "scenario's too; the nri and tracing scenarios' pods per runtime and "
                   "phase; the quota-stats scenario's calls per mode)")
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "bench-results"),
                   help="output dir (default bench-results/)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temp work dir (logs) after the run")
    p.add_argument("--write-doc", action="store_true",
                   help="also put this run's results into docs/performance.md, compared "
                   "with the newest earlier run of the same kind in the output dir")
    return p


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        return out.strip().splitlines()[0] if out.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_info(anchors: list[Anchor]) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")),
                   "")
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        mem = int(fh.readline().split()[1]) * 1024
    distro = ""
    with contextlib.suppress(OSError), open("/etc/os-release") as fh:
        distro = next((ln.split("=", 1)[1].strip().strip('"') for ln in fh
                       if ln.startswith("PRETTY_NAME=")), "")
    return {"loadavg_at_start": os.getloadavg()[0], "kernel": platform.release(),
            "os": distro,
            "cpu": cpu, "cpus": os.cpu_count(),
            "memory_gib": round(mem / 2**30, 1),
            "containerd": {a.name: _version([a.binary, "--version"]) for a in anchors},
            "runc": _version(["runc", "--version"]), "conmon": _version(["conmon", "--version"]),
            "python": platform.python_version(), "crishim": crishim_revision()}


def crishim_revision() -> str:
    """The commit measured; "+local changes" when the work tree differs from it."""
    head = _version(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"])
    try:
        dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--",
                                "crishim"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        dirty = ""
    return f"{head}{' +local changes' if dirty else ''}" if head else "unknown"


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # run the same cleanup as Ctrl-C


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("hack/bench: needs root (runtimes create namespaces, mounts and cgroups)",
              file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if args.n:
        plan = dataclasses.replace(plan, lifecycle_n=args.n, density_seq=args.n,
                                   nri_n=args.n, quota_calls=args.n)
    if args.pods:
        plan = dataclasses.replace(plan, density_pods=args.pods)
    if args.userns and args.write_doc:
        print("hack/bench: --userns runs have no section in docs/performance.md; drop "
              "--write-doc", file=sys.stderr)
        return 2
    wanted = {"density"} if args.density else set(args.scenarios.split(","))
    if "tracing" in wanted and args.write_doc:
        print("hack/bench: tracing runs have no section in docs/performance.md (see its "
              "tracing part); drop --write-doc", file=sys.stderr)
        return 2
    if "quota-stats" in wanted and args.write_doc:
        print("hack/bench: quota-stats has no generated section in docs/performance.md "
              "(its numbers are copied by hand); drop --write-doc", file=sys.stderr)
        return 2
    unknown = wanted - set(ALL_SCENARIOS.split(",")) - set(EXTRA_SCENARIOS.split(","))
    if unknown:
        print(f"hack/bench: unknown scenario(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    try:
        anchors = ([] if args.only == "crishim" else
                   resolve_all(args.containerd or default_specs(REPO_ROOT)))
    except ValueError as exc:
        print(f"hack/bench: {exc}", file=sys.stderr)
        return 2
    if len(anchors) > MAX_ANCHORS:
        print(f"hack/bench: at most {MAX_ANCHORS} --containerd", file=sys.stderr)
        return 2
    with_crishim = args.only != "containerd"
    signal.signal(signal.SIGTERM, _on_term)
    # Also when started from a shell that ignores SIGINT in background jobs: kill -INT
    # must clean up like Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    lock = _single_instance()
    started = time.monotonic()
    bridges = [*all_bridges(), FLOOR_NET[1]]
    for stale in clean_stale_workdirs(bridges):
        log(f"cleaned up after an earlier bench that was killed: {stale}")
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    os.chmod(workdir, 0o755)
    with open(os.path.join(workdir, PIDFILE), "w") as fh:
        fh.write(str(os.getpid()))
    registry = Registry()
    runtimes: list[Runtime] = []
    floor: Floor | None = None
    res = report.Results(meta={
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "quick" if args.quick else "full", "plan": plan.__dict__,
        "anchors": [a.name for a in anchors], "scenarios": sorted(wanted),
        "userns": args.userns,
        "argv": " ".join(["hack/bench", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine_info(anchors)})
    try:
        registry.start()
        log(f"registry on {registry.host}; building and pushing the bench images")
        imgs = bimages.push_all(registry.host, catatonit="/usr/bin/catatonit",
                                big_count=plan.pull_reps if "pull" in wanted else 0)
        certs = os.path.join(workdir, "certs.d")
        bimages.write_hosts_toml(certs, registry.host)
        sides: list[scenarios.Side] = []
        todo: list[Runtime] = [Crishim(workdir, certs, args.crishim_set)] if with_crishim else []
        todo += [Containerd(workdir, certs, imgs.pause, a, i) for i, a in enumerate(anchors)]
        for rt in todo:
            name = rt.name
            runtimes.append(rt)
            side = scenarios.Side(rt)
            sides.append(side)
            try:
                rt.start()
                log(f"{name} up on {rt.socket} (pid {rt.proc.pid if rt.proc else '?'})")
            except RuntimeError as exc:
                # The other runtime's column still fills.
                log(f"{name} did not start: {exc}")
                side.failed.update(dict.fromkeys(scenarios.SCENARIOS, "did not start"))
        if not args.no_floor and wanted & {"lifecycle", "concurrent"}:
            assert imgs.pause_image is not None and imgs.busybox_image is not None
            floor = Floor(workdir, imgs.pause_image, imgs.busybox_image)
        scenarios.prepare(sides, imgs, log)
        if "lifecycle" in wanted:
            log(f"lifecycle: {plan.warmup} warm-up + {plan.lifecycle_n} per runtime")
            scenarios.lifecycle(sides, floor, imgs, plan.lifecycle_n, plan.warmup, res, log,
                                userns=args.userns)
        if "concurrent" in wanted:
            log(f"concurrent: {plan.pods} pods @{plan.concurrency} x{plan.concurrent_reps}")
            scenarios.concurrent(sides, floor, imgs, plan.pods, plan.concurrency,
                                 plan.concurrent_reps, plan.list_k, res, log,
                                 userns=args.userns)
        if "pull" in wanted:
            log(f"pull: {plan.pull_reps} cold pulls per runtime")
            scenarios.pull(sides, imgs, plan.pull_reps, res, log)
        if "kubelet" in wanted:
            log(f"kubelet {args.kubelet}: {plan.kubelet_rounds} static pods per runtime in "
                f"{plan.kubelet_blocks} block(s)")
            bkubelet.kubelet_ready(sides, imgs.busybox, args.kubelet, plan.kubelet_rounds,
                                   plan.kubelet_blocks, plan.kubelet_warmup, workdir, res, log)
        if "density" in wanted:
            log(f"density: {plan.density_pods} pods x 2 containers @{plan.concurrency} per "
                "runtime, one runtime at a time")
            bdensity.density(sides, imgs, plan.density_pods, plan.concurrency,
                             plan.density_mix_s, plan.density_seq, res, log)
        if "nri" in wanted:
            # Last: it restarts the runtimes with their NRI set explicitly.
            log(f"nri: {plan.nri_n} pods per runtime and phase in {plan.nri_blocks} "
                "block(s)")
            bnri.nri(sides, imgs, plan.nri_n, plan.nri_blocks, plan.warmup, workdir, res, log)
        if "tracing" in wanted:
            # Last too: it restarts the runtimes with tracing off and on.
            log(f"tracing: {plan.nri_n} pods per runtime and phase")
            btracing.tracing(sides, imgs, plan.nri_n, plan.nri_blocks, plan.warmup, res, log)
        if "quota-stats" in wanted:
            log(f"quota-stats: {plan.pods} pods per mode, writable layers walked vs read "
                "from XFS project quotas")
            bquota.quota_stats(imgs, workdir, certs, plan.pods, plan.quota_calls,
                               plan.warmup, res, log)
        res.meta["duration_s"] = round(time.monotonic() - started, 1)
        res.meta["crishim_settings"] = args.crishim_set
        # Other work on the machine is the main source of noise; say how much there was.
        res.meta["loadavg_at_end"] = os.getloadavg()[0]
        res.meta["unsupported"] = {s.name: s.failed for s in sides}
        res.meta["transient_errors"] = {s.name: s.errors for s in sides}
        for scen in sorted({scen for s in sides for scen in s.errors}):
            res.add(report.Row(f"errors ({scen}; retried, skipped or fatal)", "",
                               {s.name: float(len(s.errors.get(scen, []))) for s in sides}))
        path = write_outputs(res, args.out)
        if args.write_doc:
            write_doc(path, args.out)
        return 0
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        # A second Ctrl-C must not abort the cleanup half-way.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for rt in runtimes:
            try:
                rt.cleanup()
            except Exception as exc:  # keep cleaning the rest
                log(f"{rt.name}: cleanup: {exc}")
        if floor is not None:
            floor.cleanup()
        registry.close()
        remove_cgroup_tree(CGROUP_PARENT)
        if args.keep:
            os.unlink(os.path.join(workdir, PIDFILE))  # a kept dir is not stale
            log(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        lock.close()


LOCK_FILE = "/run/crishim-bench.lock"


def _single_instance() -> IO[str]:
    """One bench per machine: two would share bridges/subnets and spoil each other's
    numbers. Waits for a running one to finish."""
    fh = open(LOCK_FILE, "a+")  # held for the whole run
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"another hack/bench holds {LOCK_FILE}; waiting for it to finish")
        fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def write_doc(latest: str, out_dir: str) -> None:
    """docs/performance.md's section for this kind of run, from `latest` and the newest
    earlier JSON of the same kind (the full-node runs, the NRI runs, or the others)."""
    this = perfdoc.load(latest)
    kind = perfdoc.kind(this)
    for name in sorted(os.listdir(out_dir), reverse=True):
        path = os.path.join(out_dir, name)
        if name.endswith(".json") and path != latest:
            earlier = perfdoc.load(path)
            if perfdoc.kind(earlier) == kind:
                perfdoc.write(perfdoc.DOC, this, earlier)
                log(f"wrote {perfdoc.DOC} from {latest} and {path}")
                return
    if kind == "nri":  # its section stands on its own
        perfdoc.write(perfdoc.DOC, this, None)
        log(f"wrote {perfdoc.DOC} from {latest}")
        return
    log(f"{perfdoc.DOC} not written: no earlier run of this kind in {out_dir} to compare with")


def write_outputs(res: report.Results, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = os.path.join(out_dir, f"bench-{stamp}")
    md = render_header(res) + report.render_markdown(res)
    with open(base + ".md", "w") as fh:
        fh.write(md)
    with open(base + ".json", "w") as fh:
        fh.write(report.to_json(res))
    png = report.render_png(res, base + ".png")
    print(md)
    log(f"wrote {base}.md, {base}.json" + (f", {base}.png" if png else
                                           " (no PNG: pip install '.[bench]')"))
    return base + ".json"


def render_header(res: report.Results) -> str:
    m = res.meta.get("machine", {})
    ctrd = m.get("containerd") or {}
    versions = "; ".join(ctrd.values()) if isinstance(ctrd, dict) else str(ctrd)
    return (f"crishim {m.get('crishim')} vs {', '.join(res.anchors())} — "
            f"{res.meta.get('date')} ({res.meta.get('mode')} run, "
            f"{'user-namespaced pods, ' if res.meta.get('userns') else ''}"
            f"{res.meta.get('duration_s', '?')} s); {m.get('cpus')} CPUs {m.get('cpu')}, "
            f"{m.get('memory_gib')} GiB, kernel {m.get('kernel')}; {versions}; "
            f"{m.get('runc')}; load average {m.get('loadavg_at_start', 0):.1f} at start, "
            f"{res.meta.get('loadavg_at_end', 0):.1f} at end\n\n")
