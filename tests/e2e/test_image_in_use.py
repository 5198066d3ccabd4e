"""An image a container uses, through the CRI on a real daemon: RemoveImage succeeds (the
image is gone for the CRI at once, as containerd does) but its layers stay under the
container, also across a kill -9 and restart (the users are learnt again from the
container records); they go only when the last container using them is removed."""

from __future__ import annotations

import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.image.store import layer_path
from tests.e2e import imagebuild as ib
from tests.e2e.faults import DurabilityEnv, wait_for
from tests.e2e.registry import Registry

_TAG = 200 + os.getpid() % 50


def own_layer_dirs(e: DurabilityEnv, img: ib.BuiltImage) -> list[str]:
    """The image's layer dirs that no other image in the daemon shares (its own top
    layer; the busybox base is shared with the env's image)."""
    layers = os.path.join(e.d.root, "images", "layers")
    return [layer_path(layers, img.diff_ids[-1])]


def image_listed(e: DurabilityEnv, ref: str) -> bool:
    resp = e.d.images().ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)),
                                    timeout=10)
    return resp.HasField("image")


def test_layers_stay_under_a_container_across_remove_image_and_kill9(
        denv: DurabilityEnv, registry: Registry) -> None:
    e = denv
    marker = f"in-use {os.getpid()}\n"
    img = ib.build_busybox(extra_layers=[[ib.file("inuse-marker", marker)]])
    ib.push_image(registry.host, "inuse/app", "v1", img)
    ref = f"{registry.host}/inuse/app:v1"
    images = e.d.images()
    images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    dirs = own_layer_dirs(e, img)
    assert dirs and all(os.path.isdir(d) for d in dirs), f"pulled layers not at {dirs}"

    pod_id, pod_cfg = e.run_pod("inuse")
    cid = e.create(pod_id, pod_cfg, "app", ["sleep", "3600"], image=ref)
    e.start(cid)
    assert e.container_status(cid).state == pb.CONTAINER_RUNNING

    # The CRI expects RemoveImage of an image in use to succeed; what must not happen is
    # the layers going from under the running container.
    images.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)), timeout=30)
    assert not image_listed(e, ref), "a removed image is still listed"
    assert all(os.path.isdir(d) for d in dirs), "RemoveImage deleted a used image's layers"

    def cat_marker() -> str:
        r = e.rt().ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["cat", "/inuse-marker"],
                                               timeout=10), timeout=30)
        assert r.exit_code == 0, r.stderr
        return r.stdout.decode()

    assert cat_marker() == marker

    # kill -9 and restart: recovery must learn from the container record that the hidden
    # image is still in use (and not delete it as "removed and unused").
    e.d.kill9()
    e.restart()
    e.d.images().ListImages(pb.ListImagesRequest(), timeout=10)  # the daemon has settled
    assert e.container_status(cid).state == pb.CONTAINER_RUNNING
    assert not image_listed(e, ref)
    assert all(os.path.isdir(d) for d in dirs), \
        f"layers of an image in use were deleted at restart\n{e.d.logs()[-3000:]}"
    assert cat_marker() == marker
    # A new container of the same image still gets its files from the kept layers after
    # a fresh pull (the image becomes visible again).
    images = e.d.images()
    images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    images.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)), timeout=30)
    assert all(os.path.isdir(d) for d in dirs)

    # The last user goes: now the layers go too.
    e.rt().StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=60)
    e.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)
    wait_for(lambda: not any(os.path.exists(d) for d in dirs), 30,
             "the removed image's layers to be deleted after its last container went")
    e.assert_consistent()
    e.remove_all()
    e.assert_nothing_left()


def test_layers_of_an_unused_removed_image_go_at_once(denv: DurabilityEnv,
                                                      registry: Registry) -> None:
    """The counterpart: without a container, RemoveImage deletes the layers (so the test
    above cannot pass by never deleting anything)."""
    e = denv
    img = ib.build_busybox(extra_layers=[[ib.file("unused-marker", f"{os.getpid()}\n")]])
    ib.push_image(registry.host, "inuse/unused", "v1", img)
    ref = f"{registry.host}/inuse/unused:v1"
    e.d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    dirs = own_layer_dirs(e, img)
    assert dirs and all(os.path.isdir(d) for d in dirs)
    e.d.images().RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)), timeout=30)
    wait_for(lambda: not any(os.path.exists(d) for d in dirs), 30,
             "an unused removed image's layers to be deleted")
