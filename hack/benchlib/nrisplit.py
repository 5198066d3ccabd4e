"""Where an NRI pod start's time goes, from crishim's debug log: the plugins' own time
against crishim's.

    sudo hack/bench --scenarios nri --keep --crishim-set 'log_level="debug"'
    python -m hack.benchlib.nrisplit WORKDIR/crishim/crishim.log

At debug level crishim/nri logs each call to a plugin twice: ttRPC's "ttrpc call"
(encode_ms, wait_ms: request written to reply read, the plugin's answer as crishim's
loop sees it, decode_ms), then plugin.py's "NRI call" (its plugin and ms, including the
wait for that plugin's earlier calls); and each event that the CRI call waits for as
"NRI event" (ms; CreateContainer as plugins_ms and apply_ms, the latter with the
validators). Medians per (method, plugin) and per event are printed; an event's ms less
its plugins' waits is crishim's part of it.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

_KV = re.compile(r'(\w+)=("[^"]*"|\S+)')
# The events a pod start (RunPodSandbox + CreateContainer + StartContainer) waits for.
POD_START = ("RunPodSandbox", "CreateContainer", "StartContainer")


@dataclass
class Split:
    """Samples (ms) per (method, plugin) call field and per event field."""

    calls: dict[tuple[str, str], dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    events: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))

    def wait(self, method: str) -> float:
        """The plugins' median waits for `method`, summed over the plugins."""
        return sum(statistics.median(d["wait_ms"]) for (m, _), d in self.calls.items()
                   if m == method and d["wait_ms"])

    def event(self, name: str) -> float:
        """The event's median ms as its CRI call waits for it (CreateContainer's two
        parts summed)."""
        d = self.events.get(name, {})
        return sum(statistics.median(v) for v in d.values() if v)


def parse(lines: Iterable[str]) -> Split:
    out = Split()
    pending: dict[str, str] | None = None
    for line in lines:
        if 'msg="ttrpc call"' in line:
            pending = dict(_KV.findall(line))
        elif 'msg="NRI call"' in line and pending is not None:
            kv = dict(_KV.findall(line))
            d = out.calls[(kv.get("method", "?"), kv.get("plugin", "?"))]
            for f in ("encode_ms", "wait_ms", "decode_ms"):
                if f in pending:
                    d[f].append(float(pending[f]))
            d["call_ms"].append(float(kv.get("ms", "nan")))
            pending = None
        elif 'msg="NRI event"' in line:
            kv = dict(_KV.findall(line))
            for f in ("ms", "plugins_ms", "apply_ms"):
                if f in kv:
                    out.events[kv.get("event", "?")][f].append(float(kv[f]))
    return out


def _med(v: list[float]) -> str:
    return f"{statistics.median(v):7.2f}" if v else "      -"


def render(s: Split) -> str:
    lines = ["| call (method / plugin) | n | encode | wait | decode | call |",
             "|---|---:|---:|---:|---:|---:|"]
    for (m, p), d in sorted(s.calls.items()):
        lines.append(f"| {m} / {p} | {len(d['call_ms'])} | {_med(d['encode_ms'])} | "
                     f"{_med(d['wait_ms'])} | {_med(d['decode_ms'])} | {_med(d['call_ms'])} |")
    lines += ["", "| event on the pod-start path | event ms | plugins' waits | crishim |",
              "|---|---:|---:|---:|"]
    total_event = total_wait = 0.0
    for name in POD_START:
        ev = s.event(name)
        wait = s.wait(name) + (s.wait("ValidateContainerAdjustment")
                               if name == "CreateContainer" else 0.0)
        total_event += ev
        total_wait += wait
        lines.append(f"| {name} | {ev:.2f} | {wait:.2f} | {ev - wait:.2f} |")
    lines.append(f"| pod start | {total_event:.2f} | {total_wait:.2f} | "
                 f"{total_event - total_wait:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], errors="replace") as fh:
        print(render(parse(fh)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
