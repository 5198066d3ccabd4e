"""An image used by a container can be untagged/removed, but its layers stay until the
last container lets go, also across a restart (ImageManager against a real registry)."""

from __future__ import annotations

import os
from pathlib import Path

from crishim.config import Config
from crishim.image.manager import ImageManager
from crishim.store.db import Database
from tests.e2e import imagebuild as ib
from tests.e2e.registry import Registry


def all_dirs(paths: list[str]) -> bool:
    return all(os.path.isdir(p) for p in paths)


def no_paths(paths: list[str]) -> bool:
    return not any(os.path.exists(p) for p in paths)


async def open_manager(root: Path) -> tuple[ImageManager, Database]:
    cfg = Config(root=str(root), state=str(root / "state"))
    cfg.registry.config_path = ""
    db = Database(str(root / "crishim.db"))
    await db.open()
    mgr = ImageManager(cfg, db)
    await mgr.start()
    return mgr, db


async def close(mgr: ImageManager, db: Database) -> None:
    await mgr.stop()
    await db.close()


async def test_layers_stay_while_used(tmp_path: Path, registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("inuse", "x")]])
    ib.push_image(registry.host, "inuse/app", "v1", img)
    ref = f"{registry.host}/inuse/app:v1"
    mgr, db = await open_manager(tmp_path)
    try:
        assert await mgr.pull(ref) == img.image_id
        image = mgr.get(ref)
        assert image is not None
        dirs = image.layer_dirs
        mgr.mark_used(image.id, "ctr-1")
        await mgr.remove(image.id)
        assert mgr.get(ref) is None and mgr.get(image.id) is None  # gone for the CRI
        assert mgr.list() == []
        assert all_dirs(dirs)  # but the container's rootfs stays
    finally:
        await close(mgr, db)

    # a restart keeps the hidden image's layers for its container (whose record, read
    # by container recovery, names the image)
    mgr, db = await open_manager(tmp_path)
    try:
        mgr.set_users({img.image_id: ["ctr-1"]})
        assert mgr.get(img.image_id) is None
        assert all_dirs(dirs)
        # pulling it again makes it visible again, still protected
        assert await mgr.pull(ref) == img.image_id
        assert mgr.get(ref) is not None
        await mgr.remove(ref)
        mgr.unmark_used(img.image_id, "ctr-1")  # last user gone: now it is really deleted
        await mgr.stop()  # waits for the background deletion
        assert no_paths(dirs)
    finally:
        await db.close()
