"""ImageManager: pull, look up, list and remove images; the image store's only writer.

Lookups are in memory. Pulls of the same reference share one download, layers shared by
concurrent pulls are fetched once, and layers download and unpack in parallel (bounded by
registry.max_concurrent_downloads). An image becomes visible only after all its layers are
in place and its record is committed.

A PullImage call whose client gives up (crictl's timeout, the kubelet when the pod goes
away) detaches from the pull, which goes on for the other callers and for the client's
retry, which joins it. A pull whose registry sends nothing for
registry.image_pull_progress_timeout is cancelled (progress.py): its downloads stop unless
another pull still waits for them, its temp data and the layers it put in place are
removed, and the next pull of the image starts afresh.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.errors import FailedPrecondition, InvalidArgument, NotFound
from crishim.image import digest, platform, reference
from crishim.image.auth import Credentials
from crishim.image.client import ClientPool, Manifest, RegistrySession
from crishim.image.layerfetch import fetch_layer
from crishim.image.progress import MONOTONIC, Clock, ProgressFeed, PullWatchdog
from crishim.image.records import ImageRecords
from crishim.image.store import Image, Metadata, Paths
from crishim.image.usagecache import UsageCache
from crishim.log import get_logger
from crishim.observe import metrics, tracing
from crishim.proc.crashpoint import crash_point
from crishim.store.db import Database

log = get_logger(__name__)

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
IMAGE_TYPES = ("application/vnd.oci.image.manifest.v1+json",
               "application/vnd.docker.distribution.manifest.v2+json")
SCHEMA1_TYPES = ("application/vnd.docker.distribution.manifest.v1+json",
                 "application/vnd.docker.distribution.manifest.v1+prettyjws")
CONFIG_TYPES = ("application/vnd.oci.image.config.v1+json",
                "application/vnd.docker.container.image.v1+json")
NONDISTRIBUTABLE = ("application/vnd.oci.image.layer.nondistributable.v1.tar",
                    "application/vnd.docker.image.rootfs.foreign.diff.tar")
LAYER_PREFIXES = ("application/vnd.oci.image.layer.v1.tar",
                  "application/vnd.docker.image.rootfs.diff.tar")


@dataclass
class LayerDesc:
    digest: str
    size: int
    media_type: str


class ImageManager(ImageRecords):
    def __init__(self, cfg: Config, db: Database, clock: Clock = MONOTONIC) -> None:
        self.cfg = cfg
        self.db = db
        self.clock = clock  # the pull watchdogs' (progress.py)
        self.paths = Paths(cfg.root, cfg.image_dir())
        self.meta = Metadata(db, self.paths)
        self._images: dict[str, Image] = {}
        self._refs: dict[str, str] = {}  # "name:tag" / "name@digest" -> image id
        stall = cfg.registry.image_pull_progress_timeout
        # Twice the pull watchdog's timeout: see ClientPool. Without a watchdog, no bound.
        self._pool = ClientPool(2 * stall if stall > 0 else None)
        n = max(1, cfg.registry.max_concurrent_downloads)
        self._download_slots = asyncio.Semaphore(n)
        self._unpack_pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="unpack")
        self._pulls: dict[tuple[str, int], asyncio.Future[str]] = {}
        self._layer_jobs: dict[str, asyncio.Future[None]] = {}
        self._layer_feeds: dict[str, ProgressFeed] = {}  # pulls watching each layer job
        self._layer_waiters: Counter[str] = Counter()  # pulls awaiting each layer job
        self._layers_in_pull: Counter[str] = Counter()
        self._lock = asyncio.Lock()  # serializes record changes (tags move between images)
        self._bg: set[asyncio.Task[Any]] = set()
        self.usage = UsageCache(self.paths.base, self.paths.containers)

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        premarker = await asyncio.to_thread(self.paths.ensure)
        cleaned = await asyncio.to_thread(self.paths.clean_tmp)
        images = await self.meta.load()
        self._images = images
        self._rebuild_refs()
        # A store without layer markers: its recorded layers were verified before they
        # were renamed into place, so they are marked once; nothing else ever is.
        adopt = sorted(self._referenced_layers()) if premarker else []
        unverified = await asyncio.to_thread(self.paths.sweep_layers, adopt)
        await self._drop_incomplete()
        removed = await self._gc()
        log.info("image store ready", images=len(self._images), tmp_cleaned=cleaned,
                 unverified_removed=unverified, unreferenced_removed=removed,
                 path=self.paths.base)

    async def _drop_incomplete(self) -> None:
        """Forget images whose layers are not all in the store (image_root changed without
        its files, or they were lost): the kubelet pulls them again, rather than
        containers failing to mount them."""
        images = list(self._images.values())
        gone = await asyncio.to_thread(lambda: [
            img.id for img in images
            if not all(self.paths.layer_ready(d) for d in img.diff_ids)])
        if not gone:
            return
        log.warning("forgetting images whose layers are not in the image store",
                    images=len(gone), path=self.paths.base)
        await self.meta.save([], gone)
        for image_id in gone:
            self._images.pop(image_id, None)
        self._rebuild_refs()

    async def stop(self) -> None:
        # Cancel pulls and wait for them: a cancelled download aborts its unpack thread,
        # which would otherwise block interpreter exit waiting for more data.
        jobs: builtins.list[asyncio.Future[Any]] = [*self._pulls.values(),
                                                    *self._layer_jobs.values()]
        for job in jobs:
            job.cancel()
        if jobs:
            await asyncio.wait(jobs, timeout=10)
        if self._bg:
            await asyncio.gather(*self._bg, return_exceptions=True)
        await self._pool.close()
        self._unpack_pool.shutdown(wait=False, cancel_futures=True)

    # --- pull -----------------------------------------------------------------------------
    async def pull(self, ref: str, auth: pb.AuthConfig | None = None,
                   runtime_handler: str = "") -> str:
        """Pull `ref` for `runtime_handler`; returns the image ID. Concurrent pulls of one
        ref share the work (whatever their handlers: the layers are the same)."""
        parsed = reference.parse(ref)
        if parsed.digest:
            # It becomes a URL and a record key: only a digest we can verify against.
            try:
                digest.parse(parsed.digest)
            except digest.BadDigest as exc:
                raise InvalidArgument(f"image reference {ref!r}: the digest is not valid: "
                                      f"{exc}") from None
        creds = Credentials.from_cri(auth)
        key = (str(parsed), hash((creds.username, creds.password, creds.identity_token,
                                  creds.registry_token, creds.server_address)) if creds else 0)
        job = self._pulls.get(key)
        if job is None:
            job = asyncio.ensure_future(self._logged_pull(parsed, creds))
            self._pulls[key] = job
            job.add_done_callback(lambda _f: self._pulls.pop(key, None))
        # Shielded: a client that gives up does not cancel a pull others wait for.
        image_id = await asyncio.shield(job)
        await self._add_handler(image_id, runtime_handler)
        return image_id

    async def _add_handler(self, image_id: str, handler: str) -> None:
        async with self._lock:
            img = self._images.get(image_id)
            if img is None or handler in img.runtime_handlers:
                return
            img.runtime_handlers.append(handler)
            await self.meta.save([img], [])

    async def _logged_pull(self, ref: reference.Reference, creds: Credentials | None) -> str:
        started = time.monotonic()
        watchdog = PullWatchdog(str(ref), self.cfg.registry.image_pull_progress_timeout,
                                self.clock)
        metrics.IMAGE_PULLS_IN_PROGRESS.inc()
        try:
            async with watchdog.guard():
                with tracing.span("image pull", **{"image.ref": str(ref)}):
                    image_id = await self._pull(ref, creds, watchdog)
        except Exception as exc:
            # Messages never carry credentials (see auth.py), so they are safe to log.
            log.warning("image pull failed", ref=str(ref), error=self._pool.describe(exc))
            metrics.observe_image_pull(time.monotonic() - started, ok=False)
            raise
        finally:
            metrics.IMAGE_PULLS_IN_PROGRESS.dec()
        metrics.observe_image_pull(time.monotonic() - started, ok=True)
        return image_id

    async def _pull(self, ref: reference.Reference, creds: Credentials | None,
                    watchdog: PullWatchdog) -> str:
        started = time.monotonic()
        session = RegistrySession(self.cfg.registry, ref, creds, self._pool,
                                  ProgressFeed(watchdog))
        with tracing.span("image resolve", **{"image.ref": str(ref)}):
            top = await session.manifest(ref.object)
        with tracing.span("image manifest", **{"image.digest": top.digest}):
            manifest = await self._platform_manifest(session, top)
        doc = _json(manifest.body, "manifest")
        config_desc = doc.get("config")
        if not isinstance(config_desc, dict):
            raise FailedPrecondition(f"manifest {ref.name}@{manifest.digest} has no usable "
                                     "config descriptor")
        config_digest = str(digest.checked(config_desc.get("digest"),
                                           f"image {ref}: manifest config.digest"))
        if not config_digest.startswith("sha256:"):
            # It is the image ID, which the CRI and the kubelet know as sha256 only.
            raise FailedPrecondition(f"image {ref}: manifest config.digest {config_digest}: "
                                     "only sha256 is supported for an image config")
        config_type = str(config_desc.get("mediaType", ""))
        if config_type and config_type not in CONFIG_TYPES:
            raise FailedPrecondition(f"{ref} is not a container image (config media type "
                                     f"{config_type!r}); it may be an artifact such as a "
                                     "Helm chart or signature")
        raw_layers = doc.get("layers") or []
        if not isinstance(raw_layers, list):
            raise FailedPrecondition(f"image {ref}: manifest layers is not a list")
        layers = [_layer_desc(ref, i, d) for i, d in enumerate(raw_layers)]
        config_raw = await asyncio.to_thread(self.paths.read_blob, config_digest)
        if config_raw is None:
            with tracing.span("image config", **{"image.config": config_digest}):
                config_raw = await session.blob_bytes(config_digest)
        config = _json(config_raw, "image config")
        rootfs = config.get("rootfs") or {}
        raw_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
        if not isinstance(raw_ids, list):
            raise FailedPrecondition(f"image {ref}: config rootfs.diff_ids is not a list")
        # Each names a layer directory: checked here, before any becomes a path.
        diff_ids = [str(digest.checked(d, f"image {ref}: config rootfs.diff_ids[{i}]"))
                    for i, d in enumerate(raw_ids)]
        if len(diff_ids) != len(layers):
            raise FailedPrecondition(f"image {ref}: config lists {len(diff_ids)} diff IDs "
                                     f"but the manifest has {len(layers)} layers")
        # Until the record is committed, GC must not take layers this pull put in place.
        mine = [*dict.fromkeys(diff_ids)]
        watchdog.layers = len(mine)
        self._layers_in_pull.update(mine)
        try:
            await self._fetch_layers(session, layers, diff_ids, watchdog)
            for d, data in ((top.digest, top.body), (manifest.digest, manifest.body),
                            (config_digest, config_raw)):
                await asyncio.to_thread(self.paths.write_blob, d, data)
            # As containerd counts it: every descriptor walked (index, manifest, config,
            # layers, compressed sizes).
            size = len(manifest.body) + len(config_raw) + sum(layer.size for layer in layers)
            if top.digest != manifest.digest:
                size += len(top.body)
            image_id = config_digest
            crash_point("image-before-metadata")
            with tracing.span("image record", **{"image.id": image_id}):
                await self._record(ref, image_id, top.digest, manifest.digest, config,
                                   diff_ids, size)
        except BaseException:
            # Failed or cancelled (a stall): the layers it put in place that no image and no
            # other pull in flight needs go too, so it leaves nothing behind. Whichever of
            # two failing pulls sharing a layer ends last removes it.
            self._layers_in_pull.subtract(mine)
            await self._drop_unreferenced(mine)
            raise
        else:
            self._layers_in_pull.subtract(mine)
        self.usage.invalidate()
        log.info("image pulled", ref=str(ref), id=image_id, layers=len(layers), size=size,
                 seconds=round(time.monotonic() - started, 3))
        return image_id

    async def _platform_manifest(self, session: RegistrySession, top: Manifest) -> Manifest:
        media = top.media_type
        doc = _json(top.body, "manifest")
        media = media or str(doc.get("mediaType", ""))
        if media in SCHEMA1_TYPES or doc.get("schemaVersion") == 1:
            raise FailedPrecondition(f"{session.ref}: Docker schema 1 manifests are not "
                                     "supported; push the image with schema 2 or OCI")
        if media in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
            entries = doc.get("manifests") or []
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise FailedPrecondition(f"image {session.ref}: index manifests is not a list "
                                         "of descriptors")
            for i, e in enumerate(entries):
                digest.checked(e.get("digest"), f"image {session.ref}: index manifests[{i}]"
                               ".digest")
            entry = platform.select(list(entries))
            if entry is None:
                want = "/".join(p for p in platform.host_platform() if p)
                have = sorted({"/".join(str(v) for v in (m.get("platform") or {}).values())
                               for m in doc.get("manifests") or []})
                raise NotFound(f"{session.ref}: no manifest for platform {want} in the index "
                               f"(it has: {', '.join(have) or 'none'})")
            child = await session.manifest(str(entry.get("digest", "")))
            cdoc = _json(child.body, "manifest")
            if "layers" not in cdoc:
                raise FailedPrecondition(f"{session.ref}: index entry {child.digest} is not "
                                         "an image manifest")
            return child
        if media and media not in IMAGE_TYPES and "layers" not in doc:
            raise FailedPrecondition(f"{session.ref}: unsupported manifest type {media!r}")
        return top

    async def _fetch_layers(self, session: RegistrySession, layers: builtins.list[LayerDesc],
                            diff_ids: builtins.list[str], watchdog: PullWatchdog) -> None:
        # On a failure the sibling downloads stop too unless another pull waits for them
        # (_ensure_layer), so a failed pull leaves no temp data behind.
        try:
            async with asyncio.TaskGroup() as tg:
                for desc, diff_id in _unique(layers, diff_ids):
                    tg.create_task(self._ensure_layer(session, desc, diff_id, watchdog))
        except BaseExceptionGroup as group:
            # One clear error for the client: the first real failure.
            raise _first(group) from None

    async def _ensure_layer(self, session: RegistrySession, desc: LayerDesc, diff_id: str,
                            watchdog: PullWatchdog) -> None:
        job = self._layer_jobs.get(diff_id)
        if job is None:
            # Only our own marker makes a layer present, never a directory that exists.
            if await asyncio.to_thread(self.paths.layer_ready, diff_id):
                watchdog.layers_done += 1
                return
            job = self._layer_jobs.get(diff_id)  # another pull may have started it meanwhile
        if job is None:
            feed = ProgressFeed(watchdog)
            job = asyncio.ensure_future(self._download(session, desc, diff_id, feed))
            self._layer_jobs[diff_id] = job
            self._layer_feeds[diff_id] = feed
            job.add_done_callback(lambda f: self._forget_layer_job(diff_id, f))
        else:
            # Its bytes are this pull's progress too.
            self._layer_feeds[diff_id].watch(watchdog)
        self._layer_waiters[diff_id] += 1
        try:
            await asyncio.shield(job)
            watchdog.layers_done += 1
        finally:
            self._layer_waiters[diff_id] -= 1
            if self._layer_waiters[diff_id] <= 0:
                del self._layer_waiters[diff_id]
                if not job.done():
                    # The last pull waiting for it failed or was cancelled: stop it, and
                    # wait until its temp data is gone before this pull reports back.
                    job.cancel()
                    await asyncio.gather(job, return_exceptions=True)

    def _forget_layer_job(self, diff_id: str, job: asyncio.Future[None]) -> None:
        if self._layer_jobs.get(diff_id) is job:  # not a newer download of the layer
            del self._layer_jobs[diff_id]
            self._layer_feeds.pop(diff_id, None)

    async def _download(self, session: RegistrySession, desc: LayerDesc, diff_id: str,
                        feed: ProgressFeed) -> None:
        async with self._download_slots:
            with tracing.span("image layer", **{"image.layer.digest": desc.digest,
                                                "image.layer.size": desc.size}):
                await fetch_layer(session, self._unpack_pool, desc.digest, desc.size,
                                  diff_id, self.paths, feed,
                                  self.cfg.registry.max_layer_uncompressed_size)

    async def _drop_unreferenced(self, diff_ids: builtins.list[str]) -> None:
        keep = self._referenced_layers()
        for d in diff_ids:
            if d in keep or self._layers_in_pull[d] > 0 or d in self._layer_jobs:
                continue
            await asyncio.to_thread(self.paths.drop_layer, d)

    async def _record(self, ref: reference.Reference, image_id: str, repo_digest: str,
                      manifest_digest: str, config: dict[str, Any], diff_ids: builtins.list[str],
                      size: int) -> None:
        names = [ref.with_digest(repo_digest)]
        tag = f"{ref.name}:{ref.tag}" if ref.tag else ""
        async with self._lock:
            img = self._images.get(image_id)
            if img is None or img.removed:
                img = Image(id=image_id, repo_tags=[], repo_digests=[], size=size,
                            config=config, layer_dirs=[self.paths.layer(d) for d in diff_ids],
                            diff_ids=diff_ids, manifest_digest=manifest_digest,
                            users=img.users if img else set())
            img.pulled_at = time.time()
            img.pinned = img.pinned or self._is_pinned(ref)
            changed = [img]
            deleted: builtins.list[str] = []
            for name in ([tag] if tag else []) + names:
                old_id = self._refs.get(name)
                if old_id and old_id != image_id and old_id in self._images:
                    old = self._images[old_id]
                    old.repo_tags = [t for t in old.repo_tags if t != name]
                    old.repo_digests = [d for d in old.repo_digests if d != name]
                    if not old.repo_tags and not old.repo_digests:
                        if old.users:
                            old.removed = True
                            changed.append(old)
                        else:
                            deleted.append(old_id)
                    else:
                        changed.append(old)
            if tag and tag not in img.repo_tags:
                img.repo_tags.append(tag)
            for n in names:
                if n not in img.repo_digests:
                    img.repo_digests.append(n)
            await self.meta.save(changed, deleted)
            self._images[image_id] = img
            for name in ([tag] if tag else []) + names:
                self._refs[name] = image_id
            for d in deleted:
                self._images.pop(d, None)
        if deleted:
            await self._gc()

    def _is_pinned(self, ref: reference.Reference) -> bool:
        pause = reference.try_parse(self.cfg.pause_image) if self.cfg.pause_image else None
        return pause is not None and pause.name == ref.name and pause.object == ref.object


def _unique(layers: list[LayerDesc], diff_ids: list[str]) -> list[tuple[LayerDesc, str]]:
    seen: dict[str, LayerDesc] = {}
    for desc, diff_id in zip(layers, diff_ids, strict=True):
        seen.setdefault(diff_id, desc)
    return [(d, i) for i, d in seen.items()]


def _first(group: BaseExceptionGroup) -> BaseException:  # type: ignore[type-arg]
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise FailedPrecondition(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FailedPrecondition(f"{what} is not a JSON object")
    return doc


def _layer_desc(ref: reference.Reference, i: int, d: object) -> LayerDesc:
    if not isinstance(d, dict):
        raise FailedPrecondition(f"image {ref}: manifest layers[{i}] is not a descriptor")
    media = str(d.get("mediaType", ""))
    # Checked first: it goes into the messages below, a URL and a progress key.
    layer = str(digest.checked(d.get("digest"), f"image {ref}: manifest layers[{i}].digest"))
    if media.startswith(NONDISTRIBUTABLE) or d.get("urls"):
        raise FailedPrecondition(
            f"{ref}: layer {layer} is a foreign/non-distributable layer ({media}); crishim "
            "does not download layers from external URLs")
    if media and (not media.startswith(LAYER_PREFIXES) or "encrypted" in media):
        raise FailedPrecondition(f"{ref}: layer {layer} has unsupported media type {media!r}"
                                 " (encrypted or not a tar layer)")
    size = d.get("size")
    if not isinstance(size, int) or size < 0:
        raise InvalidArgument(f"{ref}: layer {layer} has no valid size")
    return LayerDesc(layer, size, media)
