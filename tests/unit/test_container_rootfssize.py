"""Which writable-layer cap a container asks for, and its refusal where none can be set."""

from __future__ import annotations

from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import StorageConfig
from crishim.container.rootfssize import ANNOTATION, RootfsSizes, requested
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.quota import WritableLayerQuotas

Mi = 2**20
NODE = StorageConfig(container_rootfs_size="100Mi", container_rootfs_size_max="1Gi")


def test_no_setting_and_no_annotation_is_no_cap() -> None:
    assert requested("app", {}, StorageConfig()) is None
    assert requested("app", {"other": "1"}, StorageConfig()) is None


def test_the_node_default_applies_to_containers_that_do_not_ask() -> None:
    assert requested("app", {}, NODE) == (100 * Mi, "[storage] container_rootfs_size")


def test_a_container_annotation_beats_the_pod_one_which_beats_the_default() -> None:
    pod = {ANNOTATION: "200Mi", f"{ANNOTATION}/db": "300Mi"}
    assert requested("db", pod, NODE) == (300 * Mi, f"pod annotation {ANNOTATION}/db")
    assert requested("web", pod, NODE) == (200 * Mi, f"pod annotation {ANNOTATION}")


def test_a_pod_may_ask_only_within_the_maximum() -> None:
    with pytest.raises(InvalidArgument, match="above this node's maximum, "
                       r"\[storage\] container_rootfs_size_max = 1Gi"):
        requested("app", {ANNOTATION: "2Gi"}, NODE)
    assert requested("app", {ANNOTATION: "1Gi"}, NODE) == (2**30, f"pod annotation {ANNOTATION}")
    with pytest.raises(FailedPrecondition, match="lets no pod choose one"):
        requested("app", {ANNOTATION: "1Gi"}, StorageConfig(container_rootfs_size="1Gi"))
    with pytest.raises(InvalidArgument, match="is not a size"):
        requested("app", {f"{ANNOTATION}/app": "lots"}, NODE)


async def test_create_is_refused_where_the_cap_cannot_be_enforced(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("22 1 253:0 / / rw - ext4 /dev/vda rw\n")
    sizes = RootfsSizes(NODE, WritableLayerQuotas(str(tmp_path / "containers"), str(info)))
    pod = pb.PodSandboxConfig(annotations={ANNOTATION: "64Mi"})
    ctr = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"))
    with pytest.raises(FailedPrecondition, match=r"pod annotation io\.crishim\.container-"
                       r"rootfs-size asks for a writable-layer cap of 67108864 bytes, which "
                       r"this node cannot enforce: .* is on ext4"):
        await sizes.check(ctr, pod)
    # Without any cap nothing is probed and nothing refused.
    info.unlink()
    await RootfsSizes(StorageConfig(), WritableLayerQuotas("/c", str(info))).check(
        ctr, pb.PodSandboxConfig())


async def test_no_cap_takes_no_project_id_and_a_node_that_never_caps_never_probes(
        tmp_path: Path) -> None:
    info = tmp_path / "missing-mountinfo"
    sizes = RootfsSizes(StorageConfig(), WritableLayerQuotas("/c", str(info)))
    assert await sizes.check(pb.ContainerConfig(), pb.PodSandboxConfig()) == 0
    assert sizes.allocate(0) == 0
    await sizes.apply("/nonexistent/bundle", 0, 0)
    await sizes.free(0)
    await sizes.recover([0, 0])  # would raise reading the missing mountinfo if it probed
    assert sizes.quotas.device == ""
