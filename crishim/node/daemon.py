"""The daemon's object graph: configuration, the database and the managers.

Servicers get a `Daemon` and call its managers; nothing here speaks gRPC.
Start order matters: state is reconciled with reality before the socket serves.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from crishim import __version__
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection
from crishim.cdi.registry import CDIRegistry
from crishim.config import Config
from crishim.container.manager import ContainerManager
from crishim.container.parts import ContainerHost, container_parts
from crishim.container.spec import SpecHost
from crishim.host import modes
from crishim.host import runtimes as host_runtimes
from crishim.host.facts import HostFacts
from crishim.host.runtimes import RuntimeFeatures
from crishim.host.tools import ToolVersions
from crishim.image.manager import ImageManager
from crishim.log import get_logger
from crishim.network.manager import NetworkManager
from crishim.nri.adaptation import NRI
from crishim.nri.hooks import NO_NRI, LiveNRI, NRIHooks
from crishim.observe import tracing
from crishim.observe.events import EventBus
from crishim.observe.metrics import MetricsServer, register_state_source, state_counter
from crishim.oci.apparmor import AppArmorState
from crishim.oci.resources import ResourceMapper
from crishim.runtime import apparmor
from crishim.runtime.criu import CriuProbe
from crishim.runtime.exitfiles import ExitFileWatcher
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.manager import SandboxManager
from crishim.sandbox.parts import PodHost, RuntimeSide, Stores, sandbox_parts
from crishim.sandbox.registry import SandboxRegistry
from crishim.stats.cgroups import reader_for
from crishim.stats.collector import StatsCollector
from crishim.store.container import Container
from crishim.store.db import Database
from crishim.store.sandbox import Sandbox
from crishim.streaming.backend import ContainerBackend
from crishim.streaming.server import StreamingServer
from crishim.validate.requests import RequestChecks

log = get_logger(__name__)


class Daemon:
    def __init__(self, cfg: Config, host: HostFacts, apparmor_state: AppArmorState,
                 tools: ToolVersions) -> None:
        self.cfg = cfg
        self.host = host
        self.apparmor = apparmor_state
        self.tools = tools
        self.resources = ResourceMapper(host.cgroups, cfg.missing_cgroup_controller,
                                        host.topology)
        # Every check of a request, called by the servicers before a manager sees it.
        self.checks = RequestChecks(self.resources, cfg.effective_cgroup_driver(), host.rro)
        self.db = Database(os.path.join(cfg.root, "crishim.db"))
        self.events = EventBus()
        # Pod CIDR handed to CNI as the ipRanges capability (UpdateRuntimeConfig).
        self.pod_cidr = ""
        # --- managers ---
        self.images = ImageManager(cfg, self.db)
        self.network = NetworkManager(cfg, lambda: self.pod_cidr)
        self.runtimes = RuntimeRegistry(cfg, host)
        # What each handler supports, judged at start (nothing before that).
        self.runtime_features: dict[str, RuntimeFeatures] = {}
        # Probed by the first checkpoint RPC, not at start.
        self.criu = CriuProbe()
        self.exit_files = ExitFileWatcher(os.path.join(cfg.state, "exits"))
        # Both managers look pods up here; only the sandbox manager adds and drops them.
        # The NRI host reads them too; servicers reach pods through the sandbox manager.
        pods = SandboxRegistry()
        # The CDI spec directories, for containers (and NRI plugins) that ask for devices.
        cdi = CDIRegistry(cfg.cdi_spec_dirs, cfg.enable_cdi)
        # NRI plugins, told of every pod and container step by both managers.
        self.nri = NRI(cfg.nri, "crishim", __version__, _NRIHost(self, pods, cdi))
        # The managers' collaborators in a few groups; each manager's helpers are built
        # from the same groups (`*_parts`) and handed in.
        stores = Stores(self.db, self.events, pods, self.images)
        runtime = RuntimeSide(self.runtimes, self.exit_files, _nri_hooks(cfg, self.nri))
        ctr_host = ContainerHost(SpecHost(host, self.resources, apparmor_state), cdi)
        self.containers = ContainerManager(cfg, stores, runtime, ctr_host,
                                           container_parts(cfg, stores, runtime, ctr_host))
        # StopPodSandbox/RemovePodSandbox stop and remove the pod's containers first.
        pod_host = PodHost(host, self.network)
        self.sandboxes = SandboxManager(
            cfg, stores, runtime, self.containers,
            sandbox_parts(cfg, stores, runtime, pod_host, self.containers))
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
        # Which handlers can run here, once: Status announces only those.
        await self.runtimes.probe()
        saved = await self.db.load_all("runtime")
        self.pod_cidr = saved.get("config", {}).get("pod_cidr", "")
        # --- manager start-up, in dependency order ---
        with tracing.span("recover images"):
            await self.images.start()
        # Once the image store exists: the idmap probe looks at its filesystem.
        self.runtime_features = await host_runtimes.probe(
            {r.name: self.runtimes.readiness(r.name).features or b""
             for r in self.runtimes.all()}, self.host.rro, self.images.paths.layers)
        await self.network.start()
        await self.exit_files.start()
        apparmor.log_state(self.apparmor)
        # Crash recovery: what the database says against what runs.
        with tracing.span("recover sandboxes"):
            await self.sandboxes.start()
        with tracing.span("recover containers"):
            await self.containers.start()
        # After reconciliation: plugins are synchronized with what really exists.
        await self.nri.start()
        await self.streaming.start()
        register_state_source("pods", state_counter(self.sandboxes.list_sandboxes,
                                                    pb.PodSandboxState.Name))
        register_state_source("containers", state_counter(self.containers.list_containers,
                                                          pb.ContainerState.Name))
        if self.metrics_server is not None:
            await self.metrics_server.start()

    async def stop(self) -> None:
        # --- manager shutdown, reverse order (containers keep running) ---
        await self.streaming.stop()
        await self.nri.stop()
        await self.containers.stop()
        await self.sandboxes.stop()
        await self.exit_files.stop()
        await self.network.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.images.stop()
        await self.db.close()

    async def set_pod_cidr(self, cidr: str) -> None:
        self.pod_cidr = cidr
        await self.db.put("runtime", "config", {"pod_cidr": cidr})


class _NRIHost:
    """The daemon as NRI sees it: what exists, and how a plugin's update (the path of
    UpdateContainerResources) or eviction (StopContainer) is carried out."""

    def __init__(self, daemon: Daemon, pods: SandboxRegistry, cdi: CDIRegistry) -> None:
        self._d = daemon
        self._pods = pods
        self._cdi = cdi

    def pods(self) -> list[Sandbox]:
        return self._pods.all()

    def containers(self) -> list[Container]:
        return self._d.containers.list_containers()

    def pod_of(self, ctr: Container) -> Sandbox | None:
        return self._pods.exact(ctr.pod_id)

    @property
    def resource_mapper(self) -> ResourceMapper:
        return self._d.resources

    async def resolve_cdi(self, names: Sequence[str]) -> list[Injection]:
        return await self._cdi.resolve(names)

    async def update_container(self, cid: str, resources: pb.LinuxContainerResources) -> None:
        mgr = self._d.containers
        await mgr.update_resources(mgr.get(cid), resources, nri_events=False)

    async def runtime_features(self, ctr: Container) -> bytes:
        found = self._d.runtime_features.get(self._d.containers.runtime_for(ctr).name)
        return found.raw if found is not None else b""

    async def evict_container(self, cid: str, reason: str) -> None:
        log.info("container evicted by an NRI plugin", id=cid, reason=reason)
        await self._d.containers.stop_container(cid, 0)


def _nri_hooks(cfg: Config, nri: NRI) -> NRIHooks:
    """What the managers tell NRI through: the null object when nothing can make NRI
    active (disabled, so no plugin connects, and no default validator)."""
    if cfg.nri.enable or cfg.nri.default_validator.enable:
        return LiveNRI(nri)
    return NO_NRI
