"""The nri scenario: pod start with NRI off, on with no plugin, and on with three plugins.

Each runtime is restarted with NRI off, then on (its socket under the bench's work dir),
then the containerd/nri sample plugins of ../shared/bin/nri (nri-logger,
nri-ulimit-adjuster, nri-device-injector) are connected to each runtime's own socket.
In every phase the runtimes take turns, one pod lifecycle each (A B A B ...), and the
phases repeat in blocks, every other block in reverse order (off on 3 / 3 on off), so
that a drift in the machine's load spreads over all of them alike.
containerd 1.x has no NRI on by default (1.6 none at all): its cells stay empty, with a
note.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hack.benchlib.images import BenchImages
from hack.benchlib.phases import alternate, restart
from hack.benchlib.report import Results, Row
from hack.benchlib.runtimes import REPO_ROOT, Runtime
from hack.benchlib.scenarios import Side, _notes, _one_lifecycle, _transient
from hack.benchlib.stats import p50, p90, summary

Progress = Callable[[str], None]
SCEN = "nri"
# Phase keys and how the rows name them.
OFF, ON, PLUGINS = "off", "on", "plugins"
PHASES = (OFF, ON, PLUGINS)
PHASE_NAMES = {OFF: "NRI off", ON: "NRI on, no plugin", PLUGINS: "NRI on, 3 plugins"}
NO_NRI = "no NRI (containerd 1.x)"
PLUGIN_DIR = os.path.join(os.path.dirname(REPO_ROOT), "shared", "bin", "nri")
REGISTER_TIMEOUT = 15.0


@dataclass(frozen=True)
class PluginCmd:
    binary: str
    idx: str
    socket_flag: str  # the samples disagree: -socket or -socket-path
    extra: tuple[str, ...] = ()


def plugin_cmds(log_file: str) -> list[PluginCmd]:
    """The three plugins, in the index order the docs show (docs/nri.md)."""
    return [PluginCmd("nri-logger", "10", "-socket-path", ("-log-file", log_file)),
            PluginCmd("nri-ulimit-adjuster", "20", "-socket"),
            PluginCmd("nri-device-injector", "30", "-socket-path")]


def missing_plugins(plugin_dir: str = PLUGIN_DIR) -> list[str]:
    return [c.binary for c in plugin_cmds("") if
            not os.access(os.path.join(plugin_dir, c.binary), os.X_OK)]


def cost_pct(value: float | None, base: float | None) -> float | None:
    """How much slower `value` is than `base`, in percent (negative: faster)."""
    if value is None or base is None or base <= 0 or math.isnan(value) or math.isnan(base):
        return None
    return (value / base - 1.0) * 100.0


def nri_rows(samples: dict[str, dict[str, list[float]]], notes: dict[str, str]
             ) -> list[Row]:
    """Rows of the scenario from each runtime's pod-ready samples per phase: p50 and
    p90 per phase (their ratios vs the anchors come with the table), then what NRI
    costs each runtime, as a percentage of its own p50 (no ratio across runtimes)."""

    def per(phase: str, fn: Callable[[list[float]], float]) -> dict[str, float | None]:
        return {name: fn(d[phase]) if d.get(phase) else None for name, d in samples.items()}

    rows = []
    for phase in PHASES:
        rows.append(Row(f"{PHASE_NAMES[phase]}: pod ready p50", "s", per(phase, p50),
                        dict(notes)))
    for phase in PHASES:
        rows.append(Row(f"{PHASE_NAMES[phase]}: pod ready p90", "s", per(phase, p90),
                        dict(notes)))
    mid = {ph: per(ph, p50) for ph in PHASES}
    for label, a, b in (("NRI on, no plugin vs NRI off", ON, OFF),
                        ("NRI on, 3 plugins vs no plugin", PLUGINS, ON),
                        ("NRI on, 3 plugins vs NRI off", PLUGINS, OFF)):
        rows.append(Row(f"NRI cost: {label} (pod ready p50)", "%",
                        {name: cost_pct(mid[a][name], mid[b][name]) for name in samples},
                        dict(notes)))
    return rows


class Plugins:
    """The three sample plugins connected to one runtime's NRI socket."""

    def __init__(self, side: Side, workdir: str, plugin_dir: str = PLUGIN_DIR) -> None:
        self.side = side
        self.dir = os.path.join(workdir, "nri-plugins", side.name)
        os.makedirs(self.dir, exist_ok=True)
        self.plugin_dir = plugin_dir
        self.log_file = os.path.join(self.dir, "nri-logger.log")
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        sock = self.side.runtime.nri_socket
        with open(self.log_file, "w"):
            pass  # a fresh log: registration is read from it
        for c in plugin_cmds(self.log_file):
            out = open(os.path.join(self.dir, f"{c.binary}.out"), "ab")
            try:
                self.procs.append(subprocess.Popen(
                    [os.path.join(self.plugin_dir, c.binary), "-idx", c.idx,
                     c.socket_flag, sock, *c.extra],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            finally:
                out.close()
        self._wait_registered()

    def _wait_registered(self) -> None:
        """The logger is synchronized (so registered and configured), and every plugin is
        still up (a sample exits when its connection fails)."""
        deadline = time.monotonic() + REGISTER_TIMEOUT
        while time.monotonic() < deadline:
            dead = [c.binary for c, p in zip(plugin_cmds(""), self.procs, strict=False)
                    if p.poll() is not None]
            if dead:
                raise RuntimeError(f"NRI plugin(s) exited: {', '.join(dead)} "
                                   f"(see {self.dir})")
            with open(self.log_file, errors="replace") as fh:
                if "ynchroniz" in fh.read():
                    time.sleep(0.5)  # the two adjusters register next to it
                    if all(p.poll() is None for p in self.procs):
                        return
            time.sleep(0.1)
        raise RuntimeError(f"NRI plugins did not register within {REGISTER_TIMEOUT}s "
                           f"(see {self.dir})")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def phase_order(block: int) -> tuple[str, ...]:
    return alternate(PHASES, block)


def _restart(side: Side, nri_on: bool, log: Progress) -> bool:
    def change(rt: Runtime) -> None:
        rt.nri = nri_on
    return restart(side, SCEN, f"NRI {'on' if nri_on else 'off'}", change, log)


def nri(sides: Sequence[Side], images: BenchImages, n: int, blocks: int, warmup: int,
        workdir: str, res: Results, log: Progress) -> None:
    """Pod ready (Run+Create+Start) per phase: `n` pods per runtime and phase, over
    `blocks` rounds of the three phases, each phase after `warmup` unmeasured pods."""
    if missing := missing_plugins():
        for s in sides:
            s.failed.setdefault(SCEN, f"no {', '.join(missing)} in {PLUGIN_DIR}")
    for s in sides:
        if not s.runtime.nri_socket:
            s.failed.setdefault(SCEN, NO_NRI)
    live = [s for s in sides if SCEN not in s.failed and "images" not in s.failed]
    samples: dict[str, dict[str, list[float]]] = {s.name: {p: [] for p in PHASES}
                                                  for s in sides}
    plugins: list[Plugins] = []
    per_block = [n // blocks + (1 if b < n % blocks else 0) for b in range(blocks)]
    try:
        for b, count in enumerate(per_block):
            for phase in phase_order(b):
                for p in plugins:
                    p.stop()
                plugins = []
                for s in live:
                    # A restart only where the NRI setting changes.
                    if SCEN not in s.failed and s.runtime.nri != (phase != OFF):
                        _restart(s, phase != OFF, log)
                if phase == PLUGINS:
                    for s in live:
                        if SCEN in s.failed:
                            continue
                        pl = Plugins(s, workdir)
                        plugins.append(pl)
                        try:
                            pl.start()
                        except RuntimeError as exc:
                            log(f"{s.name}: {exc}")
                            s.failed.setdefault(SCEN, "NRI plugins did not register")
                log(f"nri block {b + 1}/{blocks}: {PHASE_NAMES[phase]}: {warmup} warm-up "
                    f"+ {count} per runtime")
                for i in range(warmup + count):
                    for s in live:
                        if SCEN in s.failed:
                            continue
                        try:
                            pod = _one_lifecycle(s, images, f"nri-{phase}-{b}-{i}",
                                                 verify=i == warmup, userns=False)
                        except Exception as exc:
                            if not _transient(s, SCEN, exc, log):
                                log(f"{s.name}: nri: {s.note(SCEN, exc)}")
                            continue
                        if i >= warmup:
                            samples[s.name][phase].append(pod.ready)
    finally:
        for p in plugins:
            p.stop()
    notes = _notes(list(sides), SCEN) | _notes(list(sides), "images")
    for row in nri_rows(samples, notes):
        res.add(row)
    res.raw[SCEN] = {name: {ph: summary(v) | {"samples": v} for ph, v in d.items() if v}
                     for name, d in samples.items()}
