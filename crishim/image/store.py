"""On-disk layout of the image store and its SQLite metadata.

    {root}/images/blobs/sha256/<hex>   manifests, indexes and configs (atomic writes)
    {root}/images/layers/<hex>/        one unpacked tree per layer, named by its diff ID
    {root}/images/tmp/                 in-progress downloads; emptied at start

An image becomes visible only when its record is committed to SQLite, after all of its
layers were renamed into layers/, so an interrupted pull leaves nothing half-visible.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from crishim.store.db import Database

KIND = "image"


# Layer dirs follow from the diff IDs; users from the container records.
_NOT_STORED = frozenset({"layer_dirs", "users"})


@dataclass
class Image:
    id: str  # "sha256:<config digest hex>"
    repo_tags: list[str]
    repo_digests: list[str]
    size: int
    config: dict[str, Any]
    layer_dirs: list[str]  # lowest layer first
    pinned: bool = False
    diff_ids: list[str] = field(default_factory=list)
    manifest_digest: str = ""  # the platform manifest (the repo digest may be an index)
    pulled_at: float = 0.0
    # Containers using the image; a removed image stays (hidden) until this is empty.
    # Not stored: the container records say which image each uses (ImageManager.set_users).
    users: set[str] = field(default_factory=set)
    removed: bool = False
    # RuntimeClass handlers the image was pulled for (ImageSpec.runtime_handler; "" is
    # the default one). The layers are shared: this is bookkeeping for the kubelet, whose
    # image GC keys images by (id, handler) under RuntimeClassInImageCriApi.
    runtime_handlers: list[str] = field(default_factory=list)

    @property
    def handlers(self) -> list[str]:
        """The recorded handlers; an image recorded before they were kept has the default."""
        return self.runtime_handlers or [""]

    @property
    def user(self) -> str:
        cfg = self.config.get("config") or {}
        return str(cfg.get("User") or "")

    @property
    def uid(self) -> int | None:
        """Numeric user of the image config USER ("1000" or "1000:1000"), else None."""
        name = self.user.split(":", 1)[0]
        return int(name) if name.isdigit() else None

    @property
    def username(self) -> str:
        name = self.user.split(":", 1)[0]
        return "" if (not name or name.isdigit()) else name

    def to_doc(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _NOT_STORED}

    @classmethod
    def from_doc(cls, doc: dict[str, Any], layers_dir: str) -> Image:
        doc = {k: v for k, v in doc.items() if k not in _NOT_STORED}
        doc["layer_dirs"] = [layer_path(layers_dir, d) for d in doc.get("diff_ids", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in known})


def layer_path(layers_dir: str, diff_id: str) -> str:
    return os.path.join(layers_dir, diff_id.partition(":")[2])


class Paths:
    def __init__(self, root: str) -> None:
        self.base = os.path.join(root, "images")
        self.blobs = os.path.join(self.base, "blobs", "sha256")
        self.layers = os.path.join(self.base, "layers")
        self.tmp = os.path.join(self.base, "tmp")
        self.containers = os.path.join(root, "containers")

    def ensure(self) -> None:
        for d in (self.blobs, self.layers, self.tmp):
            os.makedirs(d, mode=0o711, exist_ok=True)

    def blob(self, digest: str) -> str:
        return os.path.join(self.blobs, digest.partition(":")[2])

    def layer(self, diff_id: str) -> str:
        return layer_path(self.layers, diff_id)

    def clean_tmp(self) -> int:
        """Remove leftovers of interrupted pulls; returns how many."""
        n = 0
        for name in os.listdir(self.tmp):
            path = os.path.join(self.tmp, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
            n += 1
        return n

    def write_blob(self, digest: str, data: bytes) -> None:
        """Atomic, durable write of a small blob (already verified by the caller)."""
        final = self.blob(digest)
        if os.path.exists(final):
            return
        fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix="blob-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def read_blob(self, digest: str) -> bytes | None:
        try:
            with open(self.blob(digest), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None


class Metadata:
    """Image records as JSON documents (kind "image") in the daemon's database."""

    def __init__(self, db: Database, paths: Paths) -> None:
        self.db = db
        self.paths = paths

    async def load(self) -> dict[str, Image]:
        docs = await self.db.load_all(KIND)
        return {k: Image.from_doc(v, self.paths.layers) for k, v in docs.items()}

    async def save(self, images: list[Image], deleted: Sequence[str] = ()) -> None:
        """Write and delete records in one transaction (a moved tag never appears twice)."""
        rows = [(i.id, json.dumps(i.to_doc(), separators=(",", ":")))
                for i in images]
        dels = list(deleted)

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for image_id, text in rows:
                    conn.execute("INSERT OR REPLACE INTO objects(kind, id, data) VALUES (?,?,?)",
                                 (KIND, image_id, text))
                for image_id in dels:
                    conn.execute("DELETE FROM objects WHERE kind=? AND id=?", (KIND, image_id))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self.db.run(lambda: tx(self.db.conn))
