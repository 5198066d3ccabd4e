"""hack/bench's quota-stats scenario: its rows, its skip where XFS quotas are missing, and
no generated docs section for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.benchlib import cli, quotastats
from hack.benchlib.images import BenchImages
from hack.benchlib.quotastats import QUOTA, WALK, quota_rows
from hack.benchlib.report import Results


def test_rows_per_mode_and_the_cost_of_quotas() -> None:
    rows = {r.metric: r for r in quota_rows({"ListContainerStats": {
        WALK: [0.010, 0.020, 0.030], QUOTA: [0.009, 0.018, 0.040]}}, 30)}
    walk = rows["quota-stats: ListContainerStats p50 @30 pods, walked (no cap)"]
    assert walk.values == {"crishim": 0.020} and walk.unit == "s"
    quota = rows["quota-stats: ListContainerStats p90 @30 pods, from quotas "
                 "(container_rootfs_size)"]
    assert quota.values["crishim"] == pytest.approx(0.0356)
    cost = rows["quota-stats: ListContainerStats, quotas vs walk (p50)"]
    assert cost.values["crishim"] == pytest.approx(-10)
    empty = quota_rows({"ListPodSandboxStats": {WALK: [], QUOTA: [0.01]}}, 30)
    assert all(r.values["crishim"] is None for r in empty if "vs walk" in r.metric)


def test_no_rows_where_xfs_quotas_cannot_be_mounted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quotastats.shutil, "which", lambda _name: None)
    res, said = Results(), []
    quotastats.quota_stats(BenchImages(host=""), str(tmp_path), "", 30, 5, 1, res, said.append)
    assert not res.rows and "mkfs.xfs" in res.meta["quota-stats skipped"]
    assert any("skipped" in line for line in said)


def test_write_doc_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    assert cli.main(["--only", "crishim", "--scenarios", "quota-stats",
                     "--write-doc"]) == 2
