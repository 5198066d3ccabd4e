"""OOM detection from the kernel's counters (container/oom.py), on a fake cgroup tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from crishim.container import oom

SCOPE = "kubepods-pod1.slice:crishim:abc"


def _v2(root: Path, parent_kills: int) -> None:
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    pod = root / "kubepods.slice" / "kubepods-pod1.slice"
    pod.mkdir(parents=True)
    (pod / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {parent_kills}\n")


def test_parent_counter_on_v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom, "ROOT", str(tmp_path))
    _v2(tmp_path, 2)
    assert oom.parent_oom_kills(SCOPE) == 2
    # the scope itself is gone (systemd removed it once empty)
    assert oom.own_oom_kills(SCOPE) == 0
    assert oom.parent_oom_kills("") == -1


def test_own_counter_while_the_cgroup_exists(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom, "ROOT", str(tmp_path))
    _v2(tmp_path, 1)
    scope = tmp_path / "kubepods.slice" / "kubepods-pod1.slice" / "crishim-abc.scope"
    scope.mkdir()
    (scope / "memory.events").write_text("oom 1\noom_kill 1\n")
    assert oom.own_oom_kills(SCOPE) == 1


def test_no_parent_counter_on_v1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom, "ROOT", str(tmp_path))  # no cgroup.controllers: v1
    mem = tmp_path / "memory" / "pod" / "c1"
    mem.mkdir(parents=True)
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert oom.parent_oom_kills("/pod/c1") == -1
    assert oom.own_oom_kills("/pod/c1") == 1
