"""Image garbage collection by the kubelet: it reads ImageFsInfo, lists images and
removes the unused ones with RemoveImage, never one a running container uses."""

from __future__ import annotations

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.imagebuild import push_busybox
from tests.kubelet.node import wait_for
from tests.kubelet.nodeenv import Node, ctr, pod
from tests.kubelet.streams import kubelet_exec


def test_kubelet_image_gc_removes_unused_images(node: Node) -> None:
    k = node.kubelet
    # Its own image id (a label in the config), or it would be busybox's, which is in use.
    push_busybox(node.registry.host, "test/gc-victim", "v1",
                 config_overrides={"Labels": {"purpose": "gc-victim"}})
    victim = f"{node.registry.host}/test/gc-victim:v1"
    images = node.crishim.images()
    images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=victim)), timeout=120)
    k.write_manifest("gcuser", pod("gcuser", [ctr(node, "a", "exec sleep 3600")]))
    k.wait_ready("gcuser", 60)
    # Image-filesystem pressure makes the kubelet reclaim at once (its periodic GC runs
    # every 5 minutes): it deletes every unused image. Static pods are critical, so
    # nothing is evicted.
    k.stop()
    saved = dict(k.config)
    k.config["evictionHard"] = {"memory.available": "1Mi", "nodefs.available": "1%",
                                "imagefs.available": "99%"}
    # Else only images unused for 2 minutes go (0 means "the default" to the kubelet).
    k.config["imageMinimumGCAge"] = "1s"
    try:
        k.start()

        def victim_gone() -> bool:
            st = images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=victim)),
                                    timeout=10)
            return not st.HasField("image")
        wait_for(victim_gone, 120, "the kubelet removing the unused image", every=1,
                 on_fail=k.tail)
        # The image a running container uses stays.
        st = images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=node.busybox)),
                                timeout=10)
        assert st.HasField("image")
        assert k.wait_ready("gcuser", 10)
        # And its files are all there: the container still runs programs from its layers.
        res = kubelet_exec(k, "gcuser", "a", "/bin/busybox true && echo layers-ok")
        assert res.exit_code == 0 and res.stdout == b"layers-ok\n", res
    finally:
        k.remove_manifest("gcuser")
        k.stop()
        k.config.clear()
        k.config.update(saved)
        k.start()
