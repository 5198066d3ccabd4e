"""ImageManager's side of image use: kept in memory, learnt at start from the container
records; an image removed while in use stays hidden until its last user goes, also
across a restart. These call its API (mark_used, set_users) directly; that the container
code calls it (CreateContainer marks, RemoveContainer unmarks, recovery sets the users) is
tested through the real managers in test_container_recover.py and through the CRI in
tests/e2e/test_image_in_use.py."""

from __future__ import annotations

import os
from typing import Any

from crishim.config import Config
from crishim.image import reference
from crishim.image.manager import ImageManager
from crishim.store.db import Database

IMAGE_ID = "sha256:" + "ab" * 32
REF = "registry.local/app:v1"


async def open_images(root: str) -> tuple[ImageManager, Database]:
    cfg = Config(root=os.path.join(root, "root"), state=os.path.join(root, "run"))
    db = Database(os.path.join(root, "db"))
    await db.open()
    images = ImageManager(cfg, db)
    await images.start()
    return images, db


async def pulled(images: ImageManager) -> None:
    # What a registry pull ends with: the record (no layers needed here).
    await images._record(reference.parse(REF), IMAGE_ID, "sha256:" + "cd" * 32,
                         "sha256:" + "cd" * 32, {"config": {}}, [], 10)


async def close(images: ImageManager, db: Database) -> None:
    await images.stop()
    await db.close()


async def stored(db: Database) -> dict[str, Any]:
    return await db.load_all("image")


async def test_use_is_not_written_to_the_database(tmp_path: os.PathLike[str]) -> None:
    images, db = await open_images(str(tmp_path))
    try:
        await pulled(images)
        before = await stored(db)
        images.mark_used(IMAGE_ID, "c1")
        images.mark_used(IMAGE_ID, "c2")
        images.unmark_used(IMAGE_ID, "c1")
        await images.stop()  # any background write would be done by now
        assert await stored(db) == before
        assert "users" not in before[IMAGE_ID]
    finally:
        await db.close()


async def test_a_removed_image_in_use_stays_until_its_last_user_goes_across_restarts(
        tmp_path: os.PathLike[str]) -> None:
    images, db = await open_images(str(tmp_path))
    try:
        await pulled(images)
        images.mark_used(IMAGE_ID, "c1")
        await images.remove(REF)
        assert images.get(REF) is None and IMAGE_ID in await stored(db)
    finally:
        await close(images, db)

    # Restarted: container recovery finds c1's record, which names the image.
    images, db = await open_images(str(tmp_path))
    try:
        images.set_users({IMAGE_ID: ["c1"]})
        await images.stop()
        assert images.get(IMAGE_ID) is None and IMAGE_ID in await stored(db)
    finally:
        await db.close()

    # Restarted again, c1's record gone (removed just before a crash): the image goes.
    images, db = await open_images(str(tmp_path))
    try:
        images.set_users({})
        await images.stop()
        assert await stored(db) == {}
    finally:
        await db.close()


async def test_the_last_user_going_deletes_a_removed_image(tmp_path: os.PathLike[str]) -> None:
    images, db = await open_images(str(tmp_path))
    try:
        await pulled(images)
        images.set_users({IMAGE_ID: ["c1", "c2"]})
        await images.remove(IMAGE_ID)
        images.unmark_used(IMAGE_ID, "c1")
        await images.stop()
        assert IMAGE_ID in await stored(db)
        images.unmark_used(IMAGE_ID, "c2")
        await images.stop()
        assert await stored(db) == {}
    finally:
        await db.close()
