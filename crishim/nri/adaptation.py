"""The runtime side of NRI: the plugin socket, the plugins crishim starts, and the
pod/container events sent to every plugin in index order.

Behaviour follows containerd/nri's `pkg/adaptation` (v0.12), which containerd 2.x uses:
- plugins register (RegisterPlugin), are configured (Configure, with the drop-in config
  of `plugin_config_path`: `NN-name.conf`, else `name.conf`) and synchronized (every pod
  and container) before they see any event; a plugin that fails any of these is dropped;
- pre-installed plugins (`plugin_path/NN-name`, executable) are started once at start-up
  with one end of a socketpair (NRI_PLUGIN_SOCKET names its fd) and not restarted: a
  plugin that dies is gone until crishim starts again, as in containerd;
- a plugin that closes, hangs past `plugin_request_timeout` or breaks the protocol is
  closed and dropped; an error reply fails RunPodSandbox and CreateContainer (naming the
  plugin) and is logged for the other events, as containerd's CRI plugin does;
- events are not serialized against each other (containerd holds one lock for all),
  but a synchronization waits for the events in flight and holds new ones back, so a new
  plugin misses nothing between its snapshot and its first event.

With no plugin connected nothing is called: hooks.py's LiveNRI checks `active` first.
Where plugins come from (the executables, their config files, the socket) is
discovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cdi.edits import Injection
from crishim.config import NRIConfig
from crishim.errors import FailedPrecondition
from crishim.log import get_logger
from crishim.nri import apply, convert, discovery, merge, ttrpc, validate
from crishim.nri.gate import SyncGate
from crishim.nri.plugin import Plugin, PluginError
from crishim.observe import tracing
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


class NRI:
    """The NRI adaptation, one per daemon."""

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

    # -- events -----------------------------------------------------------------------------
    async def _notify(self, event: int, method: str, req: Any, reply: type[Any],
                      fail: bool) -> list[tuple[Plugin, Any]]:
        """Send one event to every subscribed plugin in order; the replies. A plugin's
        error reply fails the call when `fail` (FailedPrecondition naming the plugin)
        and is logged otherwise; a plugin that is gone is skipped."""
        out: list[tuple[Plugin, Any]] = []
        t0 = time.perf_counter()
        async with self._gate.event():
            for p in self.plugins():
                if not p.subscribed(event):
                    continue
                try:
                    out.append((p, await p.call(method, req, reply,
                                                 self.cfg.plugin_request_timeout)))
                except ttrpc.ConnectionClosed:
                    continue
                except PluginError as exc:
                    if fail:
                        raise FailedPrecondition(str(exc)) from None
                    log.warning("NRI plugin failed an event", plugin=p.name, event=method,
                                error=str(exc))
        log.debug("NRI event", event=method, plugins=len(out),
                  ms=round((time.perf_counter() - t0) * 1000, 3))
        return out

    def _notify_later(self, event: int, method: str, req: Any, reply: type[Any]) -> None:
        """A Post* event: each subscribed plugin's turn is taken now (so it comes after
        every event before it and before every one after it), but the CRI call that
        caused it does not wait for the plugins; errors are logged."""
        turns = [(p, p.turn()) for p in self.plugins() if p.subscribed(event)]
        if not turns:
            return

        async def send() -> None:
            for p, turn in turns:
                try:
                    await p.call(method, req, reply, self.cfg.plugin_request_timeout, turn)
                except ttrpc.ConnectionClosed:
                    continue
                except PluginError as exc:
                    log.warning("NRI plugin failed an event", plugin=p.name, event=method,
                                error=str(exc))
        self._spawn(send())

    def _subscribed(self, event: int) -> bool:
        return any(p.subscribed(event) for p in self.plugins())

    async def run_pod_sandbox(self, sb: Sandbox) -> None:
        await self._notify(nri.RUN_POD_SANDBOX, "RunPodSandbox",
                           nri.RunPodSandboxRequest(pod=convert.pod_to_nri(sb)),
                           nri.RunPodSandboxResponse, fail=True)

    async def update_pod_sandbox(self, sb: Sandbox, resources: pb.LinuxContainerResources,
                                 overhead: pb.LinuxContainerResources) -> None:
        req = nri.UpdatePodSandboxRequest(
            pod=convert.pod_to_nri(sb),
            linux_resources=convert.resources_from_cri(resources),
            overhead_linux_resources=convert.resources_from_cri(overhead))
        await self._notify(nri.UPDATE_POD_SANDBOX, "UpdatePodSandbox", req,
                           nri.UpdatePodSandboxResponse, fail=False)

    async def post_update_pod_sandbox(self, sb: Sandbox) -> None:
        self._notify_later(nri.POST_UPDATE_POD_SANDBOX, "PostUpdatePodSandbox",
                           nri.PostUpdatePodSandboxRequest(pod=convert.pod_to_nri(sb)),
                           nri.PostUpdatePodSandboxResponse)

    async def stop_pod_sandbox(self, sb: Sandbox) -> None:
        await self._notify(nri.STOP_POD_SANDBOX, "StopPodSandbox",
                           nri.StopPodSandboxRequest(pod=convert.pod_to_nri(sb)),
                           nri.StopPodSandboxResponse, fail=False)

    async def remove_pod_sandbox(self, sb: Sandbox) -> None:
        await self._notify(nri.REMOVE_POD_SANDBOX, "RemovePodSandbox",
                           nri.RemovePodSandboxRequest(pod=convert.pod_to_nri(sb)),
                           nri.RemovePodSandboxResponse, fail=False)

    async def create_container(self, sb: Sandbox, ctr: Container,
                               spec: dict[str, Any]) -> None:
        """Collect the plugins' adjustments (in index order, conflicts refused), let the
        validators see them, and apply them to `spec` before it is written; then the
        updates to other containers and the evictions the plugins asked for."""
        t0 = time.perf_counter()
        pod = convert.pod_to_nri(sb)
        nctr = convert.container_to_nri(ctr, spec)
        result = merge.Result(pod, nctr)
        evictions: list[tuple[str, nri.ContainerEviction]] = []
        async with self._gate.event():
            for p in self.plugins():
                if not p.subscribed(nri.CREATE_CONTAINER):
                    continue
                # Each plugin sees the container as the plugins before it left it.
                req = nri.CreateContainerRequest(pod=pod, container=result.container)
                try:
                    rpl = await p.call("CreateContainer", req, nri.CreateContainerResponse,
                                       self.cfg.plugin_request_timeout)
                except ttrpc.ConnectionClosed:
                    continue
                except PluginError as exc:
                    raise FailedPrecondition(str(exc)) from None
                if rpl.HasField("adjust"):
                    result.apply_adjustment(p.name, rpl.adjust)
                if rpl.update:
                    result.apply_updates(p.name, list(rpl.update))
                evictions.extend((p.name, ev) for ev in rpl.evict)
        t1 = time.perf_counter()
        await self._validate(nctr, result)
        # Most creates come back unadjusted: nothing to resolve, check or apply.
        if result.adjustment.ByteSize():
            cdi = await self._host.resolve_cdi(apply.cdi_device_names(result.adjustment))
            support = await self._runtime_support(ctr)
            # In a thread: it may read the host's mount table (bind propagation).
            await asyncio.to_thread(functools.partial(
                apply.apply_to_spec, spec, result.adjustment, cdi=cdi,
                mapper=self._host.resource_mapper, support=support))
            lx = result.adjustment.linux
            if lx.HasField("resources") or lx.HasField("oom_score_adj"):
                # The record's resources are what ContainerStatus reports and what an
                # update merges with: the applied values, not the requested ones.
                res = ctr.config.linux.resources
                res.CopyFrom(merge.applied_resources(res, result.adjustment))
        self._specs[ctr.id] = spec
        log.debug("NRI event", event="CreateContainer",
                  plugins_ms=round((t1 - t0) * 1000, 3),
                  apply_ms=round((time.perf_counter() - t1) * 1000, 3))
        if result.updates:
            await self._apply_updates("CreateContainer", result.updates)
        for name, ev in evictions:
            await self._evict(name, [ev])

    async def _runtime_support(self, ctr: Container) -> apply.RuntimeSupport:
        """So that an adjustment the handler's runtime would ignore (runc 1.1: ioPriority,
        scheduler, netDevices, memoryPolicy) is refused instead."""
        support = self._support.get(ctr.runtime_handler)
        if support is None:
            raw = await self._host.runtime_features(ctr)
            support = self._support[ctr.runtime_handler] = \
                apply.RuntimeSupport.from_features(raw)
        return support

    async def _validate(self, ctr: nri.Container, result: merge.Result) -> None:
        """The default validator (as containerd's builtin at index 00), then every plugin
        subscribed to ValidateContainerAdjustment; any refusal fails the create."""
        validators = [p for p in self.plugins()
                      if p.subscribed(nri.VALIDATE_CONTAINER_ADJUSTMENT)]
        if not validators and not self.cfg.default_validator.enable:
            return
        req = result.validation_request(ctr, [(p.base, p.idx) for p in self.plugins()])
        validate.validate_adjustment(self.cfg.default_validator, req)
        # All at once, as containerd asks them; the first refusal in index order wins.
        replies = await asyncio.gather(*(
            p.call("ValidateContainerAdjustment", req, nri.ValidateContainerAdjustmentResponse,
                   self.cfg.plugin_request_timeout) for p in validators),
            return_exceptions=True)
        for p, rpl in zip(validators, replies, strict=True):
            if isinstance(rpl, ttrpc.ConnectionClosed):
                raise FailedPrecondition(f"NRI validator plugin {p.name} failed: {rpl}")
            if isinstance(rpl, PluginError):
                raise FailedPrecondition(str(rpl))
            if isinstance(rpl, BaseException):
                raise rpl
            if rpl.reject:
                raise FailedPrecondition(f"NRI validator plugin {p.name} rejected the "
                                         f"container adjustment: {rpl.reason}")

    async def post_create_container(self, sb: Sandbox, ctr: Container) -> None:
        await self._container_event(nri.POST_CREATE_CONTAINER, "PostCreateContainer",
                                    nri.PostCreateContainerRequest,
                                    nri.PostCreateContainerResponse, sb, ctr, later=True)

    async def start_container(self, sb: Sandbox, ctr: Container) -> None:
        """A plugin's error reply fails the start (FailedPrecondition), as in containerd."""
        if not self._subscribed(nri.START_CONTAINER):
            return
        req = nri.StartContainerRequest(pod=convert.pod_to_nri(sb),
                                        container=await self._container(ctr))
        await self._notify(nri.START_CONTAINER, "StartContainer", req,
                           nri.StartContainerResponse, fail=True)

    async def post_start_container(self, sb: Sandbox, ctr: Container) -> None:
        await self._container_event(nri.POST_START_CONTAINER, "PostStartContainer",
                                    nri.PostStartContainerRequest,
                                    nri.PostStartContainerResponse, sb, ctr, later=True)

    async def update_container(self, sb: Sandbox, ctr: Container,
                               requested: pb.LinuxContainerResources,
                               resources: dict[str, Any]
                               ) -> tuple[pb.LinuxContainerResources, dict[str, Any]]:
        """`requested`: the CRI resources the container is being updated to, `resources`
        their OCI form. Returns both with the plugins' changes to this container (as
        containerd applies them), the OCI form mapped to the host as the CRI's is: what to
        apply, and what ContainerStatus reports from then on."""
        if not self._subscribed(nri.UPDATE_CONTAINER):
            return requested, resources
        asked = convert.resources_from_oci(resources)
        req = nri.UpdateContainerRequest(
            pod=convert.pod_to_nri(sb), container=await self._container(ctr),
            linux_resources=asked)
        replies = await self._notify(nri.UPDATE_CONTAINER, "UpdateContainer", req,
                                     nri.UpdateContainerResponse, fail=False)
        # Merged as containerd merges them (conflicts refused): the changes to this
        # container go into its request, the others are updates of their own.
        merged = merge.UpdateResult(ctr.id, asked)
        changes = merge.UpdateResult()  # only what the plugins set for this container
        for p, rpl in replies:
            merged.apply_updates(p.name, list(rpl.update))
            changes.apply_updates(p.name, [u for u in rpl.update if u.container_id == ctr.id])
        if changes.updates:
            own = changes.updates[0].linux.resources
            resources = apply.update_oci_resources(resources, own,
                                                    self._host.resource_mapper)
            requested = merge.with_nri_resources(requested, own)
        if merged.updates:
            await self._apply_updates("UpdateContainer", merged.updates)
        for p, rpl in replies:
            await self._evict(p.name, list(rpl.evict))
        return requested, resources

    async def post_update_container(self, sb: Sandbox, ctr: Container) -> None:
        await self._container_event(nri.POST_UPDATE_CONTAINER, "PostUpdateContainer",
                                    nri.PostUpdateContainerRequest,
                                    nri.PostUpdateContainerResponse, sb, ctr, later=True)

    async def stop_container(self, sb: Sandbox, ctr: Container) -> None:
        """Once per container, as containerd: whichever comes first of StopContainer,
        its own exit (watch_exit) and RemoveContainer."""
        if ctr.id in self._stopped:
            return
        self._stopped.add(ctr.id)
        replies = await self._container_event(nri.STOP_CONTAINER, "StopContainer",
                                              nri.StopContainerRequest,
                                              nri.StopContainerResponse, sb, ctr)
        merged = merge.UpdateResult(ctr.id)
        for p, rpl in replies:
            merged.apply_updates(p.name, list(rpl.update))
        if merged.updates:
            await self._apply_updates("StopContainer", merged.updates)

    async def _spec(self, ctr: Container) -> dict[str, Any] | None:
        if ctr.id not in self._specs:
            self._specs[ctr.id] = await asyncio.to_thread(_spec_of, ctr)
        return self._specs[ctr.id]

    async def _container(self, ctr: Container) -> nri.Container:
        """The container as the plugins see it now."""
        spec = await self._spec(ctr)
        view = self._views.get(ctr.id)
        if view is None or view[0] is not spec:
            view = self._views[ctr.id] = (spec, convert.container_to_nri(ctr, spec))
        out = nri.Container()
        out.CopyFrom(view[1])
        convert.set_status(ctr, out)
        return out

    def watch_exit(self, sb: Sandbox, ctr: Container, exited: asyncio.Event) -> None:
        """StopContainer for a started container that exits by itself (in the
        background, as containerd sends it when its task exits)."""
        async def wait() -> None:
            await exited.wait()
            if self.active:
                await self.stop_container(sb, ctr)
        # The exit is no part of the call that started the container.
        tracing.untraced(self._spawn, wait())

    async def remove_container(self, sb: Sandbox, ctr: Container) -> None:
        await self.stop_container(sb, ctr)
        await self._container_event(nri.REMOVE_CONTAINER, "RemoveContainer",
                                    nri.RemoveContainerRequest, nri.RemoveContainerResponse,
                                    sb, ctr)
        self._specs.pop(ctr.id, None)
        self._views.pop(ctr.id, None)
        self._stopped.discard(ctr.id)

    async def _container_event(self, event: int, method: str, req_type: type[Any],
                               reply: type[Any], sb: Sandbox, ctr: Container,
                               later: bool = False) -> list[tuple[Plugin, Any]]:
        if not self._subscribed(event):
            return []
        req = req_type(pod=convert.pod_to_nri(sb), container=await self._container(ctr))
        if later:
            self._notify_later(event, method, req, reply)
            return []
        return await self._notify(event, method, req, reply, fail=False)


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
