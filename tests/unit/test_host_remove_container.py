"""A container's files are deleted only below the daemon's roots (host/remove.py): a
record or an intent whose bundle or conmon dir names a place elsewhere (an absolute path,
`..`, a symlink planted under the roots) is refused, and nothing there is removed."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from crishim.container.bundle import BundleFiles
from crishim.container.manager import KIND
from crishim.host.remove import OutsideRoots, Roots, unlink
from crishim.runtime import conmon
from tests.fakes.containers import POD
from tests.fakes.containers import container_config as _config
from tests.fakes.containers import env as env  # the fixture


def _victim(base: Path) -> Path:
    """A host directory outside every root, with files named like conmon's and a
    container's, which a removal that escaped would take."""
    victim = base / "victim"
    (victim / "sub").mkdir(parents=True)
    for name in ("canary", "ctl", "winsz", "attach", "cid", "sub/conmon.pid"):
        (victim / name).write_text("keep")
    return victim


def _lexists(path: str | Path) -> bool:
    return os.path.lexists(path)


def _intact(victim: Path) -> bool:
    return all((victim / name).read_text() == "keep"
               for name in ("canary", "ctl", "winsz", "attach", "cid", "sub/conmon.pid"))


@pytest.fixture
def layout(tmp_path: Path) -> SimpleNamespace:
    roots = Roots(str(tmp_path / "var"), str(tmp_path / "run"))
    containers = tmp_path / "var" / "containers"
    exits = tmp_path / "run" / "exits"
    containers.mkdir(parents=True)
    exits.mkdir(parents=True)
    return SimpleNamespace(roots=roots, containers=containers, exits=exits,
                           victim=_victim(tmp_path),
                           bundles=BundleFiles(str(containers), str(exits), roots))


async def test_a_bundle_outside_the_roots_is_neither_unmounted_nor_removed(
        layout: SimpleNamespace) -> None:
    c, victim = layout.containers, layout.victim
    (c / "evil").symlink_to(victim)  # planted under the roots, pointing out
    for bundle in (str(victim), f"{c}/../../../victim", str(c / "evil" / "sub"), "/", ""):
        await layout.bundles.remove_bundle(bundle)
        assert _intact(victim), bundle
    # The planted link itself is below the roots: it goes, never followed.
    await layout.bundles.remove_bundle(str(c / "evil"))
    assert not _lexists(c / "evil") and _intact(victim)
    # A real bundle still goes.
    (c / "ok" / "rootfs").mkdir(parents=True)
    await layout.bundles.remove_bundle(str(c / "ok"))
    assert not (c / "ok").exists()


async def test_dropping_files_named_outside_the_roots_removes_nothing_there(
        layout: SimpleNamespace) -> None:
    victim = layout.victim
    bundles = BundleFiles(layout.bundles.containers_dir, str(victim), layout.roots)
    # The after-reply deletion of a removed container: bundle, conmon files, exit file.
    bundles.drop_later("cid", str(victim), str(victim / "sub"))
    await bundles.after_reply.settle()
    assert _intact(victim)
    conmon.remove_monitor_files_sync("cid", f"{layout.containers}/../../victim",
                                     f"{layout.exits}/../../victim/sub", str(victim),
                                     roots=layout.roots)
    assert _intact(victim)


def test_the_exit_file_of_a_new_container_is_not_unlinked_outside_the_roots(
        layout: SimpleNamespace) -> None:
    victim = layout.victim
    req = conmon.MonitorRequest("cid", str(layout.containers / "cid"), None,  # type: ignore
                                "", str(victim), str(layout.exits / "p"), roots=layout.roots)
    with pytest.raises(OutsideRoots):
        conmon._prepare_files(req, str(layout.exits / "attach"))
    assert _intact(victim)
    with pytest.raises(OutsideRoots):
        unlink(str(victim / "canary"), layout.roots)
    assert _intact(victim)


async def test_an_intent_naming_a_host_dir_is_finished_without_touching_it(
        env: SimpleNamespace, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    # A stored intent (a crash cut a remove short) whose paths were tampered with.
    await env.db.add_intent("cid", KIND, {"op": "remove", "bundle": str(victim),
                                          "persist_dir": str(victim / "sub"),
                                          "runtime": "fake"})
    # An orphan under conmon's dir that is a planted symlink to the host dir.
    conmon_dir = os.path.join(env.cfg.state, "conmon")
    os.makedirs(conmon_dir)
    os.symlink(victim, os.path.join(conmon_dir, "orphan"))
    mgr = await env.manager()
    assert await env.db.intents(KIND) == {}
    assert not _lexists(os.path.join(conmon_dir, "orphan"))
    assert _intact(victim)
    assert mgr.list_containers() == []


async def test_a_removed_container_whose_record_points_outside_keeps_the_host_dir(
        env: SimpleNamespace, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    mgr = await env.manager()
    for rel in (str(victim), "{containers}/../../../victim"):
        rec = await mgr.create_container(POD, _config(f"app{len(rel)}"))
        await mgr.start_container(rec.id)
        await mgr.stop_container(rec.id, 0)
        real_bundle = rec.bundle
        rec.bundle = rel.format(containers=mgr.containers_dir)
        rec.persist_dir = str(victim / "sub")
        await mgr.remove_container(rec.id)
        await mgr.parts.bundles.after_reply.settle()
        assert mgr.find(rec.id) is None
        assert _intact(victim), rel
        assert _lexists(real_bundle)  # its own files stay: the record lost them
