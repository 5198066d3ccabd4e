"""On-disk layout of the image store and its SQLite metadata.

    {images}/blobs/sha256/<hex>   manifests, indexes and configs (atomic writes)
    {images}/layers/<hex>/        one unpacked tree per layer, named by its diff ID
    {images}/verified/<hex>       marker: layers/<hex> was unpacked, its diff ID
                                  verified and the tree committed (written last)
    {images}/tmp/                 in-progress downloads; emptied at start

{images} is `image_root`, by default {root}/images; it may be on another filesystem than
root, where containers' writable layers are (docs/storage.md). The records stay in the
daemon's database under root.

Every name below images/ is the parsed hex of a digest (digest.py), never text from an
image as such. A layer directory counts only with its marker: one that merely exists (a
crash between rename and marker, or planted there) is removed at start and never used.
The directories are 0700: only root walks to the layers (overlayfs checks the path with
the mounter's credentials), while each layer tree keeps the image's own modes.

An image becomes visible only when its record is committed to SQLite, after all of its
layers were renamed into layers/ and marked, so an interrupted pull leaves nothing
half-visible.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from crishim.errors import FailedPrecondition
from crishim.host import remove
from crishim.image import digest
from crishim.log import get_logger
from crishim.observe import tracing
from crishim.store.db import Database

log = get_logger(__name__)

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
    """The layer directory of `diff_id`, named by its parsed hex only (BadDigest if it is
    not a valid digest)."""
    return os.path.join(layers_dir, digest.parse(diff_id).hex)


PRIVATE = 0o700


class Paths:
    def __init__(self, root: str, images: str = "") -> None:
        """`root`: the daemon's; `images`: the store's directory (Config.image_dir()),
        empty = images/ under root."""
        self.base = images or os.path.join(root, "images")
        self.blobs = os.path.join(self.base, "blobs", "sha256")
        self.layers = os.path.join(self.base, "layers")
        self.verified = os.path.join(self.base, "verified")
        self.tmp = os.path.join(self.base, "tmp")
        self.containers = os.path.join(root, "containers")
        # The only place image code may delete anything (wherever image_root puts it).
        self.roots = (self.base,)

    def ensure(self) -> bool:
        """Create the store (0700, also tightening an older 0711 one). Returns whether the
        verified/ markers dir is new, i.e. the store predates layer markers (or is empty)."""
        fresh = not os.path.isdir(self.verified)
        for d in (self.base, os.path.dirname(self.blobs), self.blobs, self.layers, self.tmp,
                  self.verified):
            os.makedirs(d, mode=PRIVATE, exist_ok=True)
            os.chmod(d, PRIVATE)
        return fresh

    def blob(self, d: str) -> str:
        return os.path.join(self.blobs, digest.parse(d).hex)

    def layer(self, diff_id: str) -> str:
        return layer_path(self.layers, diff_id)

    def marker(self, diff_id: str) -> str:
        return os.path.join(self.verified, digest.parse(diff_id).hex)

    def remove(self, path: str) -> None:
        """rm -rf, refused (raises) outside images/."""
        remove.remove(path, self.roots)

    def layer_ready(self, diff_id: str) -> bool:
        """The layer was unpacked and verified by us: its marker says so (a directory that
        merely exists never counts)."""
        return os.path.isfile(self.marker(diff_id)) and os.path.isdir(self.layer(diff_id))

    def mark_verified(self, diff_id: str) -> None:
        """Record, durably and last, that layers/<hex> holds the verified tree of diff_id."""
        self._write_atomic(self.marker(diff_id), diff_id.encode())

    def drop_layer(self, diff_id: str) -> None:
        """Marker first: a crash in between leaves an unmarked dir, swept at start."""
        self.remove(self.marker(diff_id))
        self.remove(self.layer(diff_id))

    def sweep_layers(self, adopt: Iterable[str] = ()) -> int:
        """At start: remove layer dirs without a marker (and markers without a dir, and
        anything not named by a digest's hex). Layers in `adopt` (diff IDs recorded by a
        store that predates markers, which renamed a layer into place only once verified)
        get their marker instead. Returns how many layer dirs were removed."""
        for diff_id in adopt:
            if os.path.isdir(self.layer(diff_id)) and not os.path.exists(self.marker(diff_id)):
                self.mark_verified(diff_id)
        marked = set(os.listdir(self.verified))
        removed = 0
        for name in os.listdir(self.layers):
            if name not in marked or not _is_hex_name(name):
                log.info("removing an unverified layer directory", layer=name)
                self.remove(os.path.join(self.layers, name))
                removed += 1
        present = set(os.listdir(self.layers))
        for name in marked - present:
            self.remove(os.path.join(self.verified, name))
        return removed

    def clean_tmp(self) -> int:
        """Remove leftovers of interrupted pulls; returns how many."""
        n = 0
        for name in os.listdir(self.tmp):
            self.remove(os.path.join(self.tmp, name))
            n += 1
        return n

    def write_blob(self, d: str, data: bytes) -> None:
        """Atomic, durable write of a small blob (already verified by the caller)."""
        final = self.blob(d)
        if os.path.exists(final):
            return
        self._write_atomic(final, data)

    def _write_atomic(self, final: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix="blob-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, final)
        except BaseException:
            self.remove(tmp)
            raise
        fsync_dir(os.path.dirname(final))

    def read_blob(self, d: str) -> bytes | None:
        try:
            with open(self.blob(d), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None


def _is_hex_name(name: str) -> bool:
    return len(name) in digest.ALGORITHMS.values() and all(
        c in "0123456789abcdef" for c in name)


def fsync_dir(path: str) -> None:
    """Make a rename or a new name in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Metadata:
    """Image records as JSON documents (kind "image") in the daemon's database."""

    def __init__(self, db: Database, paths: Paths) -> None:
        self.db = db
        self.paths = paths

    async def load(self) -> dict[str, Image]:
        """The stored images; a record naming an invalid digest (written by a version that
        did not check them) is deleted rather than trusted."""
        docs = await self.db.load_all(KIND)
        images: dict[str, Image] = {}
        bad: list[str] = []
        for k, v in docs.items():
            try:
                for i, d in enumerate(v.get("diff_ids") or []):
                    digest.checked(d, f"image {k}: stored rootfs.diff_ids[{i}]")
                images[k] = Image.from_doc(v, self.paths.layers)
            except (ValueError, TypeError, FailedPrecondition) as exc:
                log.warning("dropping an image record with an invalid digest", image=k,
                            error=str(exc))
                bad.append(k)
        if bad:
            await self.save([], bad)
        return images

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

        with tracing.span("db put", **{"db.kind": KIND}):
            await self.db.run(lambda: tx(self.db.conn))
