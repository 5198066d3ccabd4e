"""A NetworkManager against the real CNI plugins on a private bridge, for the network
tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from crishim.config import CNIConfig, Config
from crishim.network.manager import NetworkManager
from crishim.network.netns import create_netns
from crishim.network.types import PodNetwork
from tests.e2e.cni import cni_conf_dir, remove_bridge

_counter = 0


@dataclass
class Net:
    """A NetworkManager on a private bridge and subnet, its files under `tmpdir`."""

    tmpdir: str
    bridge: str
    subnet: str
    conf_dir: str
    cfg: Config
    manager: NetworkManager

    def netns(self, pod_id: str) -> str:
        """Where the manager pins pod_id's netns."""
        return os.path.join(self.manager.netns_dir, pod_id)

    async def pod(self, pod_id: str, **kw: Any) -> tuple[str, list[str]]:
        """A pinned netns for pod_id, set up; its path and IPs."""
        path = self.netns(pod_id)
        await create_netns(path, roots=(self.cfg.state,))
        pod = PodNetwork(name=pod_id, namespace="e2e", uid=f"uid-{pod_id}", **kw)
        result = await self.manager.setup(pod_id, path, pod)
        return path, result.ips


async def make_net(portmap: bool = True) -> Net:
    """A started Net with a bridge name and subnet of its own."""
    global _counter
    _counter += 1
    # Unique per process and test, so parallel runs and the host's cni0 never collide.
    tag = (os.getpid() % 200) + 20
    bridge = f"crie2e{tag}x{_counter}"
    subnet = f"10.{tag}.{_counter}.0/24"
    tmpdir = tempfile.mkdtemp(prefix="crishim-net-")
    conf_dir = cni_conf_dir(tmpdir, "crishim-e2e", bridge, subnet, portmap=portmap)
    cfg = Config(root=os.path.join(tmpdir, "root"), state=os.path.join(tmpdir, "state"),
                 cni=CNIConfig(conf_dir=conf_dir, bin_dirs=["/opt/cni/bin", "/usr/lib/cni"]))
    manager = NetworkManager(cfg, lambda: "")
    await manager.start()
    return Net(tmpdir, bridge, subnet, conf_dir, cfg, manager)


async def cleanup(net: Net) -> None:
    """Stop the manager, DEL and unpin what is left, remove the bridge and the files."""
    await net.manager.stop()
    # Whatever a test left attached or pinned: DEL it (frees IPs, iptables) and unpin.
    await NetworkManager(net.cfg, lambda: "").reconcile(set())
    remove_bridge(net.bridge)
    await asyncio.to_thread(subprocess.run, ["rm", "-rf", net.tmpdir], check=False)
