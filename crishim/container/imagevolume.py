"""Image volumes: a CRI mount whose source is an OCI image (KEP-4639, `Mount.image`).

The image's layers are stacked into a read-only overlay (no upper dir) at
`<bundle>/image-volumes/<n>`, and that directory (or `image_sub_path` inside it) is bind
mounted read-only into the container. Living under the bundle, the mounts go away with
the container's other mounts on remove, rollback and reconcile.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.user import scoped_path
from crishim.errors import NotFound
from crishim.image import rootfs as rootfs_mod
from crishim.image.manager import ImageManager

VOLUMES_DIR = "image-volumes"


@dataclass
class ImageVolume:
    index: int  # position in ContainerConfig.mounts
    source: str  # host directory to bind into the container
    image_id: str


def is_image_mount(m: pb.Mount) -> bool:
    return m.HasField("image") and bool(m.image.image)


async def mount_all(config: pb.ContainerConfig, images: ImageManager, bundle: str
                    ) -> list[ImageVolume]:
    """Mount every image volume of `config` under `bundle`; the caller unmounts everything
    under the bundle if this (or anything after it) fails. Records each image's id in
    the mount's `image.image_ref`, which ContainerStatus reports."""
    out: list[ImageVolume] = []
    for i, m in enumerate(config.mounts):
        if not is_image_mount(m):
            continue
        image = images.get(m.image.image)
        if image is None:
            raise NotFound(f"mount {m.container_path}: image {m.image.image!r} is not "
                           "present; pull it first")
        target = os.path.join(bundle, VOLUMES_DIR, str(i))
        await rootfs_mod.mount_readonly(list(image.layer_dirs), target,
                                        os.path.join(bundle, VOLUMES_DIR, "empty"))
        source = target
        if m.image_sub_path:
            source = await asyncio.to_thread(_sub_dir, target, m.image_sub_path,
                                             m.container_path)
        m.image.image_ref = image.id
        out.append(ImageVolume(index=i, source=source, image_id=image.id))
    return out


def _sub_dir(root: str, sub: str, container_path: str) -> str:
    """`sub` inside the mounted image, symlinks resolved without leaving it."""
    path = scoped_path(root, sub)
    if not os.path.exists(path):
        raise NotFound(f"mount {container_path}: image_sub_path {sub!r} does not exist in "
                       "the image")
    return path
