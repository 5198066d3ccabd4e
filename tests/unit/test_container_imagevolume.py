"""Image volume requests: refused before anything is mounted when they cannot work."""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container.imagevolume import validate
from crishim.errors import InvalidArgument


def _cfg(readonly: bool, image_sub_path: str = "") -> pb.ContainerConfig:
    m = pb.Mount(container_path="/mnt/img", image=pb.ImageSpec(image="busybox"),
                 readonly=readonly, image_sub_path=image_sub_path)
    return pb.ContainerConfig(mounts=[m])


def test_image_volumes_must_be_read_only() -> None:
    with pytest.raises(InvalidArgument, match="read-only"):
        validate(_cfg(readonly=False))
    validate(_cfg(readonly=True))


@pytest.mark.parametrize("sub", ["/etc", "../etc", "etc/../../x"])
def test_sub_path_stays_inside_the_image(sub: str) -> None:
    with pytest.raises(InvalidArgument, match="relative path inside the image"):
        validate(_cfg(readonly=True, image_sub_path=sub))
    validate(_cfg(readonly=True, image_sub_path="etc/ssl"))


def test_host_path_mounts_are_not_image_volumes() -> None:
    validate(pb.ContainerConfig(mounts=[pb.Mount(container_path="/d", host_path="/tmp")]))
