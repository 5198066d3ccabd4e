"""hack/bench's tracing scenario: its rows from per-phase samples and daemon CPU, each
runtime's own cost percentage, the config each runtime gets with tracing on, and the
daemon CPU read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hack.benchlib.anchors import Anchor
from hack.benchlib.report import Row
from hack.benchlib.runtimes import Containerd, Crishim
from hack.benchlib.tracing import NO_ENV_TRACING, cpu_s, phase_order, tracing_rows

READY = {"crishim": {"off": [0.200, 0.210, 0.220], "on": [0.205, 0.215, 0.230]},
         "containerd-2.3.4": {"off": [0.300, 0.310, 0.320], "on": [0.306, 0.316, 0.330]},
         "containerd-1.6.20": {"off": [], "on": []}}
CPU: dict[str, dict[str, float | None]] = {
    "crishim": {"off": 0.060, "on": 0.066}, "containerd-2.3.4": {"off": 0.100, "on": 0.104},
    "containerd-1.6.20": {"off": None, "on": None}}


def rows() -> dict[str, Row]:
    return {r.metric: r for r in tracing_rows(READY, CPU,
                                              {"containerd-1.6.20": NO_ENV_TRACING})}


def test_p50_p90_and_cpu_per_phase() -> None:
    r = rows()
    assert r["tracing off: pod ready p50"].values["crishim"] == pytest.approx(0.210)
    assert r["tracing on, 100% sampled: pod ready p50"].values["containerd-2.3.4"] == \
        pytest.approx(0.316)
    assert r["tracing on, 100% sampled: daemon CPU per pod lifecycle"].values["crishim"] == \
        pytest.approx(0.066)
    assert r["tracing off: pod ready p50"].values["containerd-1.6.20"] is None
    assert r["tracing off: pod ready p50"].notes["containerd-1.6.20"] == NO_ENV_TRACING


def test_cost_is_each_runtimes_own_percentage() -> None:
    r = rows()
    ready = r["tracing cost: on vs off (pod ready p50)"]
    cpu = r["tracing cost: on vs off (daemon CPU per pod)"]
    assert ready.values["crishim"] == pytest.approx((0.215 / 0.210 - 1) * 100)
    assert cpu.values["containerd-2.3.4"] == pytest.approx(4.0)
    assert ready.ratio("containerd-2.3.4") is None
    assert cpu.values["containerd-1.6.20"] is None


def test_phases_alternate_by_block() -> None:
    assert phase_order(0) == ("off", "on")
    assert phase_order(1) == ("on", "off")


def test_crishim_gets_a_tracing_section_only_when_on(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hack.benchlib.runtimes.cni_bin_dir", lambda: "/opt/cni/bin")
    rt = Crishim(str(tmp_path), str(tmp_path / "certs"))
    rt.command()
    cfg = tmp_path / "crishim" / "crishim.toml"
    assert "[tracing]" not in cfg.read_text()
    rt.otlp = "127.0.0.1:4317"
    rt.command()
    text = cfg.read_text()
    assert 'endpoint = "127.0.0.1:4317"' in text
    assert "sampling_rate_per_million = 1000000" in text


def test_containerd_2_traces_through_its_environment(tmp_path: Path) -> None:
    anchor = Anchor(binary="/x/containerd", shim="/x/containerd-shim-runc-v2",
                    version="2.3.4")
    rt = Containerd(str(tmp_path), str(tmp_path / "certs"), "pause", anchor, 0)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in rt.env()
    rt.otlp = "127.0.0.1:4317"
    env = rt.env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4317"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert env["OTEL_TRACES_SAMPLER"] == "always_on"


def test_cpu_of_this_process_grows() -> None:
    before = cpu_s(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_s(os.getpid()) > before
