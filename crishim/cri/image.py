"""runtime.v1.ImageService."""

from __future__ import annotations

from crishim.cri.base import ServicerBase
from crishim.daemon import Daemon


class ImageService(ServicerBase):
    SERVICE = "ImageService"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
