"""The systemd driver's slice names: what a pod's cgroup_parent may be under it."""

from __future__ import annotations

import pytest

from crishim.errors import InvalidArgument
from crishim.oci.slices import expand_slice, parent_slice
from crishim.oci.spec import cgroups_path
from crishim.validate.sandbox import validate_cgroup_parent

POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice"


def test_expand_slice() -> None:
    assert expand_slice("kubepods-burstable-podabc.slice") == POD
    assert expand_slice("-.slice") == "" and expand_slice("") == ""


@pytest.mark.parametrize(("parent", "want"), [
    ("", "system.slice"),
    ("/", "system.slice"),
    ("kubepods-burstable-podabc.slice", "kubepods-burstable-podabc.slice"),
    (POD, "kubepods-burstable-podabc.slice"),   # the kubelet's form (cgroupDriver: systemd)
    (POD + "/", "kubepods-burstable-podabc.slice"),
])
def test_parent_slice(parent: str, want: str) -> None:
    assert parent_slice(parent) == want


@pytest.mark.parametrize("parent", [
    "/kubepods/burstable/podabc",                 # cgroupfs: was quietly "podabc.slice"
    "podabc",
    "/kubepods.slice/podabc.slice",               # systemd would put it at the top level
    "/kubepods.slice/kubepods-burstable.slice/x-podabc.slice",
    "a--b.slice", "-a.slice", "a-.slice", ".slice",
])
def test_parent_slice_refuses(parent: str) -> None:
    with pytest.raises(ValueError):
        parent_slice(parent)
    with pytest.raises(InvalidArgument, match="systemd"):
        validate_cgroup_parent("systemd", parent)


def test_cgroupfs_driver_takes_any_path() -> None:
    validate_cgroup_parent("cgroupfs", "/kubepods/burstable/podabc")
    assert cgroups_path("cgroupfs", "/kubepods/burstable/podabc", "crishim", "c1") == \
        "/kubepods/burstable/podabc/crishim-c1"
    assert cgroups_path("systemd", POD, "crishim", "c1") == \
        "kubepods-burstable-podabc.slice:crishim:c1"
    assert cgroups_path("systemd", "", "crishim", "c1") == "system.slice:crishim:c1"
