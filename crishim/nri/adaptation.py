"""The runtime side of NRI: the pod/container events sent to every plugin in index
order (the plugin socket, the plugins crishim starts and their lifecycle: registry.py).

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
import functools
import time
from typing import Any

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition
from crishim.log import get_logger
from crishim.nri import apply, convert, merge, ttrpc, validate
from crishim.nri.plugin import Plugin, PluginError
from crishim.nri.registry import PluginRegistry
from crishim.observe import tracing
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

log = get_logger(__name__)


class NRI(PluginRegistry):
    """The NRI adaptation, one per daemon."""

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
