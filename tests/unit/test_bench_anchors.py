"""hack/bench with several containerd anchors: names, config formats, columns, ratios."""

from __future__ import annotations

import json
import pathlib
import tomllib

from hack.benchlib import ctrdconf
from hack.benchlib.anchors import Anchor, parse_spec, parse_version
from hack.benchlib.perfdoc import _containerds
from hack.benchlib.report import Results, Row, render_markdown, to_json
from hack.benchlib.runtimes import MAX_ANCHORS, Crishim, all_bridges, anchor_network

DEBIAN = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
V2 = "containerd github.com/containerd/containerd/v2 v2.3.4 db8809540e1a7a9da5d51887689"


def test_version_and_name_from_version_output() -> None:
    assert parse_version(DEBIAN) == "1.6.20"
    assert parse_version(V2) == "2.3.4"
    assert parse_version("garbage") == ""
    assert Anchor("/c", "/s", "2.3.4").name == "containerd-2.3.4"
    assert Anchor("/c", "/s", "2.3.4").major == 2
    assert Anchor("/c", "/s", "").name == "containerd"
    assert Anchor("/c", "/s", "").major == 1


def test_spec_takes_an_explicit_shim_else_the_one_beside_it() -> None:
    assert parse_spec("/opt/c/containerd,/opt/s/shim") == ("/opt/c/containerd", "/opt/s/shim")
    # No shim beside /nonexistent: the host's, as containerd on PATH would find.
    assert parse_spec("/nonexistent/containerd")[1] == "/usr/bin/containerd-shim-runc-v2"


def test_each_anchor_has_its_own_network() -> None:
    nets = [anchor_network(i) for i in range(MAX_ANCHORS)]
    assert len({n.subnet for n in nets}) == len({n.bridge for n in nets}) == MAX_ANCHORS
    assert all(len(n.bridge) <= 15 for n in nets)
    assert set(all_bridges()) >= {n.bridge for n in nets}


def _paths() -> ctrdconf.ContainerdPaths:
    return ctrdconf.ContainerdPaths(
        root="/w/root", state="/w/state", socket="/w/c.sock", runc_root="/w/runc",
        shim="/a/containerd-shim-runc-v2", cni_bin="/opt/cni/bin", cni_conf="/w/cni",
        certs="/w/certs.d", sandbox_image="reg/pause:bench", stream_port=1234, downloads=3)


def test_config_formats_say_the_same_things() -> None:
    v2 = tomllib.loads(ctrdconf.v2(_paths()))
    v3 = tomllib.loads(ctrdconf.v3(_paths()))
    assert v2["version"] == 2 and v3["version"] == 3
    cri2 = v2["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri2["sandbox_image"] == "reg/pause:bench" and cri2["restrict_oom_score_adj"]
    images = v3["plugins"]["io.containerd.cri.v1.images"]
    runtime = v3["plugins"]["io.containerd.cri.v1.runtime"]
    assert images["pinned_images"]["sandbox"] == "reg/pause:bench"
    assert images["registry"]["config_path"] == "/w/certs.d"
    assert runtime["restrict_oom_score_adj"] and runtime["cni"]["conf_dir"] == "/w/cni"
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_path"] == "/a/containerd-shim-runc-v2"
    assert runc["options"]["Root"] == "/w/runc"
    assert v3["grpc"]["address"] == v2["grpc"]["address"] == "/w/c.sock"


def _two_anchors() -> Results:
    res = Results(meta={"anchors": ["containerd-1.6.20", "containerd-2.3.4"]})
    res.add(Row("ready", "s", {"crishim": 0.1, "containerd-1.6.20": 0.2,
                               "containerd-2.3.4": 0.1}, target=0.8))
    res.add(Row("pull", "s", {"crishim": 1.0, "containerd-1.6.20": None,
                              "containerd-2.3.4": 2.0},
                notes={"containerd-1.6.20": "error (UNAVAILABLE)"}))
    return res


def test_markdown_has_a_column_and_a_ratio_per_anchor() -> None:
    lines = render_markdown(_two_anchors()).splitlines()
    assert lines[0] == ("| metric | crishim | containerd-1.6.20 | containerd-2.3.4 | "
                        "ratio vs 1.6.20 | ratio vs 2.3.4 | target | floor (by hand) |")
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2] == ("| ready | 100.0 ms | 200.0 ms | 100.0 ms | 0.50x ✅ | 1.00x ❌ "
                        "| ≤ 0.80x |  |")
    assert lines[3] == "| pull | 1.00 s | error (UNAVAILABLE) | 2.00 s | — | 0.50x |  |  |"


def test_json_has_ratios_per_anchor() -> None:
    doc = json.loads(to_json(_two_anchors()))
    assert doc["meta"]["anchors"] == ["containerd-1.6.20", "containerd-2.3.4"]
    assert doc["rows"][0]["ratios"] == {"containerd-1.6.20": 0.5, "containerd-2.3.4": 1.0}


def test_anchors_of_an_old_single_containerd_result() -> None:
    res = Results()
    res.add(Row("x", "s", {"crishim": 1.0, "containerd": 2.0}))
    assert res.anchors() == ["containerd"]
    assert _containerds({"containerd": DEBIAN}) == "containerd 1.6.20"
    assert _containerds({"containerd": {"a": DEBIAN, "b": V2}}) == "containerd 1.6.20, 2.3.4"


def test_perfdoc_compares_only_what_both_runs_measured() -> None:
    from hack.benchlib.perfdoc import KEY_METRICS, render

    full, kubelet_only = _two_anchors(), _two_anchors()
    full.meta["date"], kubelet_only.meta["date"] = "2026-11-25 04:27 UTC", "x 04:34 UTC"
    full.add(Row(KEY_METRICS[0], "s", {"crishim": 1.0, "containerd-1.6.20": 0.9}))
    full.add(Row(KEY_METRICS[2], "s", {"crishim": 0.1, "containerd-1.6.20": 0.2}))
    kubelet_only.add(Row(KEY_METRICS[0], "s", {"crishim": 1.1, "containerd-2.3.4": 1.0}))
    text = render(full, kubelet_only)
    repro = text[text.index("Reproducibility"):]
    assert f"| {KEY_METRICS[0]} | 04:27 UTC | 1.00 s | containerd-1.6.20 900.0 ms | 1.11x |" \
        in repro
    assert f"| {KEY_METRICS[0]} | 04:34 UTC | 1.10 s | containerd-2.3.4 1.00 s | 1.10x |" in repro
    assert KEY_METRICS[2] not in repro


def test_perfdoc_shows_further_runs_as_their_own_tables() -> None:
    from hack.benchlib.perfdoc import render

    extra = _two_anchors()
    extra.meta.update(date="2026-11-25 04:38 UTC", argv="hack/bench --scenarios kubelet")
    text = render(_two_anchors(), _two_anchors(), (extra,))
    tail = text[text.index("Also 2026-11-25 04:38 UTC, `hack/bench --scenarios kubelet`"):]
    assert "| ready | 100.0 ms | 200.0 ms | 100.0 ms |" in tail


def test_crishim_set_replaces_the_bench_s_own_setting(tmp_path: pathlib.Path) -> None:
    rt = Crishim(str(tmp_path), str(tmp_path), ['log_level = "debug"', "daemon_nice=0"])
    cmd = rt.command()
    with open(cmd[cmd.index("--config") + 1], "rb") as fh:
        cfg = tomllib.load(fh)
    assert (cfg["log_level"], cfg["daemon_nice"], cfg["cgroup_driver"]) == ("debug", 0, "cgroupfs")
