"""The NRI plugins crishim holds: the plugin socket, the pre-installed plugins it starts,
each plugin's registration and synchronization, the updates and evictions plugins ask
for, and a plugin dropped when it closes (adaptation.py sends them the events)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from typing import Any, Protocol

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection
from crishim.config import NRIConfig
from crishim.log import get_logger
from crishim.nri import apply, convert, discovery, merge, ttrpc
from crishim.nri.gate import SyncGate
from crishim.nri.plugin import Plugin, PluginError
from crishim.oci.resources import ResourceMapper
from crishim.proc.spawn import Child
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

log = get_logger(__name__)


# The NRI release whose API and behaviour this speaks (reported in Configure).
NRI_VERSION = "v0.12.0"

# Objects per Synchronize message when a whole snapshot is too big for one: the
# reference halves down to this floor before it gives up.
_MIN_OBJS_PER_SYNC = 8


class NRIHost(Protocol):
    """What the adaptation needs from the daemon: the pods and containers that exist, and
    the way a plugin's container update or eviction is carried out."""

    def pods(self) -> list[Sandbox]: ...
    def containers(self) -> list[Container]: ...
    def pod_of(self, ctr: Container) -> Sandbox | None: ...
    @property
    def resource_mapper(self) -> ResourceMapper: ...
    async def resolve_cdi(self, names: Sequence[str]) -> list[Injection]: ...
    async def runtime_features(self, ctr: Container) -> bytes:
        """`<runtime> features` of the container's handler, as probed once (b"" for a
        runtime without the command)."""
        ...

    async def update_container(self, cid: str,
                               resources: pb.LinuxContainerResources) -> None: ...
    async def evict_container(self, cid: str, reason: str) -> None: ...


class PluginRegistry:
    """The connected plugins in index order, and their lifecycle."""

    def __init__(self, cfg: NRIConfig, runtime_name: str, runtime_version: str,
                 host: NRIHost) -> None:
        self.cfg = cfg
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self._host = host
        self._plugins: list[Plugin] = []
        self._children: dict[Plugin, Child] = {}
        self._server: asyncio.Server | None = None
        self._gate = SyncGate()
        # Containers' specs as created (after the plugins' adjustments), for the events
        # that follow without reading config.json back; filled again from the bundle
        # after a restart. Dropped at RemoveContainer.
        self._specs: dict[str, dict[str, Any] | None] = {}
        # Each container's NRI view as its spec and config give it, converted once per
        # spec (the status is refreshed per event): a pod start sends it four times.
        self._views: dict[str, tuple[dict[str, Any] | None, nri.Container]] = {}
        # Containers the plugins were told stopped (StopContainer goes once).
        self._stopped: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # What each handler's OCI runtime applies, parsed once per handler.
        self._support: dict[str, apply.RuntimeSupport] = {}

    # -- state ------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether any plugin is connected (or the default validator is on, which also
        checks the plugins a pod requires): the managers skip every call when not."""
        return (self.cfg.default_validator.enable
                or any(not p.closed for p in self._plugins))

    def plugins(self) -> list[Plugin]:
        """Connected plugins in invocation (index) order; closed ones are dropped here."""
        if any(p.closed for p in self._plugins):
            self._drop_closed()
        return list(self._plugins)

    @property
    def listening_on(self) -> str:
        """The socket external plugins connect to, "" when there is none."""
        return self.cfg.socket_path if self._server is not None else ""

    def describe(self) -> list[dict[str, Any]]:
        """For Status(verbose)."""
        return [{"name": p.name, "index": p.idx, "kind": p.kind, "pid": p.pid,
                 "events": _event_names(p.events)} for p in self.plugins()]

    def _drop_closed(self) -> None:
        closed = [p for p in self._plugins if p.closed]
        self._plugins = [p for p in self._plugins if not p.closed]
        if not self._plugins:
            self._specs.clear()  # no events follow to keep them for
            self._views.clear()
            self._stopped.clear()
        for p in closed:
            log.warning("NRI plugin dropped", plugin=p.name, reason=p.close_reason)
            child = self._children.pop(p, None)
            if child is not None:
                self._spawn(discovery.reap(child))

    def _add(self, plugin: Plugin) -> None:
        self._plugins.append(plugin)
        # Stable: plugins with the same index keep their connection order.
        self._plugins.sort(key=lambda p: p.idx)
        self._watch(plugin)
        log.info("NRI plugin connected and synchronized", plugin=plugin.name,
                 kind=plugin.kind, order=",".join(p.name for p in self._plugins))

    def _watch(self, plugin: Plugin) -> None:
        async def dropped() -> None:
            await plugin.wait_closed()
            self._drop_closed()
        self._spawn(dropped())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- start / stop -----------------------------------------------------------------------
    async def start(self) -> None:
        if not self.cfg.enable:
            log.info("NRI disabled")
            return
        launched = await self._launch_preinstalled()
        updates: list[tuple[str, list[nri.ContainerUpdate]]] = []
        if launched:
            async with self._gate.sync():
                for p in launched:
                    try:
                        updates.append((p.name, await self._synchronize(p)))
                    except Exception as exc:
                        log.warning("NRI pre-installed plugin failed to synchronize",
                                    plugin=p.name, error=str(exc))
                        p.close(f"synchronize failed: {exc}")
                        continue
                    self._add(p)
        # Outside the gate: an update is an event the other plugins see.
        for name, ups in updates:
            await self._apply_updates(name, ups)
        if self.cfg.disable_connections:
            log.info("NRI connections from external plugins disabled")
            return
        await self._listen()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(OSError):
                os.unlink(self.cfg.socket_path)
        plugins, self._plugins = self._plugins, []
        for p in plugins:
            await p.shutdown()
        children, self._children = self._children, {}
        for child in children.values():
            await discovery.reap(child)
        for t in list(self._tasks):
            t.cancel()

    async def _listen(self) -> None:
        path = self.cfg.socket_path
        d = os.path.dirname(path)
        await asyncio.to_thread(os.makedirs, d, 0o700, True)
        if await asyncio.to_thread(discovery.answers, path):
            # Another runtime serves plugins here: taking its socket would cut them off.
            log.error("NRI socket is served by another process; external plugins cannot "
                      "connect to this crishim (set [nri] socket_path)", socket=path)
            return
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(os.unlink, path)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._accept, path=path)
        finally:
            os.umask(old)
        await asyncio.to_thread(os.chmod, path, 0o600)
        log.info("NRI listening", socket=path)

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid = discovery.peer_pid(sock) if sock is not None else 0
        plugin = Plugin(reader, writer, updates=self._plugin_updates, pid=pid)
        try:
            await plugin.start(self.runtime_name, self.runtime_version, NRI_VERSION,
                               self._config_for, self.cfg.plugin_registration_timeout,
                               self.cfg.plugin_request_timeout)
        except Exception as exc:
            log.error("NRI external plugin failed to start", plugin=plugin.name, pid=pid,
                      error=str(exc))
            return
        async with self._gate.sync():
            try:
                updates = await self._synchronize(plugin)
            except Exception as exc:
                log.error("NRI plugin failed to synchronize", plugin=plugin.name,
                          error=str(exc))
                plugin.close(f"synchronize failed: {exc}")
                return
            self._add(plugin)
        await self._apply_updates(plugin.name, updates)

    async def _config_for(self, idx: str, base: str) -> str:
        return await asyncio.to_thread(discovery.read_config, self.cfg.plugin_config_path,
                                       idx, base)

    async def _launch_preinstalled(self) -> list[Plugin]:
        try:
            found = await asyncio.to_thread(discovery.discover, self.cfg.plugin_path)
        except ValueError as exc:
            log.error("NRI pre-installed plugins not started", error=str(exc))
            return []
        started: list[Plugin] = []
        for idx, base in found:
            name = f"{idx}-{base}"
            try:
                plugin = await self._launch(idx, base)
                await plugin.start(self.runtime_name, self.runtime_version, NRI_VERSION,
                                   self._config_for, self.cfg.plugin_registration_timeout,
                                   self.cfg.plugin_request_timeout)
            except Exception as exc:
                log.warning("NRI pre-installed plugin failed to start", plugin=name,
                            error=str(exc))
                continue
            started.append(plugin)
        return started

    async def _launch(self, idx: str, base: str) -> Plugin:
        config = await self._config_for(idx, base)
        reader, writer, child = await discovery.launch(self.cfg.plugin_path, idx, base)
        plugin = Plugin(reader, writer, updates=self._plugin_updates, idx=idx, base=base,
                        config=config, pid=child.pid, launched=True)
        self._children[plugin] = child
        log.info("NRI pre-installed plugin started", plugin=plugin.name, pid=child.pid)
        return plugin

    # -- synchronization --------------------------------------------------------------------
    async def _synchronize(self, plugin: Plugin) -> list[nri.ContainerUpdate]:
        """Send every pod and container; the updates the plugin asked for."""
        pods = [convert.pod_to_nri(sb) for sb in self._host.pods()]
        ctrs = [convert.container_to_nri(c, await self._spec(c))
                for c in self._host.containers()]
        per_pods, per_ctrs = total = len(pods), len(ctrs)
        updates: list[nri.ContainerUpdate] = []
        while True:
            req = nri.SynchronizeRequest(pods=pods[:per_pods], containers=ctrs[:per_ctrs],
                                         more=len(pods) > per_pods or len(ctrs) > per_ctrs)
            try:
                rpl = await plugin.call("Synchronize", req, nri.SynchronizeResponse,
                                        self.cfg.plugin_request_timeout)
            except PluginError as exc:
                if exc.code != ttrpc.RESOURCE_EXHAUSTED or per_pods + per_ctrs <= \
                        _MIN_OBJS_PER_SYNC:
                    raise
                per_pods = max(per_pods * 9 // 10 // 2, 1)
                per_ctrs = max(per_ctrs * 9 // 10 // 2, 1)
                continue
            if not req.more:
                updates.extend(rpl.update)
                break
            if rpl.update or rpl.more != req.more:
                raise ttrpc.TTRPCError(ttrpc.FAILED_PRECONDITION,
                                       "plugin does not handle split sync requests")
            pods, ctrs = pods[per_pods:], ctrs[per_ctrs:]
            per_pods, per_ctrs = min(per_pods, len(pods)), min(per_ctrs, len(ctrs))
        log.info("NRI plugin synchronized", plugin=plugin.name, pods=total[0],
                 containers=total[1])
        return updates

    # -- updates from plugins ---------------------------------------------------------------
    async def _plugin_updates(self, plugin: Plugin, req: nri.UpdateContainersRequest
                              ) -> list[nri.ContainerUpdate]:
        failed = await self._apply_updates(plugin.name, list(req.update))
        await self._evict(plugin.name, list(req.evict))
        return failed

    async def _apply_updates(self, plugin: str, updates: Sequence[nri.ContainerUpdate]
                             ) -> list[nri.ContainerUpdate]:
        """Through UpdateContainerResources' path; returns the updates that failed (an
        update marked ignore_failure is not returned)."""
        failed: list[nri.ContainerUpdate] = []
        for upd in updates:
            try:
                # Not told to the plugins as an UpdateContainer: they asked for it (and
                # a plugin answering its own update with another would never end).
                await self._host.update_container(upd.container_id,
                                                  merge.update_to_resources(upd))
            except Exception as exc:
                log.warning("NRI container update failed", plugin=plugin,
                            container=upd.container_id, error=str(exc))
                if not upd.ignore_failure:
                    failed.append(upd)
        return failed

    async def _evict(self, plugin: str, evictions: Sequence[nri.ContainerEviction]) -> None:
        for ev in evictions:
            log.info("NRI plugin evicts container", plugin=plugin, container=ev.container_id,
                     reason=ev.reason)
            try:
                await self._host.evict_container(ev.container_id, ev.reason)
            except Exception as exc:
                log.warning("NRI eviction failed", plugin=plugin,
                            container=ev.container_id, error=str(exc))


    async def _spec(self, ctr: Container) -> dict[str, Any] | None:
        if ctr.id not in self._specs:
            self._specs[ctr.id] = await asyncio.to_thread(_spec_of, ctr)
        return self._specs[ctr.id]


def _event_names(mask: int) -> list[str]:
    names = []
    for value in range(1, nri.LAST):
        if mask & (1 << (value - 1)):
            names.append(nri.Event.Name(value))
    return names





def _spec_of(ctr: Container) -> dict[str, Any] | None:
    """The container's OCI spec from its bundle, if it is still there."""
    try:
        with open(os.path.join(ctr.bundle, "config.json"), "rb") as fh:
            spec = json.load(fh)
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None
