"""The daemon's object graph: configuration, the database and the managers.

Servicers get a `Daemon` and call its managers; nothing here speaks gRPC.
Start order matters: state is reconciled with reality before the socket serves.
"""

from __future__ import annotations

import asyncio
import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.registry import CDIRegistry
from crishim.config import Config
from crishim.container.manager import ContainerManager
from crishim.container.spec import HostInfo
from crishim.events import EventBus
from crishim.host import modes
from crishim.host.facts import HostFacts
from crishim.image.manager import ImageManager
from crishim.log import get_logger
from crishim.metrics import MetricsServer, register_state_source, state_counter
from crishim.network.manager import NetworkManager
from crishim.oci import apparmor
from crishim.oci.apparmor import AppArmorState
from crishim.oci.exits import ExitWatcher
from crishim.oci.resources import ResourceMapper
from crishim.oci.runc import RuntimeRegistry
from crishim.sandbox.manager import SandboxManager
from crishim.sandbox.registry import SandboxRegistry
from crishim.stats.cgroups import reader_for
from crishim.stats.collector import StatsCollector
from crishim.store.db import Database
from crishim.streaming.backend import ContainerBackend
from crishim.streaming.server import StreamingServer

log = get_logger(__name__)


class Daemon:
    def __init__(self, cfg: Config, host: HostFacts, apparmor_state: AppArmorState) -> None:
        self.cfg = cfg
        self.host = host
        self.apparmor = apparmor_state
        self.resources = ResourceMapper(host.cgroups, cfg.missing_cgroup_controller)
        self.db = Database(os.path.join(cfg.root, "crishim.db"))
        self.events = EventBus()
        # Pod CIDR handed to CNI as the ipRanges capability (UpdateRuntimeConfig).
        self.pod_cidr = ""
        # --- managers ---
        self.images = ImageManager(cfg, self.db)
        self.network = NetworkManager(cfg, lambda: self.pod_cidr)
        self.runtimes = RuntimeRegistry(cfg)
        self.exits = ExitWatcher(os.path.join(cfg.state, "exits"))
        # Both managers look pods up here; only the sandbox manager adds and drops them.
        self.pods = SandboxRegistry()
        self.containers = ContainerManager(cfg, self.db, self.events, self.pods, self.images,
                                           self.runtimes, self.exits,
                                           HostInfo(host, self.resources, apparmor_state),
                                           CDIRegistry(cfg.cdi_spec_dirs, cfg.enable_cdi))
        # StopPodSandbox/RemovePodSandbox stop and remove the pod's containers first.
        self.sandboxes = SandboxManager(cfg, self.db, self.events, self.runtimes, self.network,
                                        self.images, self.pods, self.containers)
        self.streaming = StreamingServer(cfg.streaming,
                                         ContainerBackend(self.containers, self.sandboxes))
        self.metrics_server = MetricsServer(cfg.metrics.address) if cfg.metrics.address else None
        self.stats = StatsCollector(reader_for(host.cgroups))

    async def start(self) -> None:
        """Open state and reconcile it with reality before the socket serves anything."""
        # An older install's files become as private as a new one's.
        await asyncio.to_thread(modes.tighten_install, self.cfg.root, self.cfg.state)
        await self.db.open()
        missing = self.host.cgroups.missing()
        if missing:
            # Once here rather than per container: the kubelet asks for these every time.
            log.warning("cgroup controllers missing on this host; resources for them are "
                        + ("refused" if self.cfg.missing_cgroup_controller == "fail"
                           else "dropped"),
                        controllers=",".join(missing), cgroup_version=self.host.cgroups.version)
        saved = await self.db.load_all("runtime")
        self.pod_cidr = saved.get("config", {}).get("pod_cidr", "")
        # --- manager start-up, in dependency order ---
        await self.images.start()
        await self.network.start()
        await self.exits.start()
        apparmor.log_state(self.apparmor)
        await self.sandboxes.start()
        await self.containers.start()
        await self.streaming.start()
        register_state_source("pods", state_counter(self.sandboxes.list,
                                                    pb.PodSandboxState.Name))
        register_state_source("containers", state_counter(self.containers.list_containers,
                                                          pb.ContainerState.Name))
        if self.metrics_server is not None:
            await self.metrics_server.start()

    async def stop(self) -> None:
        # --- manager shutdown, reverse order (containers keep running) ---
        await self.streaming.stop()
        await self.containers.stop()
        await self.sandboxes.stop_manager()
        await self.exits.stop()
        await self.network.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.images.stop()
        await self.db.close()

    async def set_pod_cidr(self, cidr: str) -> None:
        self.pod_cidr = cidr
        await self.db.put("runtime", "config", {"pod_cidr": cidr})
