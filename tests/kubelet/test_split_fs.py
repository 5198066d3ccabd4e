"""Kubelet 1.36 on a node whose images are on a filesystem of their own (crishim's
`image_root` on a loop-mounted ext4), containers' writable layers on root's: its
/stats/summary shows the image disk as imageFs and each container's rootfs on root's
disk, each with its own capacity and usage.

Kubelet 1.36 itself goes no further for a runtime other than CRI-O: its CRI stats
provider reports node.runtime.containerFs as a copy of imageFs, and its eviction manager
cannot tell the split apart ("no imagefs label for configured runtime"), so it sees a
dedicated image filesystem (docs/storage.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cni import module_network
from tests.e2e.faults import networked_daemon
from tests.e2e.loopfs import loop_filesystem
from tests.e2e.registry import Registry
from tests.kubelet.node import wait_for
from tests.kubelet.nodeenv import Node, ctr, kubelet_node, pod, require_kubelet

VERSION = "1.36"
DISK_MIB = 256


@pytest.fixture(scope="module")
def node(registry: Registry, busybox_ref: str) -> Iterator[Node]:
    require_kubelet(VERSION, f"kubelet {VERSION}")
    with loop_filesystem(DISK_MIB) as disk, networked_daemon(
            "crishim-kls", *module_network("kubelet-split"),
            f'image_root = "{disk}/crishim-images"\n', busybox_ref) as nd, \
            kubelet_node(VERSION, nd, registry, busybox_ref, f"split-{VERSION}",
                         featureGates={"PodAndContainerStatsFromCRI": True}) as node_:
        yield node_


def test_summary_shows_image_and_container_filesystems_apart(node: Node) -> None:
    k = node.kubelet
    k.write_manifest("writer", pod("writer", [ctr(
        node, "w", "dd if=/dev/zero of=/big bs=1M count=16 2>/dev/null; exec sleep 3600")]))
    k.wait_ready("writer", 60)

    def runtime_fs() -> dict[str, Any] | None:
        summary: dict[str, Any] = json.loads(k.get("/stats/summary"))
        fs = summary.get("node", {}).get("runtime", {})
        pods = [p for p in summary.get("pods", []) if p["podRef"]["name"].startswith("writer")]
        rootfs = pods[0]["containers"][0].get("rootfs", {}) if pods else {}
        if "imageFs" in fs and rootfs.get("usedBytes", 0) >= 16 << 20:
            return summary
        return None
    summary = wait_for(runtime_fs, 90, "/stats/summary with the runtime's filesystems",
                       on_fail=k.tail)
    image = summary["node"]["runtime"]["imageFs"]
    rootfs = next(p for p in summary["pods"] if p["podRef"]["name"].startswith("writer")
                  )["containers"][0]["rootfs"]
    # The image disk: its own size, holding busybox and little else.
    assert image["capacityBytes"] <= DISK_MIB << 20, image
    assert 0 < image["usedBytes"] < 64 << 20, image
    assert image["availableBytes"] < DISK_MIB << 20, image
    # The container's writable layer: root's disk, holding the 16 MiB written.
    host = os.statvfs(node.crishim.root)
    assert rootfs["capacityBytes"] == host.f_blocks * host.f_frsize != image["capacityBytes"]
    assert rootfs["usedBytes"] >= 16 << 20, rootfs
    k.remove_manifest("writer")
