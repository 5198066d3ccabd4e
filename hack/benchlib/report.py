"""Results model and its renderings: markdown table, JSON and a PNG bar chart."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from hack.benchlib.stats import ratio

SUBJECT = "crishim"  # the runtime measured; every other column is an anchor


@dataclass
class Row:
    """One measured quantity on every runtime. Values are seconds or bytes (see unit)."""

    metric: str
    unit: str  # "s" (shown as ms) or "B" (shown as MiB)
    values: dict[str, float | None] = field(default_factory=dict)
    # Why a value is missing, e.g. "unsupported (UNIMPLEMENTED)".
    notes: dict[str, str] = field(default_factory=dict)
    # Acceptance target for crishim/anchor, e.g. 0.8 means "ratio must be <= 0.8".
    target: float | None = None
    # The by-hand physical cost of the same work, when one exists.
    floor: float | None = None
    # An absolute bound on crishim's value (same unit), e.g. a p99 of at most 5 ms.
    limit: float | None = None

    def within_limit(self) -> bool | None:
        v = self.values.get(SUBJECT)
        if self.limit is None or v is None or math.isnan(v):
            return None
        return v <= self.limit

    def ratio(self, anchor: str) -> float | None:
        if self.unit not in ("s", "B"):
            return None  # counts (errors) have no meaningful ratio
        return ratio(self.values.get(SUBJECT), self.values.get(anchor))


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

    def anchors(self) -> list[str]:
        """The containerd columns, in the order given (meta "anchors"), else as seen."""
        given: list[str] | None = self.meta.get("anchors")
        if given:
            return list(given)
        seen: dict[str, None] = {}
        for r in self.rows:
            seen.update(dict.fromkeys(k for k in (*r.values, *r.notes) if k != SUBJECT))
        return list(seen) or ["containerd"]


def fmt_value(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "—"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "B":
        return f"{value / (1024 * 1024):.1f} MiB"
    return f"{value:.3g} {unit}".strip()


def short(anchor: str) -> str:
    """"containerd-2.3.4" → "2.3.4" for ratio headers; a bare "containerd" stays."""
    return anchor.removeprefix("containerd-")


def fmt_ratio(q: float | None, target: float | None) -> str:
    if q is None:
        return "—"
    met = "" if target is None else (" ✅" if q <= target else " ❌")
    return f"{q:.2f}x{met}"


def render_markdown(res: Results) -> str:
    anchors = res.anchors()
    ratio_heads = (["ratio"] if len(anchors) == 1
                   else [f"ratio vs {short(a)}" for a in anchors])
    cols = [SUBJECT, *anchors, *ratio_heads, "target", "floor (by hand)"]
    head = (f"| metric | {' | '.join(cols)} |\n"
            f"|---|{'---:|' * len(cols)}\n")
    lines = []
    for r in res.rows:
        cells = []
        for rt in (SUBJECT, *anchors):
            v = r.values.get(rt)
            note = r.notes.get(rt)
            cells.append(note if v is None and note else fmt_value(v, r.unit))
        ok = r.within_limit()
        if ok is not None:
            cells[0] += " ✅" if ok else " ❌"
        cells += [fmt_ratio(r.ratio(a), r.target) for a in anchors]
        goals = ([] if r.target is None else [f"≤ {r.target:.2f}x"]) + \
            ([] if r.limit is None else [f"≤ {fmt_value(r.limit, r.unit)}"])
        cells.append(", ".join(goals))
        cells.append("" if r.floor is None else fmt_value(r.floor, r.unit))
        lines.append(f"| {r.metric} | {' | '.join(cells)} |")
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
    anchors = res.anchors()
    for r in res.rows:
        d = asdict(r)
        d["ratios"] = {a: r.ratio(a) for a in anchors}
        d["ratio"] = r.ratio(anchors[0])  # the first anchor's, as before there were several
        rows.append(d)
    meta = {**res.meta, "anchors": anchors}
    return json.dumps(_clean({"meta": meta, "rows": rows, "raw": res.raw}), indent=2,
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
    anchors = res.anchors()
    rows = [r for r in res.rows if any(r.ratio(a) is not None for a in anchors)]
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.3 * len(rows) * (0.7 + 0.3 * len(anchors))
                                            + 1.5)))
    if rows:
        # One bar per anchor in each row's group; a missing ratio leaves a gap.
        height = 0.8 / len(anchors)
        qs = [q for r in rows for a in anchors if (q := r.ratio(a)) is not None]
        for k, anchor in enumerate(anchors):
            pos = [i - 0.4 + height * (k + 0.5) for i in range(len(rows))]
            ratios = [r.ratio(anchor) for r in rows]
            shown = [(y, q, r) for y, q, r in zip(pos, ratios, rows, strict=True)
                     if q is not None]
            colors = ["tab:green" if q <= (r.target or 1.0) else "tab:red"
                      for _y, q, r in shown]
            # Bars grow from parity (1x) on a log axis: 0.5x and 2x look equally far.
            ax.barh([y for y, _q, _r in shown], [q - 1.0 for _y, q, _r in shown],
                    height=height, left=1.0, color=colors,
                    alpha=1.0 - 0.35 * k / max(1, len(anchors) - 1))
            for y, q, _r in shown:
                ax.text(q, y, f" {q:.2f}x {short(anchor) if len(anchors) > 1 else ''} ",
                        va="center", fontsize=7, ha="left" if q >= 1.0 else "right")
        ax.set_yticks(range(len(rows)), [r.metric for r in rows])
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xlim(min(*qs, 0.5) / 2.2, max(*qs, 2.0) * 2.2)  # room for labels
        for i, r in enumerate(rows):
            if r.target is not None:
                ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="tab:blue",
                        linewidth=2)
        ax.invert_yaxis()
    else:
        ax.text(0.5, 0.5, "no metric measured on crishim and an anchor", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel(f"crishim / {', '.join(anchors)} (lower is better; blue tick = target)")
    ax.set_title(f"crishim vs {', '.join(map(short, anchors))} — {res.meta.get('date', '')} "
                 f"{res.meta.get('mode', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
