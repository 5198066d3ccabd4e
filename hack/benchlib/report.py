"""Results model and its renderings: markdown table, JSON and a PNG bar chart."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from hack.benchlib.stats import ratio

RUNTIMES = ("crishim", "containerd")


@dataclass
class Row:
    """One measured quantity for both runtimes. Values are seconds or bytes (see unit)."""

    metric: str
    unit: str  # "s" (shown as ms) or "B" (shown as MiB)
    values: dict[str, float | None] = field(default_factory=dict)
    # Why a value is missing, e.g. "unsupported (UNIMPLEMENTED)".
    notes: dict[str, str] = field(default_factory=dict)
    # Acceptance target for crishim/containerd, e.g. 0.8 means "ratio must be <= 0.8".
    target: float | None = None
    # The by-hand physical cost of the same work, when one exists.
    floor: float | None = None

    def ratio(self) -> float | None:
        if self.unit not in ("s", "B"):
            return None  # counts (errors) have no meaningful ratio
        return ratio(self.values.get("crishim"), self.values.get("containerd"))


@dataclass
class Results:
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    # Raw samples per scenario/runtime for the JSON (seconds / bytes).
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def row(self, metric: str) -> Row | None:
        return next((r for r in self.rows if r.metric == metric), None)


def fmt_value(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "—"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "B":
        return f"{value / (1024 * 1024):.1f} MiB"
    return f"{value:.3g} {unit}".strip()


def render_markdown(res: Results) -> str:
    head = ("| metric | crishim | containerd | ratio | target | floor (by hand) |\n"
            "|---|---:|---:|---:|---:|---:|\n")
    lines = []
    for r in res.rows:
        cells = []
        for rt in RUNTIMES:
            v = r.values.get(rt)
            note = r.notes.get(rt)
            cells.append(note if v is None and note else fmt_value(v, r.unit))
        q = r.ratio()
        ratio_s = "—" if q is None else f"{q:.2f}x"
        if r.target is None:
            target_s = ""
        else:
            met = "" if q is None else (" ✅" if q <= r.target else " ❌")
            target_s = f"≤ {r.target:.2f}x{met}"
        floor_s = "" if r.floor is None else fmt_value(r.floor, r.unit)
        lines.append(f"| {r.metric} | {cells[0]} | {cells[1]} | {ratio_s} | {target_s} "
                     f"| {floor_s} |")
    return head + "\n".join(lines) + "\n"


def _clean(value: Any) -> Any:
    """JSON has no NaN: turn it into null, recursively."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def to_json(res: Results) -> str:
    rows = []
    for r in res.rows:
        d = asdict(r)
        d["ratio"] = r.ratio()
        rows.append(d)
    return json.dumps(_clean({"meta": res.meta, "rows": rows, "raw": res.raw}), indent=2,
                      sort_keys=False)


def render_png(res: Results, path: str) -> bool:
    """Bar chart of crishim/containerd ratios (1.0 = parity). False if matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return False
    rows = [r for r in res.rows if r.ratio() is not None]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.4 * len(rows) + 1.5)))
    if rows:
        names = [r.metric for r in rows]
        ratios = [r.ratio() or 0.0 for r in rows]
        colors = ["tab:green" if q <= (r.target or 1.0) else "tab:red"
                  for q, r in zip(ratios, rows, strict=True)]
        # Bars grow from parity (1x) on a log axis: 0.5x and 2x look equally far from it.
        ax.barh(names, [q - 1.0 for q in ratios], left=1.0, color=colors)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xlim(min(*ratios, 0.5) / 1.8, max(*ratios, 2.0) * 1.8)  # room for labels
        for i, q in enumerate(ratios):
            ax.text(q, i, f" {q:.2f}x ", va="center", fontsize=8,
                    ha="left" if q >= 1.0 else "right")
        for i, r in enumerate(rows):
            if r.target is not None:
                ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="tab:blue",
                        linewidth=2)
        ax.invert_yaxis()
    else:
        ax.text(0.5, 0.5, "no metric measured on both runtimes", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel("crishim / containerd (lower is better; blue tick = target)")
    ax.set_title(f"crishim vs containerd — {res.meta.get('date', '')} "
                 f"{res.meta.get('mode', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
