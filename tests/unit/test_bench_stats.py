"""hack/bench's pure pieces: percentiles and the results table."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hack.benchlib.perfdoc import MAIN_HEAD, replace
from hack.benchlib.report import Results, Row, fmt_value, render_markdown, to_json
from hack.benchlib.stats import p50, p90, percentile, ratio, summary


def test_percentiles_interpolate_between_samples() -> None:
    data = [0.4, 0.1, 0.3, 0.2, 0.5]  # unsorted on purpose
    assert p50(data) == 0.3
    assert math.isclose(p90(data), 0.46)
    assert percentile(data, 0) == 0.1 and percentile(data, 100) == 0.5
    assert p50([7.0]) == 7.0
    assert math.isnan(p50([]))


def test_summary_and_ratio() -> None:
    s = summary([1.0, 2.0, 3.0])
    assert s["p50"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0 and s["n"] == 3
    assert ratio(1.0, 2.0) == 0.5
    assert ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    assert ratio(math.nan, 1.0) is None


def test_markdown_shows_ratio_target_and_unsupported_side() -> None:
    res = Results(meta={"date": "d"})
    res.add(Row("pod ready p50", "s", {"crishim": 0.1, "containerd": 0.2}, target=0.8,
                floor=0.05))
    res.add(Row("pull", "s", {"crishim": None, "containerd": 1.5},
                notes={"crishim": "unsupported (UNIMPLEMENTED PullImage)"}, target=1.0))
    res.add(Row("daemon RSS", "B", {"crishim": 60 * 2**20, "containerd": 30 * 2**20}))
    md = render_markdown(res)
    lines = md.splitlines()
    assert lines[0].startswith("| metric | crishim | containerd | ratio |")
    assert lines[2] == "| pod ready p50 | 100.0 ms | 200.0 ms | 0.50x ✅ | ≤ 0.80x | 50.0 ms |"
    assert "unsupported (UNIMPLEMENTED PullImage) | 1.50 s | — | ≤ 1.00x |" in lines[3]
    assert "| 60.0 MiB | 30.0 MiB | 2.00x |" in lines[4]


def test_json_has_ratios_and_no_nan() -> None:
    res = Results()
    res.add(Row("x", "s", {"crishim": 3.0, "containerd": 2.0}))
    res.raw["x"] = {"p50": math.nan}
    doc = json.loads(to_json(res))
    assert doc["rows"][0]["ratio"] == 1.5
    assert doc["raw"]["x"]["p50"] is None


def test_fmt_value_units() -> None:
    assert fmt_value(0.0123, "s") == "12.3 ms"
    assert fmt_value(12.5, "s") == "12.50 s"
    assert fmt_value(None, "s") == "—"
    assert fmt_value(1.5 * 2**20, "B") == "1.5 MiB"


def test_perfdoc_section_is_replaced_in_place(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text(f"# x\n\n{MAIN_HEAD}\n\nold numbers\n\n## Where\n\nkeep\n")
    replace(str(doc), MAIN_HEAD, f"{MAIN_HEAD}\n\nnew table\n")
    assert doc.read_text() == f"# x\n\n{MAIN_HEAD}\n\nnew table\n\n## Where\n\nkeep\n"
