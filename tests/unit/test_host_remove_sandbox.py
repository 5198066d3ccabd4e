"""A pod's files, its shm mount point and its namespace pins are deleted only below the
daemon's roots (host/remove.py): a record or an intent naming a path elsewhere (an
absolute path, `..`, a symlink planted under the roots) is refused and nothing there is
removed. The network side (netns pins, the CNI cache) is in test_host_remove_network."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from crishim.host import idmap
from crishim.host.remove import OutsideRoots, Roots
from crishim.sandbox import podfiles
from crishim.store.sandbox import KIND
from tests.fakes.host import exists as _exists
from tests.fakes.sandbox import env as env  # the fixture
from tests.fakes.sandbox import pod_config as _config


def _victim(base: Path) -> Path:
    victim = base / "victim"
    (victim / "shm").mkdir(parents=True)
    for name in ("canary", "hosts", "shm/f"):
        (victim / name).write_text("keep")
    return victim


def _lexists(path: str | Path) -> bool:
    return os.path.lexists(path)


def _intact(victim: Path) -> bool:
    return all((victim / name).read_text() == "keep" for name in ("canary", "hosts", "shm/f"))


async def test_a_removed_pod_whose_record_points_outside_keeps_the_host_dir(
        env: SimpleNamespace, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    mgr = await env.manager()
    for n, bad in enumerate((str(victim), os.path.join(env.cfg.root, "..", "victim"))):
        sid = await mgr.run_sandbox(_config(f"web{n}"), "")
        sb = mgr.get(sid)
        await mgr.stop_sandbox(sid)
        own = sb.sandbox_dir
        sb.sandbox_dir = bad
        await mgr.remove_sandbox(sid)
        await mgr.parts.teardown.after_reply.settle()  # the deletion runs there, after the reply
        assert mgr.find(sid) is None
        assert _intact(victim), bad
        assert _exists(own)  # its own dir stays: the record lost it


async def test_an_interrupted_run_naming_a_host_dir_is_not_rolled_back_into_it(
        env: SimpleNamespace, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    first = await env.manager()
    sid = await first.run_sandbox(_config(), "")
    await first.stop_sandbox(sid)
    data = (await env.db.load_all(KIND))[sid]
    data["sandbox_dir"] = str(victim)
    await env.db.add_intent(sid, KIND, data)  # a crash cut its RunPodSandbox short
    await first.stop()
    first.stores.pods.clear()
    env.managers.remove(first)

    mgr = await env.manager()
    assert _intact(victim)
    # The refused step keeps the intent, for an operator to see (and the log says why).
    assert sid in await env.db.intents(KIND)
    await env.db.remove_intent(sid)
    await env.db.delete(KIND, sid)
    mgr.stores.pods.clear()


async def test_a_planted_symlink_among_the_sandbox_dirs_is_unlinked_not_followed(
        env: SimpleNamespace, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    first = await env.manager()
    await first.stop()
    env.managers.remove(first)
    link = os.path.join(env.cfg.root, "sandboxes", "orphan")
    os.symlink(victim, link)
    await env.manager()  # the start-up sweep of dirs no record owns
    assert not _lexists(link)
    assert _intact(victim)


def test_shm_and_namespace_pins_outside_the_roots_are_refused(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    roots = Roots(str(tmp_path / "var"), str(tmp_path / "run"))
    (tmp_path / "run" / "userns").mkdir(parents=True)
    os.symlink(victim, tmp_path / "run" / "userns" / "evil")
    for path in (str(victim / "shm"), str(tmp_path / "var" / ".." / "victim" / "shm")):
        with pytest.raises(OutsideRoots):
            podfiles.unmount_shm(path, roots)
    for path in (str(victim / "canary"), str(tmp_path / "run" / "userns" / "evil" / "canary")):
        with pytest.raises(OutsideRoots):
            idmap.remove_pins(path, roots=roots)
    assert _intact(victim)
    # The planted link itself is the daemon's to remove.
    idmap.remove_pins(str(tmp_path / "run" / "userns" / "evil"), roots=roots)
    assert not os.path.lexists(tmp_path / "run" / "userns" / "evil") and _intact(victim)
