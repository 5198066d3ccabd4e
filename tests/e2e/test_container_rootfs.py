"""Overlay rootfs and start-up reconciliation of the container manager, against the
real kernel (overlayfs) and real runc, without a daemon process."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from crishim.config import Config
from crishim.container.manager import KIND
from crishim.image import rootfs
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.store.db import Database
from tests.e2e.loopdirs import mkdirs_on_this_thread
from tests.fakes.managers import container_manager, runtime_side


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def test_many_layers_overlay_beyond_one_page(tmp_path: Path) -> None:
    # 150 layers with long names: the absolute lowerdir list is far over 4096 bytes.
    base = tmp_path / ("layers-" + "x" * 60)
    layers = []
    for i in range(150):
        d = base / f"{i:03d}-{'y' * 40}"
        d.mkdir(parents=True)
        (d / f"file{i}").write_text(str(i))
        (d / "shadowed").write_text(str(i))
        layers.append(str(d))
    assert len(rootfs.overlay_options(layers, "/u", "/w")) > rootfs.PAGE
    bundle = tmp_path / "bundle"
    target = await rootfs.mount_rootfs(layers, str(bundle))
    try:
        assert (Path(target) / "file0").read_text() == "0"
        assert (Path(target) / "file149").read_text() == "149"
        # The top layer (last in the list) wins.
        assert (Path(target) / "shadowed").read_text() == "149"
        (Path(target) / "new").write_text("upper")
        assert (bundle / "upper" / "new").exists()
    finally:
        await asyncio.to_thread(rootfs.unmount, target)
    assert not rootfs.is_mountpoint(target)
    rootfs.unmount(target)  # idempotent


async def test_the_bundle_and_its_dirs_are_made_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "hello").write_text("hi")
    bundle = tmp_path / "containers" / "c1"
    (tmp_path / "containers").mkdir()
    with mkdirs_on_this_thread(monkeypatch) as on_loop:
        target = await rootfs.mount_rootfs([str(layer)], str(bundle))
    try:
        assert on_loop == []
        assert stat.S_IMODE(bundle.stat().st_mode) == 0o700  # private (host/modes.py)
        assert (Path(target) / "hello").read_text() == "hi"
    finally:
        await asyncio.to_thread(rootfs.unmount, target)


async def test_reconcile_rolls_back_interrupted_create_and_orphans(tmp_path: Path) -> None:
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "state"))
    db = Database(os.path.join(cfg.root, "crishim.db"))
    await db.open()
    try:
        layer = tmp_path / "layer"
        layer.mkdir()
        containers = os.path.join(cfg.root, "containers")
        # A create that crashed after mounting the rootfs (intent recorded, no record)...
        half = os.path.join(containers, "a" * 64)
        await rootfs.mount_rootfs([str(layer)], half)
        await db.add_intent("a" * 64, KIND, {"op": "create", "bundle": half,
                                             "persist_dir": os.path.join(cfg.state, "conmon",
                                                                         "a" * 64),
                                             "runtime": "runc"})
        # ...and a rootfs mount nobody owns at all.
        orphan = os.path.join(containers, "b" * 64)
        await rootfs.mount_rootfs([str(layer)], orphan)
        exits = ExitFileWatcher(os.path.join(cfg.state, "exits"))
        await exits.start()
        mgr = container_manager(cfg, db, runtime=runtime_side(cfg, exit_files=exits))
        await mgr.start()
        await mgr.stop()
        await exits.stop()
        assert rootfs.mounted_under(containers) == []
        assert not _exists(half) and not _exists(orphan)
        assert await db.intents(KIND) == {}
    finally:
        for mp in rootfs.mounted_under(str(tmp_path)):
            rootfs.unmount(mp)
        await db.close()
