"""ImageSpec.runtime_handler (RuntimeClassInImageCriApi): kept on the image record and
returned in Image.spec, one entry per handler, as the 1.36 kubelet's image GC keys them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.cri.image import ImageService
from crishim.errors import InvalidArgument
from crishim.image import reference
from crishim.image.manager import ImageManager
from crishim.image.store import Image
from crishim.runtime.runc import RuntimeRegistry
from crishim.store.db import Database

IMAGE_ID = "sha256:" + "ab" * 32
REF = "registry.local/app:v1"


@pytest.fixture()
async def svc(tmp_path: os.PathLike[str]) -> AsyncIterator[ImageService]:
    cfg = Config(root=os.path.join(tmp_path, "root"), state=os.path.join(tmp_path, "run"))
    cfg.runtimes = {"runc": cfg.runtimes["runc"], "kata": cfg.runtimes["runc"]}
    db = Database(os.path.join(tmp_path, "db"))
    await db.open()
    images = ImageManager(cfg, db)
    await images.start()

    async def fake_pull(ref: reference.Reference, creds: Any) -> str:
        # What a registry pull ends with: the record (no layers needed here).
        await images._record(ref, IMAGE_ID, "sha256:" + "cd" * 32, "sha256:" + "cd" * 32,
                             {"config": {}}, [], 10)
        return IMAGE_ID

    images._logged_pull = fake_pull  # type: ignore[method-assign]
    yield ImageService(SimpleNamespace(images=images, runtimes=RuntimeRegistry(cfg)))  # type: ignore[arg-type]
    await images.stop()
    await db.close()


def spec(image: str, handler: str = "") -> pb.ImageSpec:
    return pb.ImageSpec(image=image, runtime_handler=handler)


async def listed(svc: ImageService, handler: str = "") -> list[tuple[str, str]]:
    req = pb.ListImagesRequest(filter=pb.ImageFilter(image=spec("", handler)))
    resp = await svc.ListImages(req, None)  # type: ignore[arg-type]
    return [(i.id, i.spec.runtime_handler) for i in resp.images]


async def test_pull_keeps_the_handler_and_list_status_return_it(svc: ImageService) -> None:
    # The kubelet's EnsureImageExists for a pod of RuntimeClass "kata": PullImage with
    # ImageSpec{image, runtime_handler: "kata"}.
    resp = await svc.PullImage(pb.PullImageRequest(image=spec(REF, "kata")), None)  # type: ignore[arg-type]
    assert resp.image_ref == IMAGE_ID
    assert await listed(svc) == [(IMAGE_ID, "kata")]
    st = await svc.ImageStatus(pb.ImageStatusRequest(image=spec(REF, "kata")), None)  # type: ignore[arg-type]
    assert (st.image.spec.image, st.image.spec.runtime_handler) == (IMAGE_ID, "kata")
    # A default-handler pod pulls the same image: now listed once per handler.
    await svc.PullImage(pb.PullImageRequest(image=spec(REF)), None)  # type: ignore[arg-type]
    assert await listed(svc) == [(IMAGE_ID, "kata"), (IMAGE_ID, "")]
    assert await listed(svc, "kata") == [(IMAGE_ID, "kata")]
    assert await listed(svc, "runc") == []
    # Status for a handler it was not pulled for still finds it (layers are shared).
    st = await svc.ImageStatus(pb.ImageStatusRequest(image=spec(REF, "runc")), None)  # type: ignore[arg-type]
    assert (st.image.id, st.image.spec.runtime_handler) == (IMAGE_ID, "kata")


async def test_remove_per_handler(svc: ImageService) -> None:
    for handler in ("kata", ""):
        await svc.PullImage(pb.PullImageRequest(image=spec(REF, handler)), None)  # type: ignore[arg-type]
    await svc.RemoveImage(pb.RemoveImageRequest(image=spec(IMAGE_ID, "kata")), None)  # type: ignore[arg-type]
    assert await listed(svc) == [(IMAGE_ID, "")]
    # The last handler (or no handler, as the kubelet's RemoveImage sends): the image goes.
    await svc.RemoveImage(pb.RemoveImageRequest(image=spec(IMAGE_ID, "")), None)  # type: ignore[arg-type]
    assert await listed(svc) == []


async def test_handlers_persist(svc: ImageService) -> None:
    await svc.PullImage(pb.PullImageRequest(image=spec(REF, "kata")), None)  # type: ignore[arg-type]
    images: ImageManager = svc.daemon.images
    loaded = await images.meta.load()
    assert loaded[IMAGE_ID].runtime_handlers == ["kata"]


def test_unknown_handler_is_invalid_argument(svc: ImageService) -> None:
    with pytest.raises(InvalidArgument, match="runtime handler 'nope' is not configured"):
        svc._handler(spec(REF, "nope"))


def test_records_without_handlers_are_the_default_handler() -> None:
    doc = Image(id=IMAGE_ID, repo_tags=[], repo_digests=[], size=1, config={},
                layer_dirs=[]).to_doc()
    del doc["runtime_handlers"]
    assert Image.from_doc(doc, "/layers").handlers == [""]


def test_container_lists_echo_the_image_spec_handler() -> None:
    from crishim.store.container import Container

    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                             image=pb.ImageSpec(image=IMAGE_ID, runtime_handler="kata"))
    rec = Container(id="c", pod_id="p", name="n", config=cfg, runtime_handler="kata",
                    created_at=1, image_name=REF, image_id=IMAGE_ID, image_ref=IMAGE_ID,
                    bundle="/b", rootfs="/r", persist_dir="/p")
    assert rec.list_proto().image.runtime_handler == "kata"
    assert rec.status_proto().image.runtime_handler == "kata"
