"""Image volume requests: refused at the door (validate/container.py), before anything is
mounted, when they cannot work."""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.oci.resources import ResourceMapper
from crishim.validate.container import validate_container_config


def validate(config: pb.ContainerConfig) -> None:
    config.metadata.name, config.image.image = "c", "busybox"
    validate_container_config(config, ResourceMapper())


def _cfg(readonly: bool, image_sub_path: str = "", **kw: object) -> pb.ContainerConfig:
    m = pb.Mount(container_path="/mnt/img", image=pb.ImageSpec(image="busybox"),
                 readonly=readonly, image_sub_path=image_sub_path, **kw)  # type: ignore[arg-type]
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


def test_an_image_volume_is_not_idmapped() -> None:
    mapping = [pb.IDMapping(container_id=0, host_id=100000, length=65536)]
    with pytest.raises(InvalidArgument, match="cannot be idmapped"):
        validate(_cfg(readonly=True, uidMappings=mapping, gidMappings=mapping))


def test_host_path_mounts_are_not_image_volumes() -> None:
    validate(pb.ContainerConfig(mounts=[pb.Mount(container_path="/d", host_path="/tmp")]))
