"""CDI names: qualified device names, kinds, and the cdi.k8s.io annotations."""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.names import (
    CDINameError,
    QualifiedName,
    from_annotations,
    parse_qualified,
    requested,
    split_kind,
)
from crishim.cdi.request import cdi_requested
from crishim.errors import InvalidArgument


@pytest.mark.parametrize("name, parts", [
    ("vendor.com/gpu=0", ("vendor.com", "gpu", "0")),
    ("nvidia.com/gpu=GPU-1a2b:mig-3", ("nvidia.com", "gpu", "GPU-1a2b:mig-3")),
    ("foo.bar.baz/foo-bar123.B_az=all", ("foo.bar.baz", "foo-bar123.B_az", "all")),
    ("a/b=c", ("a", "b", "c")),
])
def test_valid_qualified_names(name: str, parts: tuple[str, str, str]) -> None:
    q = parse_qualified(name)
    assert q == QualifiedName(*parts)
    assert str(q) == name
    assert q.kind == f"{parts[0]}/{parts[1]}"


@pytest.mark.parametrize("name, why", [
    ("", "not a qualified"),
    ("gpu0", "not a qualified"),
    ("/dev/nvidia0", "not a qualified"),
    ("vendor.com/gpu", "not a qualified"),
    ("vendor.com/gpu=", "not a qualified"),
    ("vendor.com=gpu0", "vendor/class"),
    ("vendor.com/gpu/x=0", "invalid character '/'"),
    ("1vendor.com/gpu=0", "must start with a letter"),
    ("vendor.com/-gpu=0", "must start with a letter"),
    ("vendor.com/gpu-=0", "must end with a letter or digit"),
    ("vendor.com/gpu=-0", "must start with a letter or digit"),
    ("vendor.com/gpu=a b", "invalid character ' '"),
    ("vendor.com/gpu=a:", "must end with a letter or digit"),
])
def test_invalid_qualified_names_say_why(name: str, why: str) -> None:
    with pytest.raises(CDINameError, match=why):
        parse_qualified(name)


def test_kind_needs_vendor_and_class() -> None:
    assert split_kind("vendor.com/class") == ("vendor.com", "class")
    for bad in ("foo", "vendor.com/", "/class", "vendor.com/foo/bar"):
        with pytest.raises(CDINameError):
            split_kind(bad)


def test_annotations_list_devices_in_key_order_and_ignore_other_keys() -> None:
    ann = {"cdi.k8s.io/vendor2_devices": "vendor2.com/dev=b",
           "cdi.k8s.io/vendor1_devices": "vendor1.com/dev=a,vendor1.com/dev=c",
           "io.kubernetes.container.name": "x"}
    assert from_annotations(ann) == ["vendor1.com/dev=a", "vendor1.com/dev=c",
                                     "vendor2.com/dev=b"]


def test_an_annotation_with_a_bad_name_is_an_error_naming_the_key() -> None:
    with pytest.raises(CDINameError, match=r"annotation cdi.k8s.io/x: 'foobar'"):
        from_annotations({"cdi.k8s.io/x": "vendor.com/dev=a,foobar"})


def test_field_then_annotations_each_device_once() -> None:
    got = requested(["vendor.com/dev=b", "vendor.com/dev=a", "vendor.com/dev=b"],
                    {"cdi.k8s.io/k": "vendor.com/dev=a,vendor.com/dev=c"})
    assert got == ["vendor.com/dev=b", "vendor.com/dev=a", "vendor.com/dev=c"]


def test_container_config_requests_map_bad_names_to_invalid_argument() -> None:
    cfg = pb.ContainerConfig(CDI_devices=[pb.CDIDevice(name="vendor.com/dev=a")],
                             annotations={"cdi.k8s.io/k": "vendor.com/dev=b"})
    assert cdi_requested(cfg) == ["vendor.com/dev=a", "vendor.com/dev=b"]
    assert cdi_requested(pb.ContainerConfig()) == []
    bad = pb.ContainerConfig(CDI_devices=[pb.CDIDevice(name="nvidia0")])
    with pytest.raises(InvalidArgument, match="CDI_devices: 'nvidia0' is not a qualified"):
        cdi_requested(bad)
