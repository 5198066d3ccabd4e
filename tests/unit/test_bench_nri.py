"""hack/bench's nri scenario: its rows from per-phase samples, the ratios vs containerd
in the table, NRI's cost per runtime, the note of a containerd without NRI, and the
section of docs/performance.md an NRI run goes to."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.benchlib import ctrdconf, nrisplit, perfdoc
from hack.benchlib.nri import (
    NO_NRI,
    PHASES,
    cost_pct,
    missing_plugins,
    nri_rows,
    phase_order,
    plugin_cmds,
)
from hack.benchlib.report import Results, Row, render_markdown

CRISHIM = {"off": [0.080, 0.082, 0.084], "on": [0.088, 0.090, 0.092],
           "plugins": [0.094, 0.096, 0.098]}
CTRD2 = {"off": [0.140, 0.145, 0.150], "on": [0.148, 0.149, 0.152],
         "plugins": [0.158, 0.160, 0.170]}


def rows_by_metric(notes: dict[str, str] | None = None) -> dict[str, Row]:
    rows = nri_rows({"crishim": CRISHIM, "containerd-2.3.4": CTRD2,
                     "containerd-1.6.20": {"off": [], "on": [], "plugins": []}},
                    notes or {"containerd-1.6.20": NO_NRI})
    return {r.metric: r for r in rows}


def test_p50_per_phase_and_ratio_vs_containerd() -> None:
    rows = rows_by_metric()
    off = rows["NRI off: pod ready p50"]
    on = rows["NRI on, no plugin: pod ready p50"]
    three = rows["NRI on, 3 plugins: pod ready p50"]
    assert off.values["crishim"] == pytest.approx(0.082)
    assert on.values["containerd-2.3.4"] == pytest.approx(0.149)
    assert three.ratio("containerd-2.3.4") == pytest.approx(0.096 / 0.160)
    p90 = rows["NRI on, 3 plugins: pod ready p90"]
    assert p90.values["containerd-2.3.4"] == pytest.approx(0.168)


def test_cost_is_each_runtimes_own_percentage_without_a_cross_ratio() -> None:
    rows = rows_by_metric()
    on = rows["NRI cost: NRI on, no plugin vs NRI off (pod ready p50)"]
    three = rows["NRI cost: NRI on, 3 plugins vs no plugin (pod ready p50)"]
    total = rows["NRI cost: NRI on, 3 plugins vs NRI off (pod ready p50)"]
    assert on.values["crishim"] == pytest.approx((0.090 / 0.082 - 1) * 100)
    assert three.values["containerd-2.3.4"] == pytest.approx((0.160 / 0.149 - 1) * 100)
    assert total.values["crishim"] == pytest.approx((0.096 / 0.082 - 1) * 100)
    # Percentages of two runtimes' own baselines are not compared with each other.
    assert three.ratio("containerd-2.3.4") is None


def test_a_containerd_without_nri_gets_its_note_not_a_number() -> None:
    res = Results(meta={"anchors": ["containerd-1.6.20", "containerd-2.3.4"]})
    for row in rows_by_metric().values():
        res.add(row)
    table = render_markdown(res)
    line = next(ln for ln in table.splitlines() if ln.startswith("| NRI off: pod ready p50"))
    cells = [c.strip() for c in line.split("|")[2:-1]]
    assert cells[:3] == ["82.0 ms", NO_NRI, "145.0 ms"]
    assert cells[3] == "—" and cells[4] == "0.57x"  # no ratio vs 1.6, one vs 2.3.4


def test_cost_pct_needs_both_values() -> None:
    assert cost_pct(0.11, 0.10) == pytest.approx(10.0)
    assert cost_pct(0.09, 0.10) == pytest.approx(-10.0)
    assert cost_pct(None, 0.1) is None and cost_pct(0.1, None) is None
    assert cost_pct(0.1, 0.0) is None


def test_plugins_each_get_their_own_socket_flag(tmp_path: Path) -> None:
    cmds = {c.binary: c for c in plugin_cmds("/tmp/log")}
    assert cmds["nri-logger"].socket_flag == "-socket-path"
    assert cmds["nri-ulimit-adjuster"].socket_flag == "-socket"
    assert cmds["nri-device-injector"].socket_flag == "-socket-path"
    assert [c.idx for c in plugin_cmds("")] == ["10", "20", "30"]
    assert missing_plugins(str(tmp_path)) == list(cmds)


def test_containerd_2_config_turns_nri_off_only_when_asked() -> None:
    paths = ctrdconf.ContainerdPaths(
        root="/r", state="/s", socket="/s/c.sock", runc_root="/rr", shim="/shim",
        cni_bin="/cni", cni_conf="/cnic", certs="/certs", sandbox_image="pause",
        stream_port=1, downloads=3)
    assert "disable = false\n  socket_path = '/s/nri/nri.sock'" in ctrdconf.v3(paths)
    assert "disable = true" in ctrdconf.v3(paths, nri_disable=True)


def test_blocks_alternate_the_phase_order() -> None:
    assert phase_order(0) == PHASES == ("off", "on", "plugins")
    assert phase_order(1) == ("plugins", "on", "off")
    assert phase_order(2) == PHASES


def test_an_nri_run_has_its_own_section_after_the_others(tmp_path: Path) -> None:
    """An NRI run replaces neither the default run's section nor the full node's: it gets
    its own after them, and the next NRI run replaces that one."""
    res = Results(meta={"date": "2026-11-28 17:40 UTC"})
    for row in rows_by_metric().values():
        res.add(row)
    main = Results(meta={"date": "d"})
    main.add(Row("pod ready p50 (Run+Create+Start)", "s", {"crishim": 0.08}))
    assert perfdoc.kind(res) == "nri" and perfdoc.kind(main) == "main"
    doc = tmp_path / "performance.md"
    doc.write_text(f"# P\n\n{perfdoc.MAIN_HEAD}\n\nmain\n\n{perfdoc.DENSITY_HEAD}\n\n"
                   "dense\n\n## Where\n\nkeep\n")
    perfdoc.write(str(doc), res, None)
    text = doc.read_text()
    assert text.index("dense") < text.index(perfdoc.NRI_HEAD) < text.index("## Where")
    assert "NRI cost: NRI on, 3 plugins vs NRI off" in text and "main" in text
    perfdoc.write(str(doc), res, res)
    again = doc.read_text()
    assert again.count(perfdoc.NRI_HEAD) == 1 and "The run before" in again
    assert again.endswith("## Where\n\nkeep\n")


def test_nrisplit_separates_the_plugins_waits_from_crishims_part() -> None:
    """From crishim's debug lines: each call's wait is paired with the plugin named by
    the line after it, and an event's time less its plugins' waits is crishim's."""
    lines = [
        'msg="ttrpc call" method=RunPodSandbox bytes=1 encode_ms=0.05 wait_ms=1.0 '
        'decode_ms=0.01',
        'msg="NRI call" plugin=10-log method=RunPodSandbox ms=1.1',
        'msg="NRI event" event=RunPodSandbox plugins=1 ms=1.25',
        'msg="ttrpc call" method=CreateContainer bytes=1 encode_ms=0.05 wait_ms=2.0 '
        'decode_ms=0.01',
        'msg="NRI call" plugin=10-log method=CreateContainer ms=2.1',
        'msg="ttrpc call" method=CreateContainer bytes=1 encode_ms=0.05 wait_ms=0.5 '
        'decode_ms=0.01',
        'msg="NRI call" plugin=20-adj method=CreateContainer ms=0.6',
        'msg="ttrpc call" method=ValidateContainerAdjustment bytes=1 encode_ms=0.05 '
        'wait_ms=1.5 decode_ms=0.01',
        'msg="NRI call" plugin=10-log method=ValidateContainerAdjustment ms=1.6',
        'msg="NRI event" event=CreateContainer plugins_ms=3.0 apply_ms=1.75',
    ]
    split = nrisplit.parse(lines)
    assert split.wait("CreateContainer") == pytest.approx(2.5)
    assert split.event("CreateContainer") == pytest.approx(4.75)
    table = nrisplit.render(split)
    assert "| CreateContainer | 4.75 | 4.00 | 0.75 |" in table
    assert "| pod start | 6.00 | 5.00 | 1.00 |" in table
