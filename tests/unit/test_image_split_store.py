"""The image store under image_root, apart from root: ImageFsInfo's two filesystems, what
the store may delete, and a store moved without its files."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.cri.image import ImageService
from crishim.host.remove import OutsideRoots
from crishim.image import reference, usagecache
from crishim.image.manager import ImageManager
from crishim.store.db import Database

IMAGE_ID = "sha256:" + "ab" * 32
LAYER = "sha256:" + "12" * 32


async def _manager(cfg: Config, db: Database) -> ImageManager:
    images = ImageManager(cfg, db)
    await images.start()
    return images


@pytest.fixture()
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    d = Database(str(tmp_path / "db"))
    await d.open()
    yield d
    await d.close()


def _fill(path: Path, name: str, size: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_bytes(b"x" * size)


async def fs_info(images: ImageManager) -> pb.ImageFsInfoResponse:
    svc = ImageService(SimpleNamespace(images=images))  # type: ignore[arg-type]
    return await svc.ImageFsInfo(pb.ImageFsInfoRequest(), None)  # type: ignore[arg-type]


async def test_one_filesystem_reports_both_lists_on_one_mountpoint(tmp_path: Path,
                                                                   db: Database) -> None:
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "run"))
    images = await _manager(cfg, db)
    _fill(tmp_path / "root" / "images" / "layers", "big", 300_000)
    _fill(tmp_path / "root" / "containers" / "c1" / "upper", "w", 100_000)
    resp = await fs_info(images)
    (img,), (ctr,) = resp.image_filesystems, resp.container_filesystems
    # The kubelet sees one filesystem (same mountpoint: no KubeletSeparateDiskGC split)...
    assert img.fs_id.mountpoint == ctr.fs_id.mountpoint != ""
    # ...and what each part of crishim's root uses on it.
    assert 300_000 <= img.used_bytes.value < 400_000
    assert 100_000 <= ctr.used_bytes.value < 200_000
    assert img.inodes_used.value >= 6 and ctr.inodes_used.value >= 4
    assert img.timestamp > 0 and ctr.timestamp > 0
    await images.stop()


async def test_image_root_elsewhere_is_a_filesystem_of_its_own(
        tmp_path: Path, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two "filesystems": the mountpoint of each dir, as the kernel would give it.
    mounts = {str(tmp_path / "disk2"): str(tmp_path / "disk2"),
              str(tmp_path / "root"): "/"}

    def mountpoint(path: str) -> str:
        return next(m for top, m in mounts.items() if path.startswith(top))

    monkeypatch.setattr(usagecache, "mountpoint", mountpoint)
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "run"),
                 image_root=str(tmp_path / "disk2" / "crishim"))
    images = await _manager(cfg, db)
    assert sorted(os.listdir(tmp_path / "disk2" / "crishim")) == [
        "blobs", "layers", "tmp", "verified"]
    assert not (tmp_path / "root" / "images").exists()
    _fill(tmp_path / "disk2" / "crishim" / "layers", "big", 500_000)
    _fill(tmp_path / "root" / "containers" / "c1" / "upper", "w", 50_000)
    resp = await fs_info(images)
    (img,), (ctr,) = resp.image_filesystems, resp.container_filesystems
    assert (img.fs_id.mountpoint, ctr.fs_id.mountpoint) == (str(tmp_path / "disk2"), "/")
    assert img.used_bytes.value >= 500_000 > ctr.used_bytes.value >= 50_000
    # The store deletes only inside its own dir: never root's containers or pods.
    with pytest.raises(OutsideRoots):
        images.paths.remove(str(tmp_path / "root" / "containers" / "c1"))
    assert (tmp_path / "root" / "containers" / "c1" / "upper" / "w").exists()
    await images.stop()


async def test_a_store_moved_without_its_layers_forgets_those_images(
        tmp_path: Path, db: Database) -> None:
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "run"))
    images = await _manager(cfg, db)
    # A pulled image: its layer unpacked and marked, then recorded.
    os.makedirs(images.paths.layer(LAYER))
    images.paths.mark_verified(LAYER)
    await images._record(reference.parse("registry.local/app:v1"), IMAGE_ID,
                         "sha256:" + "cd" * 32, "sha256:" + "cd" * 32, {"config": {}},
                         [LAYER], 10)
    await images.stop()

    again = await _manager(cfg, db)  # same layout: still there
    assert again.get("registry.local/app:v1") is not None
    await again.stop()

    cfg.image_root = str(tmp_path / "new-disk")  # moved, files left behind
    moved = await _manager(cfg, db)
    assert moved.get("registry.local/app:v1") is None and moved.list() == []
    await moved.stop()
    # Told so rather than failing at CreateContainer: the kubelet pulls it again.
    cfg.image_root = ""
    back = await _manager(cfg, db)
    assert back.list() == []  # the record is gone for good; the old files are swept
    assert os.listdir(back.paths.layers) == []
    await back.stop()
