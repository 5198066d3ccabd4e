"""runtime.v1.ImageService: validate, call the ImageManager, build the reply."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import Context, ServicerBase
from crishim.cri.batching import batches
from crishim.errors import InvalidArgument
from crishim.image.store import Image
from crishim.image.usagecache import FsInfo
from crishim.node.daemon import Daemon


def image_pb(img: Image, handler: str = "") -> pb.Image:
    """The image as recorded for `handler` (one of img.handlers)."""
    out = pb.Image(id=img.id, repo_tags=img.repo_tags, repo_digests=img.repo_digests,
                   size=img.size, username=img.username, pinned=img.pinned,
                   spec=pb.ImageSpec(image=img.id, runtime_handler=handler))
    uid = img.uid
    if uid is not None:
        out.uid.value = uid
    return out


def _usage_pb(fs: FsInfo) -> pb.FilesystemUsage:
    u = fs.usage
    return pb.FilesystemUsage(timestamp=u.timestamp_ns,
                              fs_id=pb.FilesystemIdentifier(mountpoint=fs.mountpoint),
                              used_bytes=pb.UInt64Value(value=u.used_bytes),
                              inodes_used=pb.UInt64Value(value=u.inodes_used))


def _spec_image(spec: pb.ImageSpec, rpc: str) -> str:
    image = spec.image.strip()
    if not image:
        raise InvalidArgument(f"{rpc}: image.image must name an image (reference or ID)")
    return image


def _as_recorded(img: Image, handler: str) -> pb.Image:
    """ImageStatus: the record for the handler asked about, else the first one (the image
    is present for every handler: they share its layers)."""
    return image_pb(img, handler if handler in img.handlers else img.handlers[0])


class ImageService(ServicerBase):
    SERVICE = "ImageService"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def PullImage(self, request: pb.PullImageRequest,
                        context: Context) -> pb.PullImageResponse:
        ref = _spec_image(request.image, "PullImage")
        handler = self._handler(request.image)
        auth = request.auth if request.HasField("auth") else None
        image_id = await self.daemon.images.pull(ref, auth, handler)
        return pb.PullImageResponse(image_ref=image_id)

    def _handler(self, spec: pb.ImageSpec) -> str:
        """ImageSpec.runtime_handler (the kubelet's RuntimeClassInImageCriApi), checked
        against the configured handlers; "" is the default one."""
        handler = spec.runtime_handler
        if handler:
            self.daemon.runtimes.resolve_name(handler)  # InvalidArgument when unknown
        return handler

    def _list(self, request: pb.ListImagesRequest | pb.StreamImagesRequest) -> list[pb.Image]:
        spec = request.filter.image if request.HasField("filter") else pb.ImageSpec()
        handler = self._handler(spec)
        # One entry per handler an image was pulled for, as the kubelet keys its image GC.
        return [image_pb(i, h) for i in self.daemon.images.list(spec.image.strip())
                for h in i.handlers if not handler or h == handler]

    async def ListImages(self, request: pb.ListImagesRequest,
                         context: Context) -> pb.ListImagesResponse:
        return pb.ListImagesResponse(images=self._list(request))

    async def StreamImages(self, request: pb.StreamImagesRequest,
                           context: Context) -> AsyncIterator[pb.StreamImagesResponse]:
        for batch in batches(self._list(request)):
            yield pb.StreamImagesResponse(images=batch)

    async def ImageStatus(self, request: pb.ImageStatusRequest,
                          context: Context) -> pb.ImageStatusResponse:
        ref = _spec_image(request.image, "ImageStatus")
        handler = self._handler(request.image)
        img = self.daemon.images.get(ref)
        if img is None:
            return pb.ImageStatusResponse()  # CRI: a missing image is not an error
        info: dict[str, str] = {}
        if request.verbose:
            info["info"] = json.dumps({
                "id": img.id, "manifestDigest": img.manifest_digest,
                "diffIDs": img.diff_ids, "layerDirs": img.layer_dirs,
                "imageSpec": img.config, "pinned": img.pinned,
                "runtimeHandlers": img.handlers})
        return pb.ImageStatusResponse(image=_as_recorded(img, handler), info=info)

    async def RemoveImage(self, request: pb.RemoveImageRequest,
                          context: Context) -> pb.RemoveImageResponse:
        ref = _spec_image(request.image, "RemoveImage")
        await self.daemon.images.remove(ref, self._handler(request.image))
        return pb.RemoveImageResponse()

    async def ImageFsInfo(self, request: pb.ImageFsInfoRequest,
                          context: Context) -> pb.ImageFsInfoResponse:
        images, containers = await self.daemon.images.fs_info()
        return pb.ImageFsInfoResponse(image_filesystems=[_usage_pb(images)],
                                      container_filesystems=[_usage_pb(containers)])
