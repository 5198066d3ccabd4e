"""A pod's mounts are detached only below the pod's own directory, which must itself be
below the daemon's roots (host/remove.py): a record naming a mount elsewhere (an absolute
path, `..`, a symlink planted as the pod's dir) is refused and nothing is detached."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.host.remove import OutsideRoots, Roots
from crishim.sandbox import teardown
from crishim.sandbox.teardown import PodTeardown
from tests.fakes.sandbox import FakeNetwork


@pytest.fixture
def detached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(teardown, "detach", calls.append)
    return calls


def _pod(sandbox_dir: str, shm_path: str | None = None) -> Any:
    return SimpleNamespace(id="p1", sandbox_dir=sandbox_dir,
                           shm_path=os.path.join(sandbox_dir, "shm") if shm_path is None
                           else shm_path)


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    (tmp_path / "var" / "sandboxes" / "p1").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    return Roots(str(tmp_path / "var"), str(tmp_path / "run"))


async def test_the_pods_own_mounts_are_detached(roots: Roots, detached: list[str]) -> None:
    own = os.path.join(roots.root, "sandboxes", "p1")
    await PodTeardown(FakeNetwork(), roots).release_mounts(_pod(own))
    assert detached == [os.path.join(own, "shm"), os.path.join(own, "rootfs")]
    detached.clear()
    await PodTeardown(FakeNetwork(), roots).release_mounts(_pod(own, shm_path=""))
    assert detached == [os.path.join(own, "rootfs")]  # on the host's IPC: no shm


async def test_a_record_naming_mounts_elsewhere_is_refused(roots: Roots, tmp_path: Path,
                                                           detached: list[str]) -> None:
    victim = tmp_path / "victim"
    (victim / "shm").mkdir(parents=True)
    own = os.path.join(roots.root, "sandboxes", "p1")
    planted = os.path.join(roots.root, "sandboxes", "p2")
    os.symlink(victim, planted)
    pt = PodTeardown(FakeNetwork(), roots)
    for sb in (_pod(str(victim)),  # the pod's dir outside the roots
               _pod(os.path.join(roots.root, "..", "victim")),  # through ..
               _pod(planted),  # a symlink under the roots leading out
               _pod(own, shm_path=str(victim / "shm")),  # its shm elsewhere
               _pod(own, shm_path=os.path.join(roots.root, "sandboxes", "p3")),
               _pod(roots.root)):  # a root itself
        with pytest.raises(OutsideRoots):
            await pt.release_mounts(sb)
    assert detached == []
