"""An image manager's records: the images by id and by reference, lookups, the containers
using each image, removal, and the garbage collection of unreferenced layers and blobs.

The state is the manager's own (set in ImageManager.__init__, with the pulls' state that
the collection keeps clear of); this part reads and changes the records.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from crishim.image import reference
from crishim.image.store import Image, Metadata, Paths
from crishim.image.usagecache import FsInfo, UsageCache
from crishim.log import get_logger

log = get_logger(__name__)


class ImageRecords:
    paths: Paths
    meta: Metadata
    usage: UsageCache
    _images: dict[str, Image]
    _refs: dict[str, str]
    _lock: asyncio.Lock
    _bg: set[asyncio.Task[Any]]
    _pulls: dict[tuple[str, int], asyncio.Future[str]]
    _layer_jobs: dict[str, asyncio.Future[None]]
    _layers_in_pull: Counter[str]

    def _rebuild_refs(self) -> None:
        self._refs.clear()
        # If a crash ever left one tag on two images, the newest pull wins.
        for img in sorted(self._images.values(), key=lambda i: i.pulled_at):
            if img.removed:
                continue
            for name in (*img.repo_tags, *img.repo_digests):
                self._refs[name] = img.id
        for img in self._images.values():
            img.repo_tags = [t for t in img.repo_tags if self._refs.get(t) == img.id]
            img.repo_digests = [d for d in img.repo_digests if self._refs.get(d) == img.id]

    # --- lookups --------------------------------------------------------------------------
    def get(self, ref_or_id: str) -> Image | None:
        """By full ID, bare hex ID, unique ID prefix, or (normalized) reference."""
        key = ref_or_id.strip()
        if not key:
            return None
        img = self._by_id(key)
        if img is not None:
            return img
        ref = reference.try_parse(key)
        if ref is None:
            return None
        image_id = self._refs.get(str(ref))
        if image_id is None and ref.digest:
            # A digest of the platform manifest (not the index) names the image too.
            for img in self._visible():
                if img.manifest_digest == ref.digest and any(
                        d.startswith(ref.name + "@") for d in img.repo_digests):
                    return img
        return self._visible_image(image_id) if image_id else None

    def _visible_image(self, image_id: str) -> Image | None:
        img = self._images.get(image_id)
        return img if img is not None and not img.removed else None

    def _visible(self) -> Iterable[Image]:
        return (i for i in self._images.values() if not i.removed)

    def _by_id(self, key: str) -> Image | None:
        hexpart = key.removeprefix("sha256:")
        if not hexpart or any(c not in "0123456789abcdef" for c in hexpart):
            return None
        if len(hexpart) == 64:
            return self._visible_image("sha256:" + hexpart)
        if key.startswith("sha256:") or len(hexpart) >= 3:
            found = [i for i in self._visible() if i.id[7:].startswith(hexpart)]
            if len(found) == 1:
                return found[0]
        return None

    def list(self, filter_ref: str = "") -> builtins.list[Image]:
        if filter_ref:
            img = self.get(filter_ref)
            return [img] if img is not None else []
        return sorted(self._visible(), key=lambda i: i.id)

    # --- usage by containers --------------------------------------------------------------
    # Which containers use an image is known from their records, so it is kept in memory
    # only: a node's busy image has hundreds of users, and writing that list again at
    # every container create and remove cost more than the rest of a RemoveContainer.
    def mark_used(self, image_id: str, user_id: str) -> None:
        """Container `user_id` uses the image: its layers stay even if it is removed."""
        img = self._images.get(image_id)
        if img is None:
            # Nothing left to protect (e.g. a container reconciled after its image went).
            log.warning("mark_used: image not in the store", image=image_id, user=user_id)
            return
        img.users.add(user_id)

    def unmark_used(self, image_id: str, user_id: str) -> None:
        img = self._images.get(image_id)
        if img is None or user_id not in img.users:
            return
        img.users.discard(user_id)
        if img.removed and not img.users:
            self._spawn(self._delete_records([img]))

    def set_users(self, users: Mapping[str, Iterable[str]]) -> None:
        """At start, from the container records: the ids of the containers using each
        image (by image id). A removed image that none uses any more is deleted."""
        for image_id in users.keys() - self._images.keys():
            log.warning("containers use an image not in the store", image=image_id)
        for img in self._images.values():
            img.users = set(users.get(img.id, ()))
        unused = [img for img in self._images.values() if img.removed and not img.users]
        if unused:
            self._spawn(self._delete_records(unused))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # --- remove ---------------------------------------------------------------------------
    async def remove(self, ref_or_id: str, runtime_handler: str = "") -> None:
        """By tag: that tag only (the image goes when no tag is left). By ID or digest: the
        whole image. Unknown: nothing to do. Layers stay while a container uses them.
        With a runtime handler the image was recorded for among others: only that record."""
        img = self.get(ref_or_id)
        if img is None:
            return
        if runtime_handler and runtime_handler in img.handlers and len(img.handlers) > 1:
            async with self._lock:
                img.runtime_handlers = [h for h in img.handlers if h != runtime_handler]
                await self.meta.save([img], [])
            return
        ref = reference.try_parse(ref_or_id)
        tag = f"{ref.name}:{ref.tag}" if ref and ref.tag and self._by_id(ref_or_id) is None \
            else ""
        async with self._lock:
            if tag and tag in img.repo_tags and len(img.repo_tags) > 1:
                img.repo_tags.remove(tag)
                self._refs.pop(tag, None)
                await self.meta.save([img], [])
                return
            for name in (*img.repo_tags, *img.repo_digests):
                self._refs.pop(name, None)
            img.repo_tags, img.repo_digests = [], []
            if img.users:
                img.removed = True  # hidden; deleted when its last container goes
                await self.meta.save([img], [])
                return
            await self.meta.save([], [img.id])
            self._images.pop(img.id, None)
        await self._gc()

    async def _delete_records(self, images: builtins.list[Image]) -> None:
        async with self._lock:
            ids = [i.id for i in images if i.removed and not i.users]
            await self.meta.save([], ids)
            for i in ids:
                self._images.pop(i, None)
        await self._gc()

    def _referenced_layers(self) -> set[str]:
        return {d for img in self._images.values() for d in img.diff_ids}

    async def _gc(self) -> int:
        """Remove layer dirs and blobs no image record refers to. The keep-sets are taken
        on the event loop (the records change there); only the disk walk is threaded."""
        self.usage.invalidate()
        keep = {d.partition(":")[2] for d in self._referenced_layers()}
        keep |= {d.partition(":")[2] for d, n in self._layers_in_pull.items() if n > 0}
        keep |= {d.partition(":")[2] for d in self._layer_jobs}
        blobs: set[str] | None = None
        if not self._pulls:  # a pull may be writing its blobs right now
            blobs = set()
            for img in self._images.values():
                blobs.add(img.id.partition(":")[2])
                blobs.add(img.manifest_digest.partition(":")[2])
                blobs.update(d.rpartition("@")[2].partition(":")[2] for d in img.repo_digests)
        return await asyncio.to_thread(self._gc_sync, keep, blobs)

    def _gc_sync(self, keep_layers: set[str], keep_blobs: set[str] | None) -> int:
        removed = 0
        for name in os.listdir(self.paths.layers):
            if name not in keep_layers:
                # Marker first, as Paths.drop_layer (names here are hex: sweep_layers).
                self.paths.remove(os.path.join(self.paths.verified, name))
                self.paths.remove(os.path.join(self.paths.layers, name))
                removed += 1
        if keep_blobs is not None:
            for name in os.listdir(self.paths.blobs):
                if name not in keep_blobs:
                    self.paths.remove(os.path.join(self.paths.blobs, name))
        return removed

    # --- filesystem usage -----------------------------------------------------------------
    async def fs_info(self) -> tuple[FsInfo, FsInfo]:
        """(image store usage, container writable layers usage), cached briefly."""
        return await self.usage.get()
